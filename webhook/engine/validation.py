"""The validating webhook's path: ``validate``, every violation of the object as it
arrives: the checks of any object, the trust checks, the run's checks on its (mutated)
pod spec, its owners, its queue, and the backstop of a Pod that skipped ``/mutate``
(``webhook.engine.backstop``, unless ``/mutate`` left its receipt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from webhook.engine import scope
from webhook.engine.backstop import has_receipt, not_queued, operator_not_mutated
from webhook.engine.backstop import not_mutated as _not_mutated  # (counted by test_receipts)
from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.decision import decided, deny, finish, guarded
from webhook.engine.mutation import steps_applied
from webhook.engine.paths import VALIDATION_PATHS, Path, Request, choose, request
from webhook.engine.pod import WARNING_LIMIT, Pod, spec_prefix
from webhook.engine.podspec import Target
from webhook.engine.receipts import Receipts
from webhook.engine.rules import not_a_run, ownership, podclaims, run_checks, stamp
from webhook.engine.rules.runtime import check_job_run_time
from webhook.engine.rules.trust import run_object_checks, run_trust_checks
from webhook.engine.subject import (
    Review,
    adopts,
    in_scope,
    names_platform_objects,
    review,
    stamps_owner,
)
from webhook.engine.types import Change, Decision, Violation
from webhook.policy.model import Policy, RunPolicy

# The warnings of a template kept as written say what its Pods will get, not what was
# done to the object.
TEMPLATE_KEPT = (
    "runguard: the pod template is kept as written; each Pod created from it is changed so:"
)


@dataclass
class Judgement:
    """One ``/validate`` as its path's checks leave it: what they found (the trust
    checks' apart: where they go differs by path), the warnings, the changes a template's
    Pods will get, the run's Pod judged, and the decision that ends the path."""

    q: Request
    r: Review
    namespace: str | None
    admitted: bool = False
    receipts: Receipts | None = None
    trust: list[Violation] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mutations: list[Change] = field(default_factory=list)
    pod: Pod | None = None
    decision: Decision | None = None

    @property
    def target(self) -> Target:
        assert self.q.run is not None, "a check of a run's path"
        return self.q.run

    def deny(self, found: list[Violation]) -> None:
        self.decision = deny(self.r.obj, self.r.policy, self.namespace, found)


Check = Callable[[Judgement], None]


@guarded
def validate(
    obj: Any,
    policy: Policy,
    *,
    namespace: str | None = None,
    old: Any = None,
    context: Context = NO_CONTEXT,
    governing: RunPolicy | None = None,
    admitted: bool = False,
    receipts: Receipts | None = None,
) -> Decision:
    """The validating webhook: every violation of the object as it arrives. The
    request's path (``webhook.engine.paths.VALIDATION_PATHS``) says which of ``CHECKS``
    run, in their order, until one decides.

    A pod controller is judged by its template *after* mutation, since that is what its
    pods will look like. On UPDATE (``old`` given), violations the old object already had
    are reported as warnings instead of denying, so labels and annotations of an existing
    object can still be edited; what trust over time forbids (leaving or changing the
    RunPolicy, rewriting owners or runguard's records) never is.

    ``admitted``: the object is already in the cluster (``runguard audit``), so a Pod
    carrying runguard's RunPolicy label went through ``/mutate``, and what mutation would
    still change is policy drift (the policy changed since), not a bypass.

    ``receipts``: the Pods ``mutate`` produced; the backstop's steps are not run again
    for one of them (``webhook.engine.receipts`` says why that changes no decision).
    """
    r = review(obj, policy, namespace, old, context, governing)
    j = Judgement(request(r), r, namespace, admitted, receipts)
    path = choose(VALIDATION_PATHS, j.q)
    for check in CHECKS[path]:
        check(j)
        if j.decision is not None:
            return j.decision
    raise AssertionError(f"the path {path} ends without a decision")


def _untouched(j: Judgement) -> None:
    j.decision = decided(j.r.obj, j.r.policy, j.namespace, applies=False, allowed=True)


def _reserved(j: Judgement) -> None:
    """What only the platform may create (``trust.OBJECT_CHECKS``): denied at once."""
    reserved = run_object_checks(j.r)
    if reserved:
        j.deny(reserved)


def _trust(j: Judgement) -> None:
    j.trust = run_trust_checks(j.r)


def _not_understood(j: Judgement) -> None:
    j.deny([*j.q.problems, *j.trust])


def _pod(j: Judgement) -> None:
    """A run's Pod, judged as it is."""
    j.pod = j.r.pod(j.target, j.r.policy, j.target.spec)


def _template(j: Judgement) -> None:
    """A run's pod template, judged after mutation: what its Pods will look like."""
    spec, j.pod, mutations = steps_applied(j.r, j.target, j.r.policy)
    if spec != j.target.spec:  # (else a template /mutate changed already, or nothing to)
        j.mutations = mutations
        j.warnings = [*([TEMPLATE_KEPT] if mutations else []), *(c.warning for c in mutations)]


def _run_checks(j: Judgement) -> None:
    """Every check of the run's Pod (``rules.CHECKS``)."""
    assert j.pod is not None
    j.violations.extend(run_checks(j.pod))


def _job_run_time(j: Judgement) -> None:
    """A run's Job bounded as a whole (``rules.runtime``)."""
    assert j.pod is not None
    j.violations.extend(check_job_run_time(j.r.obj, j.target.kind, j.target.keys, j.pod.profile))


def _queued(j: Judgement) -> None:
    if j.r.old is None and not j.admitted and isinstance(j.r.obj, dict):
        assert j.pod is not None
        j.violations.extend(not_queued(j.r.obj, j.target, j.pod, j.r))


def _mutated(j: Judgement) -> None:
    """The backstop of a Pod created without its receipt (``_not_mutated``)."""
    assert j.pod is not None
    if has_receipt(j.pod, j.receipts):
        return
    drifted = j.admitted and ownership.records(j.r.metadata)[2] == j.r.policy.name
    j.violations.extend(_not_mutated(j.r, j.target, j.r.policy, j.violations, drifted))


def _already_present_on_update(j: Judgement) -> None:
    """On UPDATE, what the old object already had (judged as if created) only warns."""
    if not j.violations:
        return
    governing = j.r.policy
    before = validate(j.r.old, j.r.root, namespace=j.namespace, governing=governing)
    known = {(v.rule, v.path): v.amount for v in before.violations}
    present = [v for v in j.violations if _already_present(v, known)]
    j.violations = [v for v in j.violations if not _already_present(v, known)]
    j.warnings.extend(
        f"runguard: allowed on update, already present: [{v.rule}] {v.path}"[:WARNING_LIMIT]
        for v in present
    )


def _run_decided(j: Judgement) -> None:
    assert j.pod is not None
    decision = decided(
        j.r.obj,
        j.r.policy,
        j.namespace,
        applies=True,
        allowed=True,
        violations=[*j.violations, *j.trust],
        profile=j.pod.profile.title if j.pod.profile else None,
        warnings=j.warnings,
        mutations=j.mutations,
    )
    j.decision = finish(decision, j.r.policy)


def _operator_backstop(j: Judgement) -> None:
    if j.r.old is None and not j.admitted:
        j.violations.extend(operator_not_mutated(j.r))


def _platform_objects(j: Judgement) -> None:
    """Not a run, yet naming the platform's objects (``_not_a_run``), or (on UPDATE)
    entering the scope of a platform (``_stamp_violations``)."""
    r = j.r
    if r.target is None:
        return
    j.violations.extend(_not_a_run(r))
    if r.old is not None and names_platform_objects(r):
        j.violations.extend(_stamp_violations(r))


def _outside_decided(j: Judgement) -> None:
    """Not a run: allowed untouched unless a check found something."""
    found = [*j.trust, *j.violations]
    if found:
        j.deny(found)
    else:
        _untouched(j)


_RUN = (_reserved, _trust)

# What each path judges, in order, until one decides (``webhook.engine.paths``).
CHECKS: dict[Path, tuple[Check, ...]] = {
    Path.OUTSIDE: (_untouched,),
    Path.NOT_UNDERSTOOD: (_reserved, _trust, _not_understood),
    Path.POD_CREATED: (*_RUN, _pod, _run_checks, _queued, _mutated, _run_decided),
    Path.POD_UPDATED: (*_RUN, _pod, _run_checks, _already_present_on_update, _run_decided),
    Path.TEMPLATE_CREATED: (*_RUN, _template, _run_checks, _job_run_time, _queued, _run_decided),
    Path.TEMPLATE_UPDATED: (
        *_RUN,
        _template,
        _run_checks,
        _job_run_time,
        _already_present_on_update,
        _run_decided,
    ),
    Path.NOT_A_RUN: (_reserved, _trust, _operator_backstop, _platform_objects, _outside_decided),
}


def _not_a_run(r: Review) -> list[Violation]:
    assert r.target is not None
    found: list[Violation] = []
    for policy in scope.platforms(r.root, r.namespace):  # each by its own exclusions
        platform_made = r.ownership(policy)
        violations = not_a_run.check_not_a_run(
            r.target.spec, r.target.spec_path, platform_made, policy
        )
        if violations and r.old_target is not None:
            # On UPDATE a reference the old object already had is not new: the object was
            # admitted with it (a controller removing its finalizer must go through).
            had = {(k, n) for k, n, _ in ownership.platform_references(r.old_target.spec, policy)}
            now = ownership.platform_references(r.target.spec, policy)
            fresh = {path for k, n, path in now if (k, n) not in had}
            prefix = spec_prefix(r.target.spec_path)
            violations = [v for v in violations if v.path.removeprefix(prefix) in fresh]
        violations += podclaims.check_pod_claims(r, policy, platform_made)
        found.extend(v for v in violations if v not in found)
    return found


def _already_present(v: Violation, known: dict[tuple[str, str], Decimal | None]) -> bool:
    """The old object had this violation, and (for an amount) at least as much of it."""
    if (v.rule, v.path) not in known:
        return False
    before = known[(v.rule, v.path)]
    return v.amount is None or (before is not None and v.amount <= before)


def _stamp_violations(r: Review) -> list[Violation]:
    """On UPDATE: no object entering the scope of a platform (the first whose objects
    it names, by ``scope.recorder``)."""
    owner = stamps_owner(r)
    if owner is None:
        return []
    return stamp.check_stamp(
        r.metadata, r.old_metadata or {}, in_scope(r), owner, r.context, adopts(r) is not None
    )
