"""What a platform operator's Pods may have beyond the policy (``platform.operators``).

An operator (the mpi-operator, ...) builds the Pods of the platform's objects and adds
what it needs to them: a ConfigMap it makes for the job (``configMaps``), a capability
the platform wrote into the job's template (``allowedCapabilities``). Those grants go to
a run only when it is the platform's (``pod.ownership``, decided from the creator and its
owners by uid) *and* that operator created it: directly (the request's user at CREATE,
its stamp after), or through a Kubernetes controller whose controller owner, by uid,
the operator created (the launcher Job of an MPIJob v2beta1). A user's look-alike
(their own MPIJob, or a Pod naming the operator's ConfigMap) gets none of them.
"""

from __future__ import annotations

from webhook.engine.context import STAMP, ObjectMeta
from webhook.engine.pod import Pod
from webhook.policy.model import Operator, matches_any

_MAX_DEPTH = 4  # Pod -> Job -> MPIJob is 1 step up; longer is not an operator's chain


def creating_operator(pod: Pod, undecided: bool = False) -> Operator | None:
    """The operator of ``pod.policy`` that created this platform run, if one did.

    ``undecided``: also while the run's owner is not known yet (an operator's webhook
    adds it after runguard's mutation), so that mutation strips nothing the operator's
    Pod keeps once validation, which sees it whole, decides."""
    platform = pod.policy.platform
    ownership = pod.ownership
    decided = ownership.platform or (undecided and ownership.unknown is not None)
    if not platform.operators or not platform.identities or not decided:
        return None
    context = pod.context
    if context.operation == "CREATE":
        creator = context.requester.username if context.requester else None
    else:
        creator = pod.annotations.get(STAMP)  # recorded at CREATE, never changed after
    meta: ObjectMeta | None = None
    for _ in range(_MAX_DEPTH):
        if creator is None:
            return None
        found = platform.operators_by_user.get(creator)
        if found is not None:
            return found
        if creator not in platform.owner_kinds or context.state is None:
            return None
        owner = _controller_owner(pod, meta)
        if owner is None:
            return None
        meta = context.state.by_uid(owner)
        if meta is None:
            return None
        creator = meta.annotations.get(STAMP)
    return None


def _controller_owner(pod: Pod, meta: ObjectMeta | None) -> str | None:
    """The uid of the controller owner of the Pod (``meta`` None) or of ``meta``."""
    if meta is None:
        for ref in pod.owner_references:
            if isinstance(ref, dict) and ref.get("controller") is True:
                uid = ref.get("uid")
                return uid if isinstance(uid, str) else None
        return None
    for _kind, _name, uid, controller in meta.owners:
        if controller:
            return str(uid)
    return None


def operator_config_map(pod: Pod, name: str, undecided: bool = False) -> bool:
    """Whether ``name`` is a ConfigMap the operator that created this run makes for it."""
    operator = creating_operator(pod, undecided)
    return operator is not None and matches_any(operator.config_maps, name, pod.labels)


def operator_capabilities(pod: Pod, undecided: bool = False) -> frozenset[str]:
    """Capabilities the operator that created this run lets its containers add."""
    operator = creating_operator(pod, undecided)
    return operator.allowed_capabilities if operator is not None else frozenset()
