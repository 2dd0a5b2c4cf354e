"""Ownership (SPEC section 7): the platform's volumes and secrets only for the platform's runs.

Names and labels are written by whoever writes the manifest, so they cannot alone decide
what a run may use. With ``platform.identities`` set, a Pod is the platform's when:

- the request's user is a platform identity (a user, or ``group:NAME`` of its groups);
- or the request comes from a controller of ``platform.controllers`` (the
  kube-controller-manager's job-controller, replicaset-controller...) and the Pod's
  controller owner, found *by uid* in the cluster state, carries a platform stamp,
  directly or through owners stamped by those controllers (Pod -> ReplicaSet ->
  Deployment, Pod -> Job -> CronJob). An ``ownerReferences`` a user writes proves
  nothing: the requester must be the controller itself.

The stamp (``runguard.io/requested-by``) is written by runguard at CREATE, overwriting
any value sent, and cannot change on UPDATE, so it can be trusted later. Without
``platform.identities`` the checks are off and names decide (``runguard lint`` warns).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from webhook.engine.context import (
    OWNERSHIP_OFF,
    STAMP,
    ClusterView,
    Context,
    Ownership,
    Requester,
)
from webhook.engine.pod import spec_prefix
from webhook.engine.rules.volumes import project_claim
from webhook.engine.types import JSON, Violation
from webhook.policy.model import NamePattern, Policy
from webhook.policy.patterns import split

# The kinds whose ownerReferences chain a Pod back to what the platform created.
OWNER_KINDS = frozenset(
    {
        "Job",
        "CronJob",
        "ReplicaSet",
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicationController",
    }
)
_MAX_DEPTH = 6  # Pod -> ReplicaSet -> Deployment is 2; anything longer is not a controller chain


def enabled(policy: Policy) -> bool:
    return bool(policy.platform.identities)


def is_platform_identity(policy: Policy, requester: Requester | None) -> bool:
    if requester is None:
        return False
    for identity in policy.platform.identities:
        if identity.startswith("group:"):
            if identity[len("group:") :] in requester.groups:
                return True
        elif identity == requester.username:
            return True
    return False


def stamped_by_platform(policy: Policy, annotations: Mapping[str, str]) -> bool:
    """A stamp names a platform user (group identities are honoured at request time)."""
    stamp = annotations.get(STAMP)
    return stamp is not None and stamp in policy.platform.identities


def ownership_of(object_meta: JSON, namespace: str, policy: Policy, context: Context) -> Ownership:
    """Whether the object being admitted (a Pod or a pod controller) is the platform's."""
    if not enabled(policy):
        return OWNERSHIP_OFF
    if context.operation != "CREATE":
        # Who created it is recorded in the stamp runguard wrote then, immutable since:
        # the platform, or a controller whose owner, by uid, the platform stamped.
        annotations = object_meta.get("annotations") or {}
        if stamped_by_platform(policy, annotations):
            return Ownership(True)
        if annotations.get(STAMP) in policy.platform.controllers:
            return _owned_through(
                object_meta.get("ownerReferences"), namespace, policy, context.state, 0
            )
        return Ownership(False)
    requester = context.requester
    if is_platform_identity(policy, requester):
        return Ownership(True)
    if requester is None or requester.username not in policy.platform.controllers:
        return Ownership(False)
    return _owned_through(object_meta.get("ownerReferences"), namespace, policy, context.state, 0)


def _owned_through(
    references: Any, namespace: str, policy: Policy, state: ClusterView | None, depth: int
) -> Ownership:
    """Follow the controller owner by uid up to a platform stamp."""
    owner = _controller_owner(references)
    if owner is None or depth >= _MAX_DEPTH:
        return Ownership(False)
    kind, name, uid = owner
    if state is None:
        return Ownership(False, f"no cluster state to find the owner {kind} {name} (uid {uid})")
    found = state.by_uid(uid)
    if found is None:
        if not state.synced(kind):
            return Ownership(False, f"runguard's cache has not synced {kind} objects yet")
        return Ownership(False)  # no such owner: the reference is forged or stale
    if found.kind != kind or found.namespace != namespace or found.name != name:
        return Ownership(False)  # a uid borrowed from another object proves nothing
    if stamped_by_platform(policy, found.annotations):
        return Ownership(True)
    if found.annotations.get(STAMP) in policy.platform.controllers:
        refs = [{"kind": k, "name": n, "uid": u, "controller": c} for k, n, u, c in found.owners]
        return _owned_through(refs, namespace, policy, state, depth + 1)
    return Ownership(False)


def _controller_owner(references: Any) -> tuple[str, str, str] | None:
    if not isinstance(references, list):
        return None
    for ref in references:
        if (
            isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("kind") in OWNER_KINDS
            and isinstance(ref.get("uid"), str)
        ):
            return ref["kind"], str(ref.get("name", "")), ref["uid"]
    return None


# --- names the platform reserves -------------------------------------------------------


def reserved_patterns(policy: Policy, kind: str) -> tuple[NamePattern, ...]:
    """The platform's name patterns for objects of ``kind``."""
    if kind == "PersistentVolumeClaim":
        return tuple(policy.volumes.platform_claims)
    if kind == "ConfigMap":
        return tuple(policy.volumes.platform_config_maps)
    if kind == "Secret":
        return tuple(policy.secrets.allowed)
    return ()


def reserved_name(policy: Policy, kind: str, name: str) -> NamePattern | None:
    """The per-run platform pattern ``name`` falls under, placeholders matching any value.

    Only patterns naming a run's label are reserved: they are the names the platform
    creates per run, which a user could take first. A pattern without a placeholder
    (``digitalhub-common-creds``, ``mlrun-*``) names installation-wide objects an admin
    creates with the platform's chart, before any run."""
    for pattern in reserved_patterns(policy, kind):
        if not pattern.label_keys:
            continue
        if _any_labels(pattern.text).fullmatch(name):
            return pattern
    return None


@lru_cache(maxsize=1024)
def _any_labels(text: str) -> re.Pattern[str]:
    """The regex of a pattern whose placeholders stand for any (non-empty) label value."""
    literals, _ = split(text)
    return re.compile(
        ".+".join(".*".join(re.escape(c) for c in lit.split("*")) for lit in literals), re.DOTALL
    )


def platform_named(policy: Policy, kind: str, name: str) -> bool:
    """Whether ``name`` is one the platform's patterns give objects of ``kind``, for any run
    (installation-wide names included: only runs the platform creates may use those)."""
    return any(_any_labels(p.text).fullmatch(name) for p in reserved_patterns(policy, kind))


def check_reserved_name(obj: JSON, policy: Policy, context: Context) -> list[Violation]:
    """``ownership.reserved-name``: only the platform creates objects with its names."""
    if not enabled(policy) or context.operation != "CREATE":
        return []
    kind = obj.get("kind")
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(kind, str) or not isinstance(name, str):
        return []
    pattern = reserved_name(policy, kind, name)
    if pattern is None or is_platform_identity(policy, context.requester):
        return []
    return [
        Violation(
            "ownership.reserved-name",
            "metadata.name",
            f"{kind} name {name!r} is reserved for the platform (pattern {pattern.text!r}): "
            "choose another name",
        )
    ]


# --- references to the platform's objects ----------------------------------------------


def platform_references(spec: Any, policy: Policy) -> list[tuple[str, str, str]]:
    """(kind, name, path) of every reference in a pod spec to an object with a platform
    name, whatever the pod's labels (a pattern's placeholders stand for any value). Reads
    defensively: it also runs on pods outside the selector, which are not shape-checked."""
    out: list[tuple[str, str, str]] = []

    def see(kind: str, name: Any, path: str) -> None:
        if isinstance(name, str) and platform_named(policy, kind, name):
            out.append((kind, name, path))

    if not isinstance(spec, dict):
        return out
    for i, volume in enumerate(_items(spec.get("volumes"))):
        path = f"spec.volumes[{i}]"
        see("PersistentVolumeClaim", _get(volume, "persistentVolumeClaim", "claimName"), path)
        see("ConfigMap", _get(volume, "configMap", "name"), path)
        see("Secret", _get(volume, "secret", "secretName"), path)
        for j, source in enumerate(_items(_get(volume, "projected", "sources"))):
            see("ConfigMap", _get(source, "configMap", "name"), f"{path}.projected.sources[{j}]")
            see("Secret", _get(source, "secret", "name"), f"{path}.projected.sources[{j}]")
    for list_name in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(_items(spec.get(list_name))):
            path = f"spec.{list_name}[{i}]"
            for j, env in enumerate(_items(_get(container, "env"))):
                value_from = _get(env, "valueFrom")
                see("Secret", _get(value_from, "secretKeyRef", "name"), f"{path}.env[{j}]")
                see("ConfigMap", _get(value_from, "configMapKeyRef", "name"), f"{path}.env[{j}]")
            for j, env_from in enumerate(_items(_get(container, "envFrom"))):
                see("Secret", _get(env_from, "secretRef", "name"), f"{path}.envFrom[{j}]")
                see("ConfigMap", _get(env_from, "configMapRef", "name"), f"{path}.envFrom[{j}]")
    for i, ref in enumerate(_items(spec.get("imagePullSecrets"))):
        see("Secret", _get(ref, "name"), f"spec.imagePullSecrets[{i}]")
    return out


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def check_not_a_run(
    spec: Any, spec_path: str, ownership: Ownership, policy: Policy
) -> list[Violation]:
    """``ownership.not-a-run``: a pod outside every selector may not use the platform's
    objects (``kubectl debug --copy-to`` of a run drops its labels), unless the platform
    created it."""
    if not enabled(policy) or ownership.platform:
        return []
    prefix = spec_prefix(spec_path)
    return [
        Violation(
            "ownership.not-a-run",
            f"{prefix}{path}",
            f"{kind} {name!r} is the platform's and this is not a platform run "
            "(a copy of a run without its labels?): only runs the platform creates may use it",
        )
        for kind, name, path in platform_references(spec, policy)
    ]


def check_ownership(pod: Any) -> list[Violation]:
    """``ownership.unknown``: the decision needs an object runguard's cache lacks (fail closed)."""
    if not enabled(pod.policy):
        return []
    out: list[Violation] = []
    if pod.ownership.unknown and platform_references(pod.spec, pod.policy):
        out.append(
            Violation(
                "ownership.unknown",
                f"{pod.meta_path}.ownerReferences",
                f"{pod.ownership.unknown}: runguard cannot tell whether the platform created "
                "this run, which uses the platform's objects; retry in a moment",
            )
        )
    for i, volume in enumerate(pod.spec.get("volumes") or ()):
        claim = _get(volume, "persistentVolumeClaim", "claimName")
        if isinstance(claim, str) and project_claim(pod, claim) is None:
            out.append(
                Violation(
                    "ownership.unknown",
                    f"{pod.spec_path}.volumes[{i}]",
                    f"runguard's cache has not synced claims yet: cannot tell whether pvc "
                    f"{claim!r} is shared with this run's project; retry in a moment",
                )
            )
    return out


def check_stamp(
    new_meta: JSON, old_meta: JSON, in_scope_before: bool, policy: Policy, context: Context
) -> list[Violation]:
    """On UPDATE: the stamp never changes, and an object cannot enter the platform's scope
    by an update (its stamp, written when runguard did not see it, is not runguard's)."""
    if not enabled(policy) or context.operation != "UPDATE":
        return []
    before = (old_meta.get("annotations") or {}).get(STAMP)
    after = (new_meta.get("annotations") or {}).get(STAMP)
    out: list[Violation] = []
    if before != after:
        out.append(
            Violation(
                "ownership.stamp",
                f"metadata.annotations[{STAMP}]",
                f"the stamp {STAMP} is written by runguard at creation and cannot change",
            )
        )
    if not in_scope_before and not is_platform_identity(policy, context.requester):
        out.append(
            Violation(
                "ownership.stamp",
                "metadata",
                "an existing object cannot become a run or use the platform's objects by an "
                "update: create it anew",
            )
        )
    return out
