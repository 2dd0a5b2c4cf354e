"""Rules ``resources.device-env`` and ``resources.device-claim``: devices only through
resource requests and the run's own claims.

With the NVIDIA container runtime, ``NVIDIA_VISIBLE_DEVICES=all`` in a container exposes
every GPU of the node, whatever the pod requested. The variables of
``resources.deviceEnv`` are removed where users set them (with ``security.onRoot:
Strip``) or denied; a profile's value for the main container stays, since the admin
wrote it. So is an ``envFrom`` whose ``prefix`` begins such a name (``NVIDIA_VISIBLE_``
with a key ``DEVICES``). Out of reach: a value coming from ``envFrom`` a configMap
without a prefix, whose keys the admission request does not show (the device plugin's
own allocation still applies).

With dynamic resource allocation a Pod gets devices through ``resourceClaims``: from a
template (``resourceClaimTemplateName``), which makes a new claim owned by the Pod, the
run's own; or by naming an existing ResourceClaim (``resourceClaimName``), whose devices
it then shares with every Pod that names it, another run's GPU included. A run names an
existing claim only when the platform created the run and the claim has one of the
platform's names (``resources.platformDeviceClaims``), as for claims of storage
(``volumes.platformClaims``); any other is a pre-existing reference, removed with the
containers' ``resources.claims`` of it, or denied, as ``volumes.onPreExisting`` says.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.engine.doors import Reference, item_text, located
from webhook.engine.pod import (
    ALL_CONTAINER_LISTS,
    Pod,
    kept_change,
    main_container,
    remove_items,
    set_list,
    warning,
)
from webhook.engine.rule import Declarations
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import matches_any

RULES = Declarations(__name__)
RESOURCES_DEVICE_ENV = RULES.rule(
    "resources.device-env",
    mutation=(
        "a device-selecting variable (`resources.deviceEnv`) removed from user env (a value "
        "that selects no device, empty, `void` or `none`, is kept), and an `envFrom` whose "
        "`prefix` begins one (`NVIDIA_VISIBLE_`)"
    ),
    violation="the same, with `security.onRoot: Deny`",
)
RESOURCES_DEVICE_CLAIM = RULES.rule(
    "resources.device-claim",
    mutation=(
        "a `resourceClaims` entry naming an existing ResourceClaim "
        "(`resourceClaimName`) removed, with the containers' `resources.claims` of it "
        "(`volumes.onPreExisting: Strip`)"
    ),
    violation=(
        "an existing ResourceClaim named by a run: only a claim of "
        "`resources.platformDeviceClaims` in a run the platform created (a run's own "
        "claims come from `resourceClaimTemplateName`)"
    ),
)


def _profile_env(pod: Pod) -> tuple[JSON | None, list[JSON]]:
    """The main container and the env entries the run's profile sets in it (looked up
    once per step: per entry would make the step quadratic)."""
    profile = pod.profile
    if profile is None or not profile.env:
        return None, []
    return main_container(pod), list(profile.env)


def _from_profile(
    container: JSON, env: JSON, main: JSON | None, set_by_profile: list[JSON]
) -> bool:
    """The entry is exactly what the run's profile sets in its main container."""
    return container is main and env in set_by_profile


# Values that select no device: they only take devices away (the NVIDIA container
# runtime's "void" and "none", and empty), e.g. MLRun's launcher sets "" on MPI jobs.
NO_DEVICE = frozenset({"", "void", "none"})


def _selects(env: JSON, names: tuple[str, ...]) -> bool:
    """A user's entry that may select devices: a device variable with a value that is not
    one of NO_DEVICE (or from a source the request does not show)."""
    return env["name"] in names and ("valueFrom" in env or env.get("value", "") not in NO_DEVICE)


def _prefix_selects(env_from: JSON, names: tuple[str, ...]) -> bool:
    """An ``envFrom`` whose prefix starts a device variable's name (``NVIDIA_VISIBLE_``
    and a key ``DEVICES``): it can set the variable from keys the request does not show.
    Without a prefix the keys are whatever the source holds (out of reach, module doc)."""
    prefix = env_from.get("prefix")
    return isinstance(prefix, str) and bool(prefix) and any(n.startswith(prefix) for n in names)


def drop_device_env(pod: Pod) -> Change | None:
    names = pod.policy.resources.device_env
    if not names or pod.policy.security.on_root != "Strip":
        return None
    profile_env: tuple[JSON | None, list[JSON]] | None = None  # looked up at the first hit
    removed: list[str] = []
    spec = pod.spec
    for list_name in ALL_CONTAINER_LISTS:
        for container in spec.get(list_name) or ():
            env_from = container.get("envFrom")
            if env_from and any(_prefix_selects(e, names) for e in env_from):
                for e in env_from:
                    if _prefix_selects(e, names):
                        removed.append(f"{container['name']} envFrom prefix {e['prefix']}")
                kept_from = [e for e in env_from if not _prefix_selects(e, names)]
                set_list(container, "envFrom", kept_from)
            env = container.get("env")
            if not env or not _any_selects(env, names):
                continue  # the usual container: nothing to copy
            if profile_env is None:
                profile_env = _profile_env(pod)
            main, set_by_profile = profile_env
            kept = []
            for e in env:
                if not _selects(e, names) or _from_profile(container, e, main, set_by_profile):
                    kept.append(e)
                else:
                    removed.append(f"{container['name']} {e['name']}")
            set_list(container, "env", kept)
    if not removed:
        return None
    return Change(
        RESOURCES_DEVICE_ENV,
        warning("device selection removed (request gpus instead)", removed),
    )


def _any_selects(env: list[JSON], names: tuple[str, ...]) -> bool:
    """Whether an entry of ``env`` may select devices (``_selects``): a loop over names,
    as almost no container sets one."""
    for e in env:
        if e["name"] in names and _selects(e, names):
            return True
    return False


def check_device_env(pod: Pod) -> list[Violation]:
    names = pod.policy.resources.device_env
    out: list[Violation] = []
    if not names:
        return out
    profile_env: tuple[JSON | None, list[JSON]] | None = None  # looked up at the first hit
    for list_name in ALL_CONTAINER_LISTS:
        for i, container in enumerate(pod.spec.get(list_name) or ()):
            for j, env_from in enumerate(container.get("envFrom") or ()):
                if _prefix_selects(env_from, names):
                    out.append(
                        Violation(
                            RESOURCES_DEVICE_ENV,
                            f"{pod.spec_path}.{list_name}[{i}].envFrom[{j}].prefix",
                            f"envFrom with prefix {env_from['prefix']!r} can set a variable that "
                            "selects the node's devices: use another prefix and request "
                            f"{pod.short(pod.policy.resources.gpu_resource_name)} in resources",
                        )
                    )
            for j, env in enumerate(container.get("env") or ()):
                if not _selects(env, names):
                    continue
                if profile_env is None:
                    profile_env = _profile_env(pod)
                if not _from_profile(container, env, *profile_env):
                    out.append(
                        Violation(
                            RESOURCES_DEVICE_ENV,
                            f"{pod.spec_path}.{list_name}[{i}].env[{j}]",
                            f"{env['name']} selects the node's devices outside the pod's "
                            "requests: remove it and request "
                            f"{pod.short(pod.policy.resources.gpu_resource_name)}"
                            " in resources (or use a profile)",
                        )
                    )
    return out


# --- claims of devices (dynamic resource allocation) ------------------------------------

RESOURCE_CLAIM = frozenset({"ResourceClaim"})


def device_claim_allowed(name: str, pod: Pod, *, undecided: bool = False) -> bool:
    """An existing ResourceClaim the platform created (by name), named by a run the
    platform created (``undecided``: or whose creator the cache cannot tell yet, which
    mutation leaves for validation to deny with ``ownership.unknown``)."""
    creator = pod.ownership.platform or (undecided and pod.ownership.unknown is not None)
    return creator and matches_any(pod.policy.resources.platform_device_claims, name, pod.labels)


def _named_claims(pod: Pod, undecided: bool = False) -> Iterator[Reference]:
    """The existing ResourceClaims the pod names and may not use."""
    for ref in located(pod.spec, RESOURCE_CLAIM):
        if not device_claim_allowed(ref.name, pod, undecided=undecided):
            yield ref


def drop_device_claims(pod: Pod) -> Change | None:
    if pod.policy.volumes.on_pre_existing != "Strip" or "resourceClaims" not in pod.spec:
        return None
    refs = list(_named_claims(pod, undecided=True))
    if not refs:
        return None
    entries = pod.spec["resourceClaims"]
    names = {entries[ref.item[1]].get("name") for ref in refs}
    for list_name in ALL_CONTAINER_LISTS:
        for container in pod.spec.get(list_name) or ():
            resources = container.get("resources")
            claims = resources.get("claims") if isinstance(resources, dict) else None
            if claims:
                set_list(resources, "claims", [c for c in claims if c.get("name") not in names])
    remove_items(pod.spec, [ref.item for ref in refs])
    return kept_change(
        RESOURCES_DEVICE_CLAIM,
        "existing device claims removed (use resourceClaimTemplateName)",
        tuple(dict.fromkeys(ref.name for ref in refs)),
    )


def check_device_claims(pod: Pod) -> list[Violation]:
    if "resourceClaims" not in pod.spec:  # the usual Pod
        return []
    return [
        Violation(RESOURCES_DEVICE_CLAIM, item_text(ref.item, pod.spec_path), _claim_why(ref, pod))
        for ref in _named_claims(pod)
    ]


def _claim_why(ref: Reference, pod: Pod) -> str:
    if matches_any(pod.policy.resources.platform_device_claims, ref.name, pod.labels):
        return (
            f"ResourceClaim {ref.name!r} is the platform's: only runs the platform creates "
            "may use its devices"
        )
    return (
        f"ResourceClaim {ref.name!r} exists before the run: its devices are shared with "
        "every Pod naming it; use resourceClaimTemplateName for a claim of the run's own"
    )
