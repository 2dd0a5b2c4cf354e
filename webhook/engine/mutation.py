"""The mutating webhook's path: ``mutate``, a run Pod patched (and at CREATE the pod
template of a run Job or CronJob, an operator object's declared templates), sent to its
queue, runguard's records written, the JSON Patch by diffing, and the receipt left for
``/validate``'s backstop (``webhook.engine.receipts``). Never denies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webhook.engine import scope, sizes, templates
from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.decision import decided, guarded
from webhook.engine.diff import make_patch
from webhook.engine.paths import MUTATION_PATHS, TEMPLATES_MUTATED, Path, Request, choose, request
from webhook.engine.pod import Pod, copy_json, main_container
from webhook.engine.pod import warning as warning_text
from webhook.engine.podspec import Target
from webhook.engine.receipts import Receipts, backstop_key, state_version
from webhook.engine.records import record_changes
from webhook.engine.rule import Declarations
from webhook.engine.rules import ownership, run_steps
from webhook.engine.rules.growth import RESOURCES_SIZE_RECORD
from webhook.engine.rules.profile import PRIORITY_COMPUTED
from webhook.engine.rules.queue_profile import send_to_queue
from webhook.engine.rules.runtime import bound_job
from webhook.engine.shape import check_shape
from webhook.engine.subject import (
    Review,
    review,
)
from webhook.engine.types import JSON, Change, Decision
from webhook.policy.model import Policy, RunPolicy

__all__ = [
    "STEPS",
    "TEMPLATES_MUTATED",
    "Mutation",
    "mutate",
    "operator_templates",
    "steps_applied",
    "with_spec",
]

RULES = Declarations(__name__)
UPDATE_SPEC_KEPT = RULES.rule(
    "update.spec-kept",
    mutation=(
        "on UPDATE, a Pod's running spec or a Job's or CronJob's stored pod template put back "
        "(`kubectl apply` of the same manifest)"
    ),
    violation="",
)


UPDATE_KEPT = "a running pod's spec cannot change: kept the values runguard set at creation"


TEMPLATE_REAPPLIED = Change(
    UPDATE_SPEC_KEPT,
    warning_text("the pod template is kept: the values runguard set at creation stay"),
)


@dataclass
class Mutation:
    """One ``/mutate`` as its path's steps leave it: the object as patched so far
    (``result``), the changes made, the profile applied, and the steps' Pod (``pod``:
    what the queue, the size record and the receipt are made of)."""

    q: Request
    r: Review
    result: Any
    namespace: str | None
    receipts: Receipts | None = None
    version: str | None = None  # the cluster view before the steps ran, for the receipt
    changes: list[Change] = field(default_factory=list)
    profile: str | None = None
    pod: Pod | None = None

    @property
    def target(self) -> Target:
        assert self.q.run is not None, "a step of a run's path"
        return self.q.run

    def steps_applied(self) -> tuple[JSON, Pod, list[Change]]:
        """The mutation steps run on a copy of the run's pod spec, by its RunPolicy."""
        return steps_applied(self.r, self.target, self.r.policy)


Step = Callable[[Mutation], None]


@guarded
def mutate(
    obj: Any,
    policy: Policy,
    *,
    namespace: str | None = None,
    old: Any = None,
    context: Context = NO_CONTEXT,
    receipts: Receipts | None = None,
) -> Decision:
    """The mutating webhook: patch a run Pod, and at CREATE the pod template of a run Job
    or CronJob (``TEMPLATES_MUTATED``: what a queue counts), and write runguard's records.
    Never denies. The request's path (``webhook.engine.paths.MUTATION_PATHS``) says which
    of ``STEPS`` run, in their order.

    On UPDATE (``old`` given) a Pod's spec is immutable, so the patch is kept only when
    it turns the spec back into the running one: that is ``kubectl apply`` of the
    user's manifest again, whose three-way merge re-sends the values runguard changed
    at creation. Any other change (a policy edited since) is not made on UPDATE, which
    would make the apiserver refuse unrelated updates such as a finalizer removal.
    runguard's records (stamp, platform record, governing RunPolicy) are put back as
    they were: a controller copying its parent's annotations cannot change them.

    ``receipts``: where to leave the receipt of a Pod created here, for ``validate``'s
    backstop (``webhook.engine.receipts``).
    """
    version = state_version(context) if receipts is not None else None
    r = review(obj, policy, namespace, old, context)
    q = request(r)
    path = choose(MUTATION_PATHS, q)
    m = Mutation(q, r, obj, namespace, receipts, version)
    for step in STEPS[path]:
        step(m)
    applies = path != Path.OUTSIDE and (
        r.governing is not None or bool(q.problems) or m.profile is not None
    )
    if m.result is obj:
        return decided(obj, r.policy, namespace, applies=applies, allowed=True)
    return _patched(
        obj, m.result, r.policy, namespace, m.changes, applies=applies, profile=m.profile
    )


def _pod_created(m: Mutation) -> None:
    """A run's Pod at CREATE: the steps' spec."""
    spec, m.pod, changes = m.steps_applied()
    m.profile = m.pod.profile.title if m.pod.profile else None
    if spec != m.target.spec and changes:  # (steps that undid each other changed nothing)
        m.result, m.changes = with_spec(m.result, m.target, spec), changes


def _pod_updated(m: Mutation) -> None:
    """A run's Pod on UPDATE: the steps' spec only when it is the running one again
    (``kubectl apply`` of the same manifest), with the priority computed at creation."""
    spec, pod, _ = m.steps_applied()
    m.profile = pod.profile.title if pod.profile else None
    if spec == m.target.spec:
        return
    running = m.r.old.get("spec") if m.r.old is not None else None
    if isinstance(running, dict):
        for key in PRIORITY_COMPUTED:  # computed at creation, kept for its life
            if key in running:
                spec[key] = running[key]
    if spec == running:
        m.result = with_spec(m.result, m.target, spec)
        m.changes = [Change(UPDATE_SPEC_KEPT, warning_text(UPDATE_KEPT))]


def _debug_containers(m: Mutation) -> None:
    """``kubectl debug``'s containers hardened, and nothing else patched."""
    assert m.q.debug_hardened is not None
    spec, change = m.q.debug_hardened
    m.result, m.changes = with_spec(m.result, m.target, spec), [change]


def _template_created(m: Mutation) -> None:
    """A run's Job or CronJob at CREATE: the profile written into its template. (An
    UPDATE leaves the template as sent: no rollout runguard did not ask for.)"""
    spec, m.pod, changes = m.steps_applied()
    m.profile = m.pod.profile.name if m.pod.profile else None
    if spec != m.target.spec:
        m.result, m.changes = with_spec(m.result, m.target, spec), changes


def _template_reapplied(m: Mutation) -> None:
    """A run's Job or CronJob on UPDATE writes nothing new into the template. Only
    ``kubectl apply`` of the manifest again, whose three-way merge re-sends the values
    runguard changed at CREATE, is turned back into the stored template: unchanged, as a
    Job's must be."""
    spec, _, _ = m.steps_applied()
    stored = m.r.old_target
    assert stored is not None
    if spec != m.target.spec and spec == stored.spec:
        m.result = _reapplied(m.result, m.target, spec, stored)
        m.changes = [TEMPLATE_REAPPLIED]


def _operator_object(m: Mutation) -> None:
    m.result, m.changes, m.profile = operator_templates(m.r, m.result)


def _job_bounded(m: Mutation) -> None:
    """A run's Job bounded as a whole (``rules.runtime``): its retries too."""
    assert m.pod is not None
    m.result, change = bound_job(m.result, m.target.kind, m.target.keys, m.pod.profile)
    if change is not None:
        m.changes.append(change)


def _sent_to_queue(m: Mutation) -> None:
    assert m.pod is not None
    m.result = _queued(m.result, m.target, m.pod, m.r, m.changes)


def _size_recorded(m: Mutation) -> None:
    assert m.pod is not None
    m.result = _sized(m.result, m.target.keys, m.pod)


def _size_record_believed(m: Mutation) -> None:
    assert m.pod is not None
    m.result = _unbelieved_record_removed(m.result, m.pod, m.changes)


def _records(m: Mutation) -> None:
    """runguard's records written (what cannot be understood is denied by /validate:
    its path records nothing)."""
    if isinstance(m.result, dict):
        m.result, recorded = record_changes(m.r, m.result)
        m.changes.extend(recorded)


def _receipt(m: Mutation) -> None:
    if m.receipts is not None and m.pod is not None and isinstance(m.result, dict):
        _leave_receipt(m.pod, m.result, m.receipts, m.version)


# What each path does, in order (``webhook.engine.paths``).
STEPS: dict[Path, tuple[Step, ...]] = {
    Path.OUTSIDE: (),
    Path.NOT_UNDERSTOOD: (),
    Path.POD_CREATED: (_pod_created, _sent_to_queue, _size_record_believed, _records, _receipt),
    Path.DEBUG_CONTAINERS: (_debug_containers, _records),
    Path.POD_UPDATED: (_pod_updated, _records),
    Path.TEMPLATE_CREATED: (
        _template_created,
        _job_bounded,
        _sent_to_queue,
        _size_recorded,
        _records,
    ),  # fmt: skip
    Path.TEMPLATE_REAPPLIED: (_template_reapplied, _records),
    Path.TEMPLATE_KEPT: (_records,),
    Path.OPERATOR_OBJECT: (_operator_object, _records),
    Path.NOT_A_RUN: (_records,),
}


def steps_applied(r: Review, target: Target, policy: RunPolicy) -> tuple[JSON, Pod, list[Change]]:
    """The mutation steps run on a copy of the pod spec of ``target`` (the run of ``r``),
    by ``policy``: the spec they leave, their Pod, and what they changed."""
    pod = r.pod(target, policy, copy_json(target.spec))
    changes = run_steps(pod)
    return pod.spec, pod, changes


def with_spec(obj: JSON, target: Target, spec: JSON) -> JSON:
    """A copy of ``obj`` whose pod spec is ``spec`` (shares untouched subtrees read-only)."""
    out = dict(obj)
    node = out
    for key in target.keys:
        node[key] = dict(node[key])
        node = node[key]
    node["spec"] = spec
    return out


def _queued(
    result: JSON,
    target: Any,
    pod: Pod,
    r: Review,
    changes: list[Change],
    suspend: tuple[str, ...] | None = None,
) -> JSON:
    """At CREATE, a run of a queue profile sent to its queue (``rules.queue_profile``)."""
    if pod.profile is None or pod.profile.queue is None or target is None:
        return result
    owners = r.owner_references
    context = r.context
    result, change = send_to_queue(
        result, target.kind, pod.profile, pod.policy, owners, suspend, context.requester,
        context.state,
    )  # fmt: skip
    if change is not None:
        changes.append(change)
    return result


def operator_templates(r: Review, obj: JSON) -> tuple[JSON, list[Change], str | None]:
    """At CREATE, an operator's object with the profile in each pod template its entry
    declares (``platform.operators[].templates``) that is a run's (each by the RunPolicy
    its labels choose), sent to its queue when a template names a queue profile: the
    object, the changes, and the first profile applied."""
    entry = templates.declared(obj, r.root, r.namespace)
    if entry is None:
        return obj, [], None
    result, profile = obj, None
    changes: list[Change] = []
    queued: tuple[Target, Pod] | None = None
    for keys, target in templates.located(obj, entry):
        governing = scope.choose(
            r.root,
            target.labels,
            r.namespace,
            lambda p: ownership.requested_by(p, r.metadata, r.namespace, r.context),
        )
        if governing is None or check_shape(target.spec, target.spec_path):
            continue  # not a run's, or not understood: its Pods are judged
        spec, pod, made = steps_applied(r, target, governing)
        profile = profile or (pod.profile.name if pod.profile else None)
        if spec != target.spec:
            result = templates.with_spec(result, keys, spec)
            changes.extend(c for c in made if c not in changes)
        result = _sized(result, keys, pod)
        if queued is None and pod.profile is not None and pod.profile.queue is not None:
            queued = target, pod
    if queued is not None:
        result = _queued(result, queued[0], queued[1], r, changes, entry.suspend_steps)
    return result, changes, profile


def _reapplied(obj: JSON, target: Target, spec: JSON, stored: Target) -> JSON:
    """``obj`` with the stored template's spec and size record: ``kubectl apply`` of a
    manifest that never had runguard's values, turned back into the stored template."""
    result = with_spec(obj, target, spec)
    kept = stored.annotations.get(sizes.SIZE_RECORD)
    return result if kept is None else sizes.with_record(result, target.keys, kept)


def _sized(result: JSON, keys: tuple[str | int, ...], pod: Pod) -> JSON:
    """At CREATE, the template at ``keys`` with the record of the size its profile gave
    (``webhook.engine.sizes``): its Pods are judged against it, never re-sized."""
    if pod.profile is None or not pod.spec.get("containers"):
        return result
    return sizes.with_record(result, keys, sizes.record(pod.profile, main_container(pod)))


def _unbelieved_record_removed(result: JSON, pod: Pod, changes: list[Change]) -> JSON:
    """At CREATE, a Pod's size record runguard did not write, removed
    (``webhook.engine.sizes``): judged by it later, it would be the user's own size."""
    if sizes.SIZE_RECORD not in pod.annotations or sizes.believed(pod):
        return result
    metadata = dict(result.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(sizes.SIZE_RECORD, None)
    metadata["annotations"] = annotations
    changes.append(
        Change(RESOURCES_SIZE_RECORD, warning_text("size record removed: not runguard's"))
    )
    return {**result, "metadata": metadata}


def _leave_receipt(pod: Pod, result: JSON, receipts: Receipts, version: str | None) -> None:
    """The receipt of the Pod ``mutate`` returns: the steps' inputs with their result
    (``pod.spec``) and the labels and annotations it has now (runguard's records), when
    the cluster view did not move while the steps ran. Whatever else ``validate`` would
    see differently (another governing RunPolicy, other ownership) gives another key: a
    miss."""
    metadata = result.get("metadata")
    if not isinstance(metadata, dict):
        return
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    key = backstop_key(pod, version, labels=labels, annotations=annotations)
    if key is not None:
        receipts.add(key)


def _patched(
    obj: Any,
    result: JSON,
    policy: RunPolicy,
    namespace: str | None,
    changes: list[Change],
    *,
    applies: bool = True,
    profile: str | None = None,
) -> Decision:
    """A mutation's decision: ``result``, the JSON Patch to it and a warning per change."""
    return decided(
        result,
        policy,
        namespace,
        applies=applies,
        allowed=True,
        patch=make_patch(obj, result),
        warnings=[c.warning for c in changes],
        mutations=changes,
        profile=profile,
    )
