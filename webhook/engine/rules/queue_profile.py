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

from webhook.engine.context import Requester
from webhook.engine.pod import kept_change
from webhook.engine.rules.profile import PROFILE_APPLIED
from webhook.engine.rules.runtime import max_exec_time_label
from webhook.engine.types import JSON, Change
from webhook.policy.model import Policy, Profile

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's, when no platform.queues entry says
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# kind -> (keys to the metadata holding the queue's labels, keys to its suspend flag)
_QUEUED: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "Job": (("metadata",), ("spec", "suspend")),
    "CronJob": (("spec", "jobTemplate", "metadata"), ("spec", "jobTemplate", "spec", "suspend")),
    "Pod": (("metadata",), None),
}


def queue_label(policy: Policy) -> str:
    """The label naming a run's queue: the platform's queue controller's, else Kueue's."""
    queues = policy.platform.queues
    return queues[0].queue_label if queues else QUEUE_LABEL


def queue_labels(profile: Profile, policy: Policy) -> dict[str, str]:
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
    owner_references: tuple[Any, ...], policy: Policy, requester: Requester | None
) -> bool:
    """An object a controller or operator makes for its controller owner (a Job's Pod by
    the job-controller, a RayJob's RayCluster or submitter Job by KubeRay, a JobSet's
    Jobs): its owner is what the queue admits, so the object itself names no queue and is
    not suspended. Only the owner's own controller is believed: ``ownerReferences`` are
    anyone's to write, and a user's object naming a Job as its owner is queued itself."""
    if requester is None:
        return False
    owned = policy.platform.owner_kinds.get(requester.username)
    if not owned:
        return False
    kinds = {k.rpartition("/")[2] for k in owned}
    return any(
        isinstance(ref, dict) and ref.get("controller") is True and ref.get("kind") in kinds
        for ref in owner_references
    )


def send_to_queue(
    obj: JSON,
    kind: str,
    profile: Profile,
    policy: Policy,
    owner_references: tuple[Any, ...] = (),
    suspend: tuple[str, ...] | None = None,
    requester: Requester | None = None,
) -> tuple[JSON, Change | None]:
    """``obj`` with its queue profile's labels (and suspended, for a Job-like kind), and
    the change; ``obj`` itself and None when it has them already. ``suspend``: the keys to
    the suspend flag of an operator's kind (its entry's ``suspend``)."""
    labels = queue_labels(profile, policy)
    if kind in _QUEUED:
        where, suspend = _QUEUED[kind]
    else:
        where = ("metadata",)
    if not labels or queued_as_a_whole(owner_references, policy, requester):
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
    if not items:
        return obj, None
    return out, kept_change(PROFILE_APPLIED, f"profile {profile.name} queued", tuple(items))


def _copied(obj: JSON, keys: tuple[str, ...]) -> JSON:
    """The dict at ``keys`` below ``obj``, each level copied (created when absent)."""
    node = obj
    for key in keys:
        child = node.get(key)
        node[key] = dict(child) if isinstance(child, dict) else {}
        node = node[key]
    return node
