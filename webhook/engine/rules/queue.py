"""Queue controllers beside the platform (Kueue, ``platform.queues``).

A queue admits a run the platform created suspended: it starts it (``spec.suspend``
false), places it on the flavor it chose (the flavor's node labels merged into the pod
templates' ``nodeSelector``, its tolerations appended), writes its own labels,
annotations and scheduling gates, sets ``parallelism`` on a partial admission, and on a
stop or a preemption suspends the run and restores the templates. Where the object
leaves a pod template to its operator's default (a RayJob's submitter in K8sJobMode),
Kueue writes that default, placed, into the object (``getSubmitterTemplate``): a bare
template of images the object already runs. ``queue_kept`` (``rules/queue_kept.py``)
says whether an update of the platform's object changed nothing else
(``ownership.changed`` reads it for the queue's own updates): what the run runs (images,
resources, security, volumes, env, accounts) is never the queue's.

The same changes by anyone else are a way around the queue: ``check_queue_bypass``
(``queue.bypassed``: unsuspending a queued run, changing its queue label, lifting the
queue's scheduling gate) and ``check_queue_labels`` (``queue.reserved-label``: the labels
the queue finds a run's Workload by).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.engine import scope, templates
from webhook.engine.context import Requester
from webhook.engine.rule import Declarations
from webhook.engine.rules import ownership
from webhook.engine.rules.queue_kept import owned
from webhook.engine.rules.queue_kept import queue_kept as queue_kept  # (trust's, the tests')
from webhook.engine.rules.queue_profile import PRIORITY_LABEL
from webhook.engine.rules.queue_profile import queue_label as queue_label_of
from webhook.engine.subject import Review
from webhook.engine.types import Violation
from webhook.keys import PLATFORM_RECORD
from webhook.policy.model import QueueController, RunPolicy

RULES = Declarations(__name__)
QUEUE_BYPASSED = RULES.rule(
    "queue.bypassed",
    mutation="",
    violation=(
        "on UPDATE of a queued run (it carries a queue's label, `platform.queues`), by someone "
        "else than the queue, the platform, its installers, controllers or operators: the run "
        "unsuspended, its queue label changed or removed, or one of the queue's scheduling "
        "gates removed (Kueue's `kueue.x-k8s.io/admission`)"
    ),
)
QUEUE_RESERVED_LABEL = RULES.rule(
    "queue.reserved-label",
    mutation="",
    violation=(
        "a queue's own label (`platform.queues[].reservedLabels`: Kueue's "
        "`kueue.x-k8s.io/podset`, `kueue.x-k8s.io/prebuilt-workload-name`) written, changed or "
        "removed on a run or in its pod templates by someone else than the queue, the platform, "
        "its installers, controllers or operators"
    ),
)

QUEUE_PRIORITY_CLASS = RULES.rule(
    "queue.priority-class",
    mutation="",
    violation=(
        "a run naming a Kueue priority class (label `kueue.x-k8s.io/priority-class`, on the "
        "object or a CronJob's job template) that its RunPolicy does not allow "
        "(`scheduling.workloadPriorityClasses`), at CREATE or written by an UPDATE"
    ),
)

QUEUE_KIND = RULES.rule(
    "queue.kind",
    mutation="",
    violation=(
        "at CREATE, a queue profile on a kind its queue does not hold as Kueue expects: a "
        "Deployment or StatefulSet whose pod template lacks the profile's queue label "
        "(Kueue's pod integration holds their Pods one by one by it), or a DaemonSet or "
        "bare ReplicaSet (no queue holds them); the message names what to use instead"
    ),
)
# Long-lived controllers Kueue's pod integration holds Pod by Pod, by their template's label.
_HELD_BY_POD = frozenset({"Deployment", "StatefulSet"})

_SERVICE_ACCOUNT_USER = "system:serviceaccount:"


def queue_of(policy: RunPolicy, requester: Requester | None) -> QueueController | None:
    """The queue controller of ``policy``'s platform the requester is, if any."""
    return next(
        (q for q in policy.platform.queues if ownership.is_identity((q.identity,), requester)),
        None,
    )


def changed_message(queue: QueueController | None, requester: Requester | None) -> str:
    """What ``ownership.changed`` adds for a queue's update that went beyond starting,
    stopping and placing the run, or for a controller runguard does not know."""
    if queue is not None:
        return (
            f"; {queue.identity} is a queue: it may start, stop and place the run "
            "(suspend, parallelism, nodeSelector keys, tolerations, its own labels, "
            "annotations and scheduling gates), never change what it runs"
        )
    if requester is not None and requester.username.startswith(_SERVICE_ACCOUNT_USER):
        return (
            f"; if {requester.username} is a controller acting for the platform, declare it: "
            "platform.queues for a queue that starts and stops runs (Kueue), "
            "platform.operators or platform.controllers for one that creates their Pods"
        )
    return ""


def _policy(r: Review) -> RunPolicy | None:
    """The RunPolicy whose queues judge the object: the governing one, else, on UPDATE,
    the one whose platform's record the old object carries (a RayJob the platform created)."""
    if r.governing is not None:
        return r.governing
    if r.old is None:
        return None
    templated = _templates_policy(r)
    if templated is not None:
        return templated
    old_spec = r.old_target.spec if r.old_target is not None else None
    owner = scope.recorder(r.root, r.old, old_spec, r.namespace, None, stored=True)
    if owner is None:
        return None
    annotations = ownership.string_map(r.old_metadata, "annotations")
    installed = annotations.get(PLATFORM_RECORD) == ownership.INSTALLER
    if installed or ownership.recorded_platform(owner, annotations, r.root):
        return owner
    return None


def _templates_policy(r: Review) -> RunPolicy | None:
    """The RunPolicy of the first run template of an operator's object as it was stored
    (a RayJob's head, workers, submitter: its run labels are there, not on the object)."""
    entry = templates.declared(r.old, r.root, r.namespace)
    if entry is None or not isinstance(r.old, dict):
        return None
    for _, target in templates.located(r.old, entry):
        governing = scope.choose(r.root, target.labels, r.namespace)
        if governing is not None:
            return governing
    return None


def _trusted(policy: RunPolicy, requester: Requester | None) -> bool:
    """The queue, the platform, its installers, or a controller or operator it declares."""
    if requester is None:
        return False
    if ownership.is_platform_or_installer(policy, requester):
        return True
    if requester.username in policy.platform.owner_kinds:
        return True
    return queue_of(policy, requester) is not None


def _queued_part(obj: Any) -> Any:
    """Where a run's queue records are: a CronJob's job template (the Jobs it makes copy
    them), else the object itself."""
    if isinstance(obj, dict) and obj.get("kind") == "CronJob":
        spec = obj.get("spec")
        template = spec.get("jobTemplate") if isinstance(spec, dict) else None
        return template if isinstance(template, dict) else {}
    return obj


def run_labels(obj: Any) -> Mapping[str, str]:
    """The labels a queue reads a run's queue and Kueue priority class from."""
    part = _queued_part(obj)
    metadata = part.get("metadata") if isinstance(part, dict) else None
    return ownership.string_map(metadata if isinstance(metadata, dict) else {}, "labels")


def _suspended(obj: Any) -> bool:
    part = _queued_part(obj)
    spec = part.get("spec") if isinstance(part, dict) else None
    if not isinstance(spec, dict):
        return False
    run_policy = spec.get("runPolicy")
    return spec.get("suspend") is True or (
        isinstance(run_policy, dict) and run_policy.get("suspend") is True
    )


def _gates(target: Any, prefixes: tuple[str, ...]) -> set[str]:
    gates = target.spec.get("schedulingGates") if target is not None else None
    return {
        g["name"]
        for g in (gates if isinstance(gates, list) else ())
        if isinstance(g, dict) and owned(g.get("name"), prefixes)
    }


def check_queue_bypass(r: Review) -> list[Violation]:
    """``queue.bypassed``: a queued run started, moved to another queue or out of every
    queue, or its Pod's queue gate lifted, by someone else than the queue (or the platform,
    its installers, controllers and operators): the run would use capacity no queue
    admitted or counted."""
    if r.old is None or not isinstance(r.obj, dict):
        return []
    policy = _policy(r)
    if policy is None or not policy.platform.queues or _trusted(policy, r.context.requester):
        return []
    old_labels, labels = run_labels(r.old), run_labels(r.obj)
    where = "spec.jobTemplate.metadata" if r.obj.get("kind") == "CronJob" else "metadata"
    out = []
    for queue in policy.platform.queues:
        key = queue.queue_label
        name = old_labels.get(key)
        if name is not None and labels.get(key) != name:
            out.append(
                Violation(
                    QUEUE_BYPASSED,
                    f"{where}.labels[{key}]",
                    f"the run waits in queue {name!r}: its queue label is the queue's and the "
                    "platform's to change, not removed or changed by an update",
                )
            )
        if name is not None and labels.get(PRIORITY_LABEL) != old_labels.get(PRIORITY_LABEL):
            out.append(
                Violation(
                    QUEUE_BYPASSED,
                    f"{where}.labels[{PRIORITY_LABEL}]",
                    f"the run waits in queue {name!r}: its Kueue priority class is the "
                    "queue's and the platform's to change, not written by an update",
                )
            )
        if name is not None and _suspended(r.old) and not _suspended(r.obj):
            out.append(
                Violation(
                    QUEUE_BYPASSED,
                    "spec.jobTemplate.spec.suspend" if where != "metadata" else "spec.suspend",
                    f"the run waits in queue {name!r}: only the queue starts it, when it admits it",
                )
            )
        for gate in sorted(_gates(r.old_target, queue.prefixes) - _gates(r.target, queue.prefixes)):
            out.append(
                Violation(
                    QUEUE_BYPASSED,
                    "spec.schedulingGates",
                    f"{gate} is the queue's scheduling gate: only the queue lifts it, when it "
                    "admits the Pod",
                )
            )
    return out


def check_queue_labels(r: Review) -> list[Violation]:
    """``queue.reserved-label``: the labels a queue finds a run's Workload by (Kueue's
    ``kueue.x-k8s.io/podset`` and ``prebuilt-workload-name``), written on a run or in its
    pod templates by someone else than the queue (or the platform, its installers,
    controllers and operators, who copy the templates the queue wrote)."""
    if not isinstance(r.obj, dict):
        return []
    policy = _policy(r)
    if policy is None or not policy.platform.queues or _trusted(policy, r.context.requester):
        return []
    reserved = tuple(label for q in policy.platform.queues for label in q.reserved_labels)
    if not reserved:
        return []
    before = dict(_labels(r.old, reserved, "")) if r.old is not None else {}
    after = dict(_labels(r.obj, reserved, ""))
    return [
        Violation(
            QUEUE_RESERVED_LABEL,
            path,
            f"{path.rpartition('[')[2].rstrip(']')} is the queue's label: only the queue and "
            "the platform write it",
        )
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]


def _labels(node: Any, reserved: tuple[str, ...], path: str) -> list[tuple[str, Any]]:
    """(path, value) of every reserved label in ``metadata.labels`` of the object and of
    every pod template in it (a Pod holds none: its own labels only)."""
    if not path and isinstance(node, dict) and node.get("kind") == "Pod":
        meta = node.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if not isinstance(labels, dict):
            return []
        return [(f"metadata.labels[{k}]", v) for k, v in labels.items() if owned(k, reserved)]
    out: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        meta = node.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if isinstance(labels, dict):
            prefix = f"{path}.metadata" if path else "metadata"
            out.extend(
                (f"{prefix}.labels[{k}]", v) for k, v in labels.items() if owned(k, reserved)
            )
        for key, value in node.items():
            if key != "metadata":
                out.extend(_labels(value, reserved, f"{path}.{key}" if path else key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out.extend(_labels(item, reserved, f"{path}[{i}]"))
    return out


def check_queue_kind(
    kind: str, labels: Mapping[str, str], spec_path: str, queue: str, policy: RunPolicy
) -> list[Violation]:
    """``queue.kind``: a queue profile (queue ``queue``) on a pod controller whose Pods
    would otherwise run unqueued (see the rule). Jobs, CronJobs, Pods and the operators'
    kinds are queued by ``/mutate`` itself."""
    if kind in ("Pod", "Job", "CronJob"):
        return []
    label = queue_label_of(policy)
    where = f"{spec_path.removesuffix('.spec')}.metadata.labels[{label}]"
    if kind in _HELD_BY_POD:
        if labels.get(label) == queue:
            return []
        return [
            Violation(
                QUEUE_KIND,
                where,
                f"a {kind} of a queue profile runs only queued: Kueue's pod integration holds "
                f"its Pods one by one by their label, so its pod template carries {label}: "
                f"{queue}; add it, or run the work as a Job",
            )
        ]
    return [
        Violation(
            QUEUE_KIND,
            where,
            f"no queue holds a {kind}: a queue profile is for a Job, a CronJob, a Pod, a "
            "Deployment or StatefulSet whose template names the queue, or an operator's run",
        )
    ]


def check_queue_priority_class(r: Review) -> list[Violation]:
    """``queue.priority-class``: a run naming a Kueue priority class its RunPolicy does not
    allow, at CREATE or when an update writes it (a class admitted before the policy
    changed may stay)."""
    policy = r.governing
    allowed = policy.scheduling.workload_priority_classes if policy is not None else None
    if allowed is None or not isinstance(r.obj, dict):
        return []
    wanted = run_labels(r.obj).get(PRIORITY_LABEL)
    if wanted is None or wanted in allowed:
        return []
    if r.old is not None and run_labels(r.old).get(PRIORITY_LABEL) == wanted:
        return []
    where = "spec.jobTemplate.metadata" if r.obj.get("kind") == "CronJob" else "metadata"
    return [
        Violation(
            QUEUE_PRIORITY_CLASS,
            f"{where}.labels[{PRIORITY_LABEL}]",
            f"Kueue priority class {wanted!r} is not allowed "
            f"({', '.join(sorted(allowed)) or 'none'})",
        )
    ]


QUEUE_CHECKS = (check_queue_bypass, check_queue_labels, check_queue_priority_class)
