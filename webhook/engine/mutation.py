"""The mutating webhook's path: ``mutate``, a run Pod patched (and at CREATE the pod
template of a run Job or CronJob, an operator object's declared templates), sent to its
queue, runguard's records written, the JSON Patch by diffing, and the receipt left for
``/validate``'s backstop (``webhook.engine.receipts``). Never denies.
"""

from __future__ import annotations

from typing import Any

from webhook.engine import scope, sizes, templates
from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.decide import (
    Who,
    decided,
    guarded,
    owner_references,
    record_changes,
    selected,
    steps_applied,
    with_spec,
)
from webhook.engine.diff import make_patch
from webhook.engine.pod import Pod, main_container
from webhook.engine.pod import warning as warning_text
from webhook.engine.podspec import Target
from webhook.engine.receipts import Receipts, backstop_key, state_version
from webhook.engine.rule import Declarations
from webhook.engine.rules import ownership
from webhook.engine.rules.growth import RESOURCES_SIZE_RECORD
from webhook.engine.rules.hardening import harden_debug_containers
from webhook.engine.rules.profile import PRIORITY_COMPUTED
from webhook.engine.rules.queue_profile import send_to_queue
from webhook.engine.shape import check_shape
from webhook.engine.subject import (
    Review,
    review,
)
from webhook.engine.types import JSON, Change, Decision
from webhook.policy.model import Policy

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


# The kinds whose pod template ``/mutate`` changes at CREATE: what a queue (Kueue) counts
# and what a scheduler reads is the stored template, so the profile goes there, once. Their
# Pods are then a fixed point of the steps (judged, nothing left to change). Long-lived
# controllers (Deployments, StatefulSets...) are judged by their template after mutation
# but never patched: ``kubectl apply`` of their manifest would take runguard's values back
# out of the template and roll every Pod; their Pods get the profile.
TEMPLATES_MUTATED = frozenset({"Job", "CronJob"})


TEMPLATE_REAPPLIED = Change(
    UPDATE_SPEC_KEPT,
    warning_text("the pod template is kept: the values runguard set at creation stay"),
)


@guarded
def mutate(  # noqa: C901
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
    Never denies.

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
    governing = r.policy
    if not scope.looked_at(r.root, r.namespace):
        return decided(obj, governing, namespace, applies=False, allowed=True)
    target, problems = selected(r)
    changes: list[Change] = []
    profile = None
    result = obj
    mutated: Pod | None = None  # the steps' Pod at CREATE, for the receipt
    if target is not None and not problems and target.kind == "Pod":
        hardened = _debug_containers_hardened(target, governing, r.old) if r.old else None
        if hardened is not None:
            spec, change = hardened
            result, changes = with_spec(obj, target, spec), [change]
        else:
            spec, pod, changes = steps_applied(target, governing, Who(r, governing))
            profile = pod.profile.title if pod.profile else None
            mutated = pod if r.old is None else None
            if spec == target.spec:
                changes = []  # steps that undid each other changed nothing
            elif r.old is not None:
                running = r.old.get("spec")
                if isinstance(running, dict):
                    for key in PRIORITY_COMPUTED:  # computed at creation, kept for its life
                        if key in running:
                            spec[key] = running[key]
                if spec != running:
                    spec, changes = target.spec, []
                else:
                    changes = [Change(UPDATE_SPEC_KEPT, warning_text(UPDATE_KEPT))]
            if changes:
                result = with_spec(obj, target, spec)
    elif target is not None and not problems and r.old is None and _template_mutated(r, target):
        # At CREATE only: an UPDATE leaves the template as sent, changed or not (no
        # rollout runguard did not ask for; a Job's template is immutable anyway).
        spec, mutated_template, changes = steps_applied(target, governing, Who(r, governing))
        profile = mutated_template.profile.name if mutated_template.profile else None
        if spec == target.spec:
            changes = []
        else:
            result = with_spec(obj, target, spec)
        result = _queued(result, target, mutated_template, r, changes)
        result = _sized(result, target.keys, mutated_template)
    elif target is not None and not problems and r.old_target and _template_mutated(r, target):
        # An UPDATE writes nothing new into the template. Only ``kubectl apply`` of the
        # manifest again, whose three-way merge re-sends the values runguard changed at
        # CREATE, is turned back into the stored template: unchanged, as a Job's must be.
        spec, _, _ = steps_applied(target, governing, Who(r, governing))
        if spec != target.spec and spec == r.old_target.spec:
            result, changes = _reapplied(obj, target, spec, r.old_target), [TEMPLATE_REAPPLIED]
    elif target is None and not r.invalid and r.old is None and isinstance(obj, dict):
        result, changes, profile = operator_templates(r, obj)
    if mutated is not None and isinstance(result, dict):
        result = _queued(result, target, mutated, r, changes)
        result = _unbelieved_record_removed(result, mutated, changes)
    if isinstance(result, dict) and not r.invalid and not problems:
        # (an object that cannot be understood is denied by /validate: nothing to record)
        result, recorded = record_changes(r, result)
        changes.extend(recorded)
    applies = r.governing is not None or bool(problems) or profile is not None
    if receipts is not None and mutated is not None:
        _leave_receipt(mutated, result, receipts, version)
    if result is obj:
        return decided(obj, governing, namespace, applies=applies, allowed=True)
    return _patched(obj, result, governing, namespace, changes, applies=applies, profile=profile)


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
    owners = owner_references(r.metadata)
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
        spec, pod, made = steps_applied(target, governing, Who(r, governing))
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


def _template_mutated(r: Review, target: Target) -> bool:
    """Whether ``/mutate`` writes the profile into this object's pod template."""
    return target.kind in TEMPLATES_MUTATED


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
    policy: Policy,
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


def _debug_containers_hardened(
    target: Target, policy: Policy, old: JSON
) -> tuple[JSON, Change] | None:
    """UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``): the ephemeral containers
    added, the only part of a running Pod's spec that may change, get their hardening and
    nothing else is patched. None when no container was added or none needs it."""
    running = old.get("spec")
    if not isinstance(running, dict):
        return None
    return harden_debug_containers(target.spec, running, policy)
