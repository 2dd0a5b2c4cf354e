"""The backstop: ``/validate`` judges what ``/mutate`` would still change.

A run created past ``/mutate`` (its webhook bypassed, misordered, or failing with a
policy of Ignore) is allowed only if mutating it would change nothing: each change the
mutation would still make is a violation under its own rule id. These are the only
checks that run ``/mutate``'s steps (``mutation.steps_applied``) and helpers
(``mutation.operator_templates``, ``rules.queue_profile.send_to_queue``); the paths of
``webhook.engine.validation`` list them where they apply (at CREATE).
"""

from __future__ import annotations

from webhook.engine.mutation import TEMPLATES_MUTATED, operator_templates, steps_applied
from webhook.engine.pod import Pod
from webhook.engine.podspec import Target
from webhook.engine.receipts import Receipts, backstop_key
from webhook.engine.rules.queue import check_queue_kind
from webhook.engine.rules.queue_profile import send_to_queue
from webhook.engine.subject import Review
from webhook.engine.types import JSON, Change, Violation
from webhook.policy.model import RunPolicy

__all__ = ["has_receipt", "not_mutated", "not_queued", "operator_not_mutated"]


def _bypassed(change: Change, path: str) -> Violation:
    """What ``/mutate`` would still do under ``change``'s rule, at ``path``."""
    return Violation(
        change.rule,
        path,
        f"not applied: {change.warning.removeprefix('runguard: ')} "
        "(runguard's mutating webhook does this: was it bypassed?)",
        backstop=True,
    )


def _drifted(change: Change, path: str) -> Violation:
    """What the policy now does under ``change``'s rule to a Pod runguard admitted."""
    return Violation(
        change.rule,
        path,
        f"policy drift: the policy now does {change.warning.removeprefix('runguard: ')}; "
        "runguard admitted this Pod before the policy changed (recreate it to apply "
        "the current policy)",
        drift=True,
    )


def not_queued(obj: JSON, target: Target, pod: Pod, r: Review) -> list[Violation]:
    """The backstop of a queue profile: a run created without its queue's label (or, a
    Job-like one, not suspended) skipped ``/mutate``, and would start unqueued."""
    if pod.profile is None or pod.profile.queue is None:
        return []
    if target.kind not in ("Pod", *TEMPLATES_MUTATED):
        name = pod.profile.queue.name
        return check_queue_kind(target.kind, target.labels, target.spec_path, name, pod.policy)
    owners = r.owner_references
    requester = r.context.requester
    _, change = send_to_queue(
        obj, target.kind, pod.profile, pod.policy, owners, None, requester, r.context.state
    )
    return [] if change is None else [_bypassed(change, "metadata.labels")]


def operator_not_mutated(r: Review) -> list[Violation]:
    """The backstop of an operator's object (a RayJob, a PyTorchJob...): created without
    the profile in its run templates, or without its queue's label and suspend, it
    skipped ``/mutate`` and would run unsized or unqueued. Each change ``/mutate`` would
    make is a violation under its own rule id."""
    if not isinstance(r.obj, dict):
        return []
    result, changes, _ = operator_templates(r, r.obj)
    if result is r.obj or result == r.obj:
        return []
    return [_bypassed(c, "spec") for c in changes]


def has_receipt(pod: Pod, receipts: Receipts | None) -> bool:
    """``mutate`` produced this Pod (``webhook.engine.receipts``): nothing left to change."""
    return receipts is not None and backstop_key(pod) in receipts


def not_mutated(
    r: Review, target: Target, policy: RunPolicy, found: list[Violation], drifted: bool = False
) -> list[Violation]:
    """Validation is a complete backstop of mutation: a Pod created
    without passing through ``/mutate`` (webhook bypassed, misordered, or a failure
    policy of Ignore) is allowed only if mutating it would change nothing. Each step
    that would still change something is a violation under its own rule id, unless a
    check already reported a violation of that concern (``security``, ``resources``...),
    which says the same thing more precisely. ``drifted``: a Pod runguard admitted
    (``runguard audit``), which the policy has changed under since."""
    spec, _, changes = steps_applied(r, target, policy)
    if spec == target.spec:
        return []
    reported = {v.rule.partition(".")[0] for v in found}
    judged = _drifted if drifted else _bypassed
    return [
        judged(c, target.spec_path) for c in changes if c.rule.partition(".")[0] not in reported
    ]
