"""A queue profile (``profile.queue``): the run goes to a Kueue LocalQueue, which places it.

``/mutate`` writes the queue's label (and the WorkloadPriorityClass's) where Kueue reads
it, at CREATE: on a Job, on a CronJob's job template (the Jobs it makes copy it), on a bare
Pod or a Pod of a long-lived controller (Kueue's Pod integration counts those one by one),
on an operator's object (``platform.operators[].templates`` says where it is suspended),
never on an object whose controller is queued as a whole (a Job's Pod, a RayJob's
RayCluster). A Job-like
object is also created suspended: Kueue's own webhook suspends an object that has the
label when it runs, but it runs before runguard's (configurations are called in name
order), so the label runguard adds would otherwise start the run unqueued. With both, the
order of the webhooks does not matter.
"""

from __future__ import annotations

from typing import Any

from webhook.engine.context import ClusterView, Requester
from webhook.engine.pod import kept_change
from webhook.engine.rules.profile import PROFILE_APPLIED
from webhook.engine.rules.runtime import max_exec_time_label
from webhook.engine.types import JSON, Change
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Profile, RunPolicy

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's, when no platform.queues entry says
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kueue's scheduling gate on a Pod it holds (its Pod integration): lifted when admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# Owners whose objects a queue holds one by one, never the owner as a whole.
NOT_HELD_WHOLE = frozenset({"CronJob", "ReplicaSet", "Deployment", "StatefulSet", "DaemonSet"})
# kind -> (keys to the metadata holding the queue's labels, keys to its suspend flag)
_QUEUED: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "Job": (("metadata",), ("spec", "suspend")),
    "CronJob": (("spec", "jobTemplate", "metadata"), ("spec", "jobTemplate", "spec", "suspend")),
    "Pod": (("metadata",), None),
}


def queue_label(policy: RunPolicy) -> str:
    """The label naming a run's queue: the platform's queue controller's, else Kueue's."""
    queues = policy.platform.queues
    return queues[0].queue_label if queues else QUEUE_LABEL


def queue_labels(profile: Profile, policy: RunPolicy) -> dict[str, str]:
    """The labels a run of the queue profile ``profile`` carries."""
    queue = profile.queue
    if queue is None:
        return {}
    labels = {queue_label(policy): queue.name}
    if queue.priority_class is not None:
        labels[PRIORITY_LABEL] = queue.priority_class
    labels.update(max_exec_time_label(profile))
    return labels


def queued_as_a_whole(
    owner_references: tuple[Any, ...],
    policy: RunPolicy,
    requester: Requester | None,
    cluster: ClusterView | None = None,
) -> bool:
    """An object a controller or operator makes for its controller owner (a Job's Pod by
    the job-controller, a RayJob's RayCluster or submitter Job by KubeRay, a JobSet's
    Jobs): its owner is what the queue admits, so the object itself names no queue and is
    not suspended. Believed only when all hold: the owner's own controller makes it
    (``ownerReferences`` are anyone's to write); the owner is of a kind a queue holds
    whole (not a CronJob, whose Jobs Kueue holds one by one, nor a ReplicaSet or
    StatefulSet, whose Pods its pod integration holds one by one); and the owner's stored
    object (``cluster``, by uid) carries its queue label and runguard's RunPolicy record.
    Otherwise the object is queued itself."""
    if requester is None or cluster is None:
        return False
    owned = policy.platform.owner_kinds.get(requester.username)
    if not owned:
        return False
    kinds = {k.rpartition("/")[2] for k in owned} - NOT_HELD_WHOLE
    label = queue_label(policy)
    for ref in owner_references:
        if not isinstance(ref, dict) or ref.get("controller") is not True:
            continue
        if ref.get("kind") not in kinds:
            continue
        stored = cluster.by_uid(str(ref.get("uid")))
        if (
            stored is not None
            and stored.kind.rpartition("/")[2] == ref.get("kind")
            and stored.labels.get(label)
            and stored.labels.get(POLICY_LABEL)
        ):
            return True
    return False


def send_to_queue(
    obj: JSON,
    kind: str,
    profile: Profile,
    policy: RunPolicy,
    owner_references: tuple[Any, ...] = (),
    suspend: tuple[str, ...] | None = None,
    requester: Requester | None = None,
    cluster: ClusterView | None = None,
) -> tuple[JSON, Change | None]:
    """``obj`` with its queue profile's labels (and suspended, for a Job-like kind; a Pod
    gated with Kueue's admission gate), and the change; ``obj`` itself and None when it
    has them already. ``suspend``: the keys to the suspend flag of an operator's kind (its
    entry's ``suspend``); ``cluster``: where an owner's stored object is found."""
    labels = queue_labels(profile, policy)
    if kind in _QUEUED:
        where, suspend = _QUEUED[kind]
    else:
        where = ("metadata",)
    if not labels or queued_as_a_whole(owner_references, policy, requester, cluster):
        return obj, None
    out = dict(obj)
    node = _copied(out, where)
    current = node.get("labels")
    current = dict(current) if isinstance(current, dict) else {}
    items = [f"label {k}={v}" for k, v in labels.items() if current.get(k) != v]
    current.update(labels)
    node["labels"] = current
    if suspend is not None:
        parent = _copied(out, suspend[:-1])
        if parent.get(suspend[-1]) is not True:
            parent[suspend[-1]] = True
            items.append(f"{'.'.join(suspend)} true")
    if kind == "Pod" and _gated(out):
        items.append(f"schedulingGate {ADMISSION_GATE}")
    if not items:
        return obj, None
    return out, kept_change(PROFILE_APPLIED, f"profile {profile.name} queued", tuple(items))


def _gated(pod: JSON) -> bool:
    """A Pod held by Kueue's admission gate, added when missing (as Kueue's own webhook
    does for a Pod it manages): held even where that webhook ran first and is not called
    again. Whether a gate was added."""
    spec = _copied(pod, ("spec",))
    gates = spec.get("schedulingGates")
    gates = list(gates) if isinstance(gates, list) else []
    if any(isinstance(g, dict) and g.get("name") == ADMISSION_GATE for g in gates):
        return False
    spec["schedulingGates"] = [*gates, {"name": ADMISSION_GATE}]
    return True


def _copied(obj: JSON, keys: tuple[str, ...]) -> JSON:
    """The dict at ``keys`` below ``obj``, each level copied (created when absent)."""
    node = obj
    for key in keys:
        child = node.get(key)
        node[key] = dict(child) if isinstance(child, dict) else {}
        node = node[key]
    return node
