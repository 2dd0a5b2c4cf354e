"""The eight mutation steps of SPEC section 2, in order.

Each step takes the pod being mutated (a private copy) and reports what it changed as
at most one ``Change``. Steps compare before/after themselves, so a step that finds
nothing to do reports nothing; the JSON Patch is computed later by diffing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from webhook.engine.podspec import iter_containers
from webhook.engine.types import JSON, Change
from webhook.policy.model import Policy, Profile, SecurityConfig, matches_any
from webhook.quantity import format_bytes_ceil_mi, parse

MAIN_CONTAINER_ANNOTATION = "runguard.io/main-container"
WARNING_LIMIT = 120


@dataclass
class Pod:
    """The pod under mutation: its spec (mutated in place) and what identifies it."""

    spec: JSON
    labels: dict[str, str]
    annotations: dict[str, str]
    policy: Policy
    profile: Profile | None = None


def warning(summary: str, details: Iterable[str] = ()) -> str:
    """``runguard: summary: a, b, c`` cut to fit kubectl's 120 characters, with ``+N more``."""
    items = list(details)
    text = f"runguard: {summary}"
    if not items:
        return text[:WARNING_LIMIT]
    shown: list[str] = []
    for i, item in enumerate(items):
        rest = len(items) - i - 1
        candidate = f"{text}: {', '.join([*shown, item])}"
        tail = f" (+{rest} more)" if rest else ""
        if len(candidate) + len(tail) > WARNING_LIMIT:
            break
        shown.append(item)
    hidden = len(items) - len(shown)
    out = f"{text}: {', '.join(shown)}" if shown else text
    if hidden:
        out += f" (+{hidden} more)"
    return out[:WARNING_LIMIT]


def main_container(pod: Pod) -> JSON:
    containers: list[JSON] = pod.spec["containers"]
    wanted = pod.annotations.get(MAIN_CONTAINER_ANNOTATION)
    for c in containers:
        if c["name"] == wanted:
            return c
    return containers[0]


def _resources(container: JSON, part: str) -> dict[str, Any]:
    res = container.get("resources")
    if res is None:
        res = container["resources"] = {}
    values = res.get(part)
    if values is None:
        values = res[part] = {}
    out: dict[str, Any] = values
    return out


def _same_quantity(a: Any, b: Any) -> bool:
    return a is not None and b is not None and parse(a) == parse(b)


def _short(resource: str, policy: Policy) -> str:
    return "gpu" if resource == policy.resources.gpu_resource_name else resource


# -- 1. profile -------------------------------------------------------------------------


def profile_name(
    pod_labels: dict[str, str], pod_annotations: dict[str, str], policy: Policy
) -> str | None:
    """The profile a run names (label, else annotation), else the policy's default."""
    key = policy.profiles_config.label
    return pod_labels.get(key) or pod_annotations.get(key) or policy.profiles_config.default


def resolve_profile(pod: Pod) -> Change | None:
    """Pick the profile; an unknown name falls back to the default with ``unknown: Default``."""
    name = profile_name(pod.labels, pod.annotations, pod.policy)
    if name is None:
        return None
    profile = pod.policy.profiles.get(name)
    cfg = pod.policy.profiles_config
    if (
        profile is None
        and cfg.unknown == "Default"
        and cfg.default is not None
        and cfg.default in pod.policy.profiles
    ):
        pod.profile = pod.policy.profiles[cfg.default]
        return Change(
            "profile.unknown", warning(f"unknown profile {name!r}, using {cfg.default!r}")
        )
    pod.profile = profile
    return None


def apply_profile(pod: Pod) -> Change | None:
    profile = pod.profile
    if profile is None:
        return None
    changed: list[str] = []
    spec = pod.spec
    main = main_container(pod)
    for part, values in (("requests", profile.requests), ("limits", profile.limits)):
        if not values:
            continue
        current = _resources(main, part)
        for resource, value in values.items():
            if not _same_quantity(current.get(resource), value):
                current[resource] = value
                changed.append(f"{_short(resource, pod.policy)} {part[:-1]} {value}")
    if profile.node_selector:
        selector = spec.get("nodeSelector")
        if selector is None:
            selector = spec["nodeSelector"] = {}
        for key, value in profile.node_selector.items():
            if selector.get(key) != value:
                selector[key] = value
                changed.append(f"nodeSelector {key}")
    if profile.env:
        env = main.get("env")
        if env is None:
            env = main["env"] = []
        for var in profile.env:
            idx = next((i for i, e in enumerate(env) if e["name"] == var["name"]), None)
            if idx is None:
                env.append(dict(var))
                changed.append(f"env {var['name']}")
            elif env[idx] != var:
                env[idx] = dict(var)
                changed.append(f"env {var['name']}")
    if profile.tolerations and _merge_tolerations(spec, profile.tolerations):
        changed.append("tolerations")
    overrides: tuple[tuple[str, Any], ...] = (
        ("affinity", profile.affinity),
        ("priorityClassName", profile.priority_class_name),
        ("runtimeClassName", profile.runtime_class_name),
    )
    for key, value in overrides:
        if value is not None and spec.get(key) != value:
            spec[key] = _copy(value)
            if key == "priorityClassName":
                forget_computed_priority(spec)
            changed.append(key)
    if not changed:
        return None
    return Change("profile.applied", warning(f"profile {profile.name} applied", changed))


# Set by the apiserver's Priority plugin from priorityClassName; it refuses a Pod whose
# values disagree with the class, and re-runs after a webhook changed the object.
PRIORITY_COMPUTED = ("priority", "preemptionPolicy")


def forget_computed_priority(spec: JSON) -> None:
    """After changing the class: let the Priority plugin compute these again."""
    for key in PRIORITY_COMPUTED:
        spec.pop(key, None)


def _merge_tolerations(spec: JSON, wanted: Iterable[Any]) -> bool:
    """Add each wanted toleration, replacing user tolerations with the same key and effect."""
    tolerations: list[JSON] = spec.get("tolerations") or []
    before = list(tolerations)
    for t in wanted:
        same = [
            u
            for u in tolerations
            if u.get("key") == t.get("key") and u.get("effect") == t.get("effect")
        ]
        if same == [t]:
            continue
        tolerations = [u for u in tolerations if u not in same]
        tolerations.append(dict(t))
    if tolerations != before:
        spec["tolerations"] = tolerations
        return True
    return False


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


# -- 2. defaults ------------------------------------------------------------------------


def fill_defaults(pod: Pod) -> Change | None:
    cfg = pod.policy.resources
    filled: dict[str, int] = {}
    for part, defaults in (("requests", cfg.default_requests), ("limits", cfg.default_limits)):
        if not defaults:
            continue
        for _, _, container in iter_containers(pod.spec):
            current = _resources(container, part)
            for resource, value in defaults.items():
                if resource not in current:
                    current[resource] = value
                    label = f"{_short(resource, pod.policy)} {part[:-1]} {value}"
                    filled[label] = filled.get(label, 0) + 1
    _prune_empty_resources(pod.spec)
    if not filled:
        return None
    return Change("resources.defaults", warning("defaults filled", filled))


def _prune_empty_resources(spec: JSON) -> None:
    """Drop ``{}`` requests/limits this engine may have created, so mutation is idempotent."""
    for _, _, container in iter_containers(spec):
        res = container.get("resources")
        if not isinstance(res, dict):
            continue
        for part in ("requests", "limits"):
            if part in res and res[part] == {}:
                del res[part]


# -- 3. memory limit --------------------------------------------------------------------


def derive_memory_limits(pod: Pod) -> Change | None:
    factor = pod.policy.resources.memory_limit_factor
    if factor is None:
        return None
    set_limits: list[str] = []
    for _, _, container in iter_containers(pod.spec):
        res = container.get("resources") or {}
        request = (res.get("requests") or {}).get("memory")
        if request is None or "memory" in (res.get("limits") or {}):
            continue
        limit = format_bytes_ceil_mi(parse(request) * factor)
        _resources(container, "limits")["memory"] = limit
        set_limits.append(f"{container['name']} {limit}")
    if not set_limits:
        return None
    return Change(
        "resources.memory-limit", warning(f"memory limit set to request x {factor}", set_limits)
    )


# -- 4. clamp ---------------------------------------------------------------------------


def clamp_to_maximums(pod: Pod) -> Change | None:
    cfg = pod.policy.resources
    gpu = cfg.gpu_resource_name
    notes: list[str] = []
    for _, _, container in iter_containers(pod.spec):
        res = container.get("resources")
        if not res:
            continue
        requests: dict[str, Any] = res.get("requests") or {}
        limits: dict[str, Any] = res.get("limits") or {}
        if cfg.on_exceed == "Clamp":
            for part, values in (("request", requests), ("limit", limits)):
                for resource, value in values.items():
                    maximum = cfg.maximum_values.get(resource)
                    if maximum is not None and parse(value) > maximum:
                        values[resource] = cfg.maximums[resource]
                        notes.append(
                            f"{_short(resource, pod.policy)} {part} {value} -> "
                            f"{cfg.maximums[resource]}"
                        )
        for resource in list(requests):
            if resource in limits and parse(requests[resource]) > parse(limits[resource]):
                notes.append(
                    f"{_short(resource, pod.policy)} request {requests[resource]} -> limit"
                )
                requests[resource] = limits[resource]
        if gpu in requests or gpu in limits:
            # A gpu cannot be shared: the request is the limit (the limit, if any, wins).
            amount = limits.get(gpu, requests.get(gpu))
            if not (
                _same_quantity(requests.get(gpu), amount)
                and _same_quantity(limits.get(gpu), amount)
            ):
                _resources(container, "requests")[gpu] = amount
                _resources(container, "limits")[gpu] = amount
                notes.append(f"gpu request = limit {amount}")
    if not notes:
        return None
    return Change("resources.clamped", warning("resources clamped", notes))


# -- 5. root ----------------------------------------------------------------------------


def strip_root(pod: Pod) -> Change | None:
    """Harden the pod. Explicit root settings are fixed only with ``onRoot: Strip``
    (``security.root``); fields the user left out (runAsNonRoot, seccomp, dropped
    capabilities, no privilege escalation) are always filled (``security.defaults``)."""
    sec = pod.policy.security
    strip = sec.on_root == "Strip"
    stripped: list[str] = []
    filled: list[str] = []
    spec = pod.spec
    psc = spec.get("securityContext")
    if psc is None:
        psc = spec["securityContext"] = {}
    if strip:
        _strip_root_ids(psc, ("runAsUser", "runAsGroup", "fsGroup"), sec, "pod", stripped)
    if psc.get("runAsNonRoot") is None:
        psc["runAsNonRoot"] = True
        filled.append("runAsNonRoot")
    elif strip and psc["runAsNonRoot"] is False:
        psc["runAsNonRoot"] = True
        stripped.append("runAsNonRoot false")
    if sec.seccomp_profile:
        current = (psc.get("seccompProfile") or {}).get("type")
        if current is None:
            psc["seccompProfile"] = {"type": sec.seccomp_profile}
            filled.append(f"seccomp {sec.seccomp_profile}")
        elif strip and current == "Unconfined":
            psc["seccompProfile"] = {"type": sec.seccomp_profile}
            stripped.append("seccomp Unconfined")

    for _, _, container in iter_containers(spec):
        name = container["name"]
        sc = container.get("securityContext")
        if sc is None:
            sc = container["securityContext"] = {}
        if strip:
            _strip_root_ids(sc, ("runAsUser", "runAsGroup"), sec, name, stripped)
            if sc.get("runAsNonRoot") is False:
                sc["runAsNonRoot"] = True
                stripped.append(f"{name} runAsNonRoot false")
            if sec.seccomp_profile and (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
                sc["seccompProfile"] = {"type": sec.seccomp_profile}
                stripped.append(f"{name} seccomp Unconfined")
        for key in ("privileged", "allowPrivilegeEscalation"):
            if sc.get(key) is None:
                sc[key] = False
                filled.append(f"{key} false")
            elif strip and sc[key] is True:
                sc[key] = False
                stripped.append(f"{name} {key}")
        caps: JSON | None = sc.get("capabilities")
        if caps is None:
            caps = sc["capabilities"] = {}
        drop = caps.get("drop") or []
        missing = [c for c in sec.drop_capabilities if c not in drop]
        if missing:
            caps["drop"] = [*drop, *missing]
            filled.append(f"drop {','.join(missing)}")
        add = caps.get("add")
        if strip and add:
            kept = [c for c in add if c in sec.allowed_capabilities]
            if kept != add:
                stripped.append(f"{name} add {','.join(c for c in add if c not in kept)}")
                if kept:
                    caps["add"] = kept
                else:
                    del caps["add"]
    if stripped:
        return Change("security.root", warning("root and privileges stripped", stripped))
    if filled:
        return Change("security.defaults", warning("security defaults set", dict.fromkeys(filled)))
    return None


def _strip_root_ids(
    sc: JSON, keys: tuple[str, ...], sec: SecurityConfig, where: str, stripped: list[str]
) -> None:
    """Replace uid/gid/fsGroup 0 by the policy's id for that key, or drop the field."""
    replacements = {
        "runAsUser": sec.run_as_user,
        "runAsGroup": sec.run_as_group,
        "fsGroup": sec.fs_group,
    }
    for key in keys:
        if sc.get(key) == 0:
            replacement = replacements[key]
            if replacement is None:
                del sc[key]
            else:
                sc[key] = replacement
            stripped.append(f"{where} {key} 0")


# -- 6. volumes -------------------------------------------------------------------------


def drop_preexisting_volumes(pod: Pod) -> Change | None:
    cfg = pod.policy.volumes
    if cfg.on_pre_existing != "Strip":
        return None
    dropped = [
        v["name"]
        for v in pod.spec.get("volumes") or ()
        if preexisting_reference(v, pod.policy, pod.labels) is not None
    ]
    if not dropped:
        return None
    _remove_volumes(pod.spec, set(dropped))
    return Change("volumes.pre-existing", warning("pre-existing volumes removed", dropped))


def preexisting_reference(volume: JSON, policy: Policy, labels: dict[str, str]) -> str | None:
    """``"pvc NAME"`` or ``"configMap NAME"`` when the volume is not one the platform made."""
    cfg = policy.volumes
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        if not matches_any(cfg.platform_claims, claim, labels):
            return f"pvc {claim}"
    if "configMap" in volume:
        name = volume["configMap"]["name"]
        if not matches_any(cfg.platform_config_maps, name, labels):
            return f"configMap {name}"
    return None


def _remove_volumes(spec: JSON, names: set[str]) -> None:
    spec["volumes"] = [v for v in spec.get("volumes") or () if v["name"] not in names]
    if not spec["volumes"]:
        del spec["volumes"]
    for _, _, container in iter_containers(spec):
        for key in ("volumeMounts", "volumeDevices"):
            if key in container and container[key]:
                _set_list(container, key, [m for m in container[key] if m["name"] not in names])


def _set_list(parent: JSON, key: str, items: list[Any]) -> None:
    """Replace a list the step filtered; an emptied one is removed, as the apiserver stores it."""
    if len(items) == len(parent[key]):
        return
    if items:
        parent[key] = items
    else:
        del parent[key]


# -- 7. secrets -------------------------------------------------------------------------


def secret_allowed(name: str, pod_policy: Policy, labels: dict[str, str]) -> bool:
    return matches_any(pod_policy.secrets.allowed, name, labels)


def drop_forbidden_secrets(pod: Pod) -> Change | None:
    policy = pod.policy
    if policy.secrets.on_forbidden != "Strip":
        return None
    removed: list[str] = []

    def ok(name: str) -> bool:
        if secret_allowed(name, policy, pod.labels):
            return True
        if name not in removed:
            removed.append(name)
        return False

    for _, _, container in iter_containers(pod.spec):
        if container.get("env"):
            kept = [
                e for e in container["env"] if _env_secret(e) is None or ok(_env_secret(e) or "")
            ]
            _set_list(container, "env", kept)
        if container.get("envFrom"):
            kept = [
                e
                for e in container["envFrom"]
                if "secretRef" not in e or ok(e["secretRef"]["name"])
            ]
            _set_list(container, "envFrom", kept)
    dropped_volumes: set[str] = set()
    for volume in pod.spec.get("volumes") or ():
        if "secret" in volume and not ok(volume["secret"]["secretName"]):
            dropped_volumes.add(volume["name"])
        projected = volume.get("projected")
        if isinstance(projected, dict) and projected.get("sources"):
            sources = projected["sources"]
            kept = [s for s in sources if "secret" not in s or ok(s["secret"]["name"])]
            if len(kept) != len(sources):
                projected["sources"] = kept
                if not kept:
                    dropped_volumes.add(volume["name"])
    if dropped_volumes:
        _remove_volumes(pod.spec, dropped_volumes)
    if not removed:
        return None
    return Change(
        "secrets.forbidden", warning("secrets not managed by the platform removed", removed)
    )


def _env_secret(env: JSON) -> str | None:
    ref = (env.get("valueFrom") or {}).get("secretKeyRef")
    return ref["name"] if ref else None


# -- 8. scheduling ----------------------------------------------------------------------


def default_priority_class(pod: Pod) -> Change | None:
    cfg = pod.policy.scheduling
    current = pod.spec.get("priorityClassName")
    allowed = cfg.allowed_priority_classes
    if current is not None and (allowed is None or current in allowed):
        return None
    if cfg.default_priority_class is None:
        return None  # nothing to put instead: validation denies a disallowed class
    pod.spec["priorityClassName"] = cfg.default_priority_class
    forget_computed_priority(pod.spec)
    if current is None:
        return Change(
            "scheduling.priority-class",
            warning(f"priority class defaulted to {cfg.default_priority_class}"),
        )
    return Change(
        "scheduling.priority-class",
        warning(f"priority class {current} not allowed, set to {cfg.default_priority_class}"),
    )


def preemption_mode(pod: Pod) -> str | None:
    cfg = pod.policy.scheduling.preemption
    if cfg is None:
        return None
    return pod.annotations.get(cfg.annotation) or pod.labels.get(cfg.annotation) or cfg.default


def apply_preemption_mode(pod: Pod) -> Change | None:
    """MLRun's modes: prevent keeps runs off spot nodes, constrain keeps them on, allow permits."""
    cfg = pod.policy.scheduling.preemption
    mode = preemption_mode(pod)
    if cfg is None or mode not in ("allow", "constrain", "prevent"):
        return None  # "none", no mode, or an unknown one (denied by validation)
    before = _copy({k: pod.spec.get(k) for k in ("tolerations", "affinity", "nodeSelector")})
    spec = pod.spec
    spot_tolerations = [dict(t) for t in cfg.tolerations]
    tolerations = [t for t in spec.get("tolerations") or () if t not in spot_tolerations]
    if mode in ("allow", "constrain"):
        tolerations.extend(spot_tolerations)
    if tolerations:
        spec["tolerations"] = tolerations
    else:
        spec.pop("tolerations", None)
    if mode == "prevent" and spec.get("nodeSelector"):
        for key, value in cfg.node_selector.items():
            if spec["nodeSelector"].get(key) == value:
                del spec["nodeSelector"][key]
        if not spec["nodeSelector"]:
            del spec["nodeSelector"]
    operator = {"prevent": "NotIn", "constrain": "In", "allow": None}[mode]
    _set_spot_affinity(spec, cfg.node_selector, operator)
    after = {k: spec.get(k) for k in ("tolerations", "affinity", "nodeSelector")}
    if after == before:
        return None
    return Change("scheduling.preemption-mode", warning(f"preemption mode {mode} applied"))


def _set_spot_affinity(spec: JSON, spot: dict[str, str] | Any, operator: str | None) -> None:
    """Make every required node selector term carry exactly the spot expression of the mode."""
    keys = set(spot)
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[JSON] = list(required.get("nodeSelectorTerms") or ())
    wanted = (
        [{"key": k, "operator": operator, "values": [v]} for k, v in spot.items()]
        if operator
        else []
    )
    new_terms = []
    for term in terms or ([{}] if wanted else []):
        expressions = [e for e in term.get("matchExpressions") or () if e.get("key") not in keys]
        expressions.extend(wanted)
        new_term = {k: v for k, v in term.items() if k != "matchExpressions"}
        if expressions:
            new_term["matchExpressions"] = expressions
        if new_term:
            new_terms.append(new_term)
    if new_terms == terms:
        return
    if new_terms:
        spec["affinity"] = affinity
        affinity["nodeAffinity"] = node_affinity
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            **required,
            "nodeSelectorTerms": new_terms,
        }
        return
    node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    if not node_affinity:
        affinity.pop("nodeAffinity", None)
    if not affinity:
        spec.pop("affinity", None)


STEPS: tuple[Callable[[Pod], Change | None], ...] = (
    resolve_profile,
    apply_profile,  # 1
    fill_defaults,  # 2
    derive_memory_limits,  # 3
    clamp_to_maximums,  # 4
    strip_root,  # 5
    drop_preexisting_volumes,  # 6
    drop_forbidden_secrets,  # 7
    default_priority_class,  # 8a
    apply_preemption_mode,  # 8b
)


def run_steps(pod: Pod) -> list[Change]:
    changes = []
    for step in STEPS:
        change = step(pod)
        if change is not None:
            changes.append(change)
    return changes
