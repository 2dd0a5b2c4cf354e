"""Claims a Pod owns: ``ownership.not-a-run`` for another Pod naming them.

Two controllers make claims for one Pod and make that Pod their controller owner: the
ephemeral-volume controller, a PersistentVolumeClaim ``<pod>-<volume>`` for each generic
ephemeral volume, and the resourceclaim controller, a ResourceClaim for each entry of
``resourceClaims`` made from a ResourceClaimTemplate. Neither carries a platform name,
yet each holds what the Pod wrote or uses (its scratch data, its allocated GPU). A Pod
naming such a claim (``persistentVolumeClaim.claimName``, a ``dataSource`` cloning it,
``resourceClaimName``), or a new claim cloning it (a PVC's or a StatefulSet claim
template's ``dataSource``), would mount the other Pod's data or share its devices:
nobody but the platform may, whatever Pod owns it (runs are judged by ``volumes.pre-existing``
and ``resources.device-claim`` already, which keep no claim of another Pod for a run the
platform did not create).

The owner is read from runguard's cache (``ClusterView``): claims' metadata by name,
ownerReferences included. A kind the cache has not synced (ResourceClaims where the
apiserver does not serve ``resource.k8s.io``, or the watch may not list them) fails
closed, retryable (``ownership.unknown``); a claim absent from a synced cache is no other
Pod's yet. Without a cluster view (offline, no ``--cluster-state``) owners are unknown
and nothing is judged here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webhook.engine.context import Context, Ownership
from webhook.engine.doors import Reference, item_text, located
from webhook.engine.pod import spec_prefix
from webhook.engine.rules.not_a_run import OWNERSHIP_NOT_A_RUN, OWNERSHIP_UNKNOWN
from webhook.engine.rules.ownership import (
    enabled,
    is_platform_identity,
)
from webhook.engine.rules.reserved import claim_specs, snapshot_source
from webhook.engine.types import JSON, Violation
from webhook.policy.model import Policy, RunPolicy

if TYPE_CHECKING:
    from webhook.engine.subject import Review

__all__ = [
    "OWNED_KINDS",
    "check_pod_claim_clones",
    "check_pod_claim_snapshots",
    "check_pod_claims",
    "pod_owner",
]

# The kinds of claims a controller makes for one Pod, owned by it.
OWNED_KINDS = frozenset({"PersistentVolumeClaim", "ResourceClaim"})


def pod_owner(context: Context, kind: str, namespace: str, name: str) -> str | None:
    """The name of the Pod that is the controller owner of the claim, if any."""
    state = context.state
    found = state.get(kind, namespace, name) if state is not None else None
    if found is None:
        return None
    for owner_kind, owner_name, _, controller in found.owners:
        if controller and owner_kind == "Pod":
            return owner_name
    return None


def check_pod_claims(r: Review, policy: RunPolicy, ownership: Ownership) -> list[Violation]:
    """``ownership.not-a-run``: the pod spec of ``r``, which the platform did not create
    (``ownership``, by ``policy``), names a claim whose controller owner is a Pod
    (``ownership.unknown`` while runguard cannot tell whose the claim is, or who created
    this one). On UPDATE a claim the old spec already named is not new."""
    context, target = r.context, r.target
    if target is None or not enabled(policy) or ownership.platform or context.state is None:
        return []
    refs = located(target.spec, OWNED_KINDS)
    if not refs:  # the usual Pod
        return []
    old = r.old_target.spec if r.old_target is not None else None
    had = {(ref.door.kind, ref.name) for ref in located(old, OWNED_KINDS)}
    out: list[Violation] = []
    for ref in refs:
        if (ref.door.kind, ref.name) not in had:
            violation = _judged(ref, target.spec_path, ownership, context, r.namespace)
            if violation is not None and violation not in out:
                out.append(violation)
    return out


def _judged(
    ref: Reference, spec_path: str, ownership: Ownership, context: Context, namespace: str
) -> Violation | None:
    kind, name = ref.door.kind, ref.name
    path = spec_prefix(spec_path) + item_text(ref.item)
    state = context.state
    assert state is not None
    if not state.synced(kind):
        return Violation(
            OWNERSHIP_UNKNOWN,
            path,
            f"runguard's cache does not hold {kind} objects (not synced yet, not served by "
            f"the apiserver, or not listable by runguard): cannot tell whether {kind} "
            f"{name!r} is another Pod's; retry in a moment",
        )
    owner = pod_owner(context, kind, namespace, name)
    if owner is None:
        return None
    if ownership.unknown:
        return Violation(
            OWNERSHIP_UNKNOWN,
            path,
            f"{ownership.unknown}: runguard cannot tell whether the platform created this "
            f"Pod, which uses {kind} {name!r} of Pod {owner}; retry in a moment",
        )
    return Violation(
        OWNERSHIP_NOT_A_RUN,
        path,
        f"{kind} {name!r} is Pod {owner}'s own (made for it, and owned by it): only that "
        "Pod uses it, and only the platform may name it from another Pod",
    )


def check_pod_claim_clones(
    obj: JSON, root: Policy, context: Context, namespace: str
) -> list[Violation]:
    """``ownership.not-a-run``: a new PVC, or a StatefulSet's claim template, cloning a
    claim whose controller owner is a Pod, created by anyone but the platform."""
    specs = claim_specs(obj, context)
    platforms = [p for p in root.run_policies if enabled(p)]
    if not specs or not platforms or context.state is None:
        return []
    if any(is_platform_identity(p, context.requester) for p in platforms):
        return []
    out = []
    for path, spec in specs:
        for key in ("dataSource", "dataSourceRef"):
            source = spec.get(key) if isinstance(spec, dict) else None
            if not isinstance(source, dict) or source.get("kind") != "PersistentVolumeClaim":
                continue
            name = source.get("name")
            owner = pod_owner(context, "PersistentVolumeClaim", namespace, str(name))
            if owner is not None:
                out.append(
                    Violation(
                        OWNERSHIP_NOT_A_RUN,
                        f"{path}.{key}",
                        f"PersistentVolumeClaim {name!r} is Pod {owner}'s own (made for it, "
                        "and owned by it): only the platform may clone it into a new claim",
                    )
                )
    return out


def check_pod_claim_snapshots(
    obj: JSON, root: Policy, context: Context, namespace: str
) -> list[Violation]:
    """``ownership.not-a-run``: a VolumeSnapshot of a claim whose controller owner is a
    Pod, created by anyone but the platform (a claim of hers restored from it would be a
    clone by another door)."""
    name = snapshot_source(obj)
    platforms = [p for p in root.run_policies if enabled(p)]
    if context.operation != "CREATE" or name is None or not platforms or context.state is None:
        return []
    if any(is_platform_identity(p, context.requester) for p in platforms):
        return []
    owner = pod_owner(context, "PersistentVolumeClaim", namespace, name)
    if owner is None:
        return []
    return [
        Violation(
            OWNERSHIP_NOT_A_RUN,
            "spec.source.persistentVolumeClaimName",
            f"PersistentVolumeClaim {name!r} is Pod {owner}'s own (made for it, and owned "
            "by it): only the platform may snapshot it",
        )
    ]
