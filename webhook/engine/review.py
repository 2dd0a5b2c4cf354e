"""The engine's entry points: ``mutate``, ``validate`` and ``evaluate`` (mutate, then validate).

Pure and total: any input, however malformed, becomes a ``Decision``. An object that
cannot be understood is denied with ``input.invalid``; an exception inside a step is a
bug in runguard, not in the input: it is denied as ``engine.error`` with the exception
in ``Decision.error`` for the server to log and count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from typing import Any, ParamSpec

from webhook.engine import scope, templates
from webhook.engine.context import NO_CONTEXT, Context, Ownership
from webhook.engine.diff import make_patch
from webhook.engine.pod import WARNING_LIMIT, Pod, copy_json, spec_prefix
from webhook.engine.pod import warning as warning_text
from webhook.engine.podspec import Target, object_meta
from webhook.engine.receipts import LocalReceipts, Receipts, backstop_key, state_version
from webhook.engine.rule import Declarations
from webhook.engine.rules import not_a_run, ownership, podclaims, run_checks, run_steps, stamp
from webhook.engine.rules.debug import check_shell
from webhook.engine.rules.profile import PRIORITY_COMPUTED
from webhook.engine.rules.queue_profile import send_to_queue
from webhook.engine.rules.security import harden_debug_containers
from webhook.engine.rules.stamp import OWNERSHIP_STAMP
from webhook.engine.rules.trust import run_object_checks, run_trust_checks
from webhook.engine.shape import check_shape
from webhook.engine.subject import (
    Review,
    adopts,
    expected_records,
    in_scope,
    names_platform_objects,
    review,
    stamps_owner,
)
from webhook.engine.types import INVALID, JSON, Change, Decision, Violation
from webhook.keys import POLICY_LABEL, REQUESTED_BY
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
# A bug in runguard: denied (fail closed), logged with its traceback, counted.
ENGINE_ERROR = RULES.rule(
    "engine.error",
    mutation="",
    violation="a bug in runguard (always denied, logged with its traceback, counted)",
)

P = ParamSpec("P")
UPDATE_KEPT = "a running pod's spec cannot change: kept the values runguard set at creation"
# The kinds whose pod template ``/mutate`` changes at CREATE: what a queue (Kueue) counts
# and what a scheduler reads is the stored template, so the profile goes there, once. Their
# Pods are then a fixed point of the steps (judged, nothing left to change). Long-lived
# controllers (Deployments, StatefulSets...) are judged by their template after mutation
# but never patched: ``kubectl apply`` of their manifest would take runguard's values back
# out of the template and roll every Pod; their Pods get the profile.
TEMPLATES_MUTATED = frozenset({"Job", "CronJob"})
# The warnings of a template kept as written say what its Pods will get, not what was
# done to the object.
TEMPLATE_KEPT = (
    "runguard: the pod template is kept as written; each Pod created from it is changed so:"
)
TEMPLATE_REAPPLIED = Change(
    UPDATE_SPEC_KEPT,
    warning_text("the pod template is kept: the values runguard set at creation stay"),
)
STAMPED = Change(OWNERSHIP_STAMP, warning_text(f"stamped {REQUESTED_BY}"))
RECORDS_KEPT = Change(
    OWNERSHIP_STAMP,
    warning_text("runguard's records (who created it, its RunPolicy) cannot change: kept"),
)
_ALWAYS_DENIED = frozenset({INVALID, ENGINE_ERROR})
# Who may use the platform's objects and accounts, and which RunPolicy governs an object,
# are enforced whatever ``enforcement`` says: Warn and Audit roll out limits and hardening
# a run may trip over, while a warning would not take back a secret, a token or a run
# that left its RunPolicy. (An installation rolling out ownership leaves
# ``platform.identities`` unset until it is ready: names then decide.)
_ALWAYS_DENIED_CONCERNS = frozenset({"ownership", "scope"})


def _decision(obj: Any, policy: Policy, namespace: str | None, **fields: Any) -> Decision:
    kind, ns, name = object_meta(obj)
    return Decision(
        kind=kind,
        namespace=namespace or ns,
        name=name,
        object=obj if isinstance(obj, dict) else {},
        enforcement=policy.enforcement,
        **fields,
    )


def _select(r: Review) -> tuple[Target | None, list[Violation]]:
    """The pod template when the object is a run its RunPolicy governs, else None."""
    if r.invalid:
        return None, r.invalid
    if r.target is None or r.governing is None:
        return None, []
    return r.target, check_shape(r.target.spec, r.target.spec_path)


def _pod(target: Target, policy: Policy, spec: JSON, who: _Who) -> Pod:
    return Pod(
        spec,
        target.labels,
        target.annotations,
        policy,
        target.spec_path,
        target.claim_templates,
        who.namespace,
        who.context,
        who.ownership,
        _owner_references(who.metadata),
        who.root,
    )


def _owner_references(metadata: JSON) -> tuple[Any, ...]:
    refs = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    return tuple(refs) if isinstance(refs, list) else ()


class _Who:
    """Where the object lives, who asks, and whether the platform created it."""

    def __init__(self, r: Review, policy: Policy):
        self.namespace = r.namespace
        self.context = r.context
        self.metadata: JSON = r.metadata
        self.root = r.root
        self.ownership: Ownership = ownership.ownership_of(
            self.metadata, self.namespace, policy, r.context, r.old_metadata, r.root
        )


def _mutated(target: Target, policy: Policy, who: _Who) -> tuple[JSON, Pod, list[Change]]:
    """Run the mutation steps on a copy of the target's pod spec."""
    pod = _pod(target, policy, copy_json(target.spec), who)
    changes = run_steps(pod)
    return pod.spec, pod, changes


def _with_records(obj: JSON, expected: dict[str, str | None]) -> JSON | None:
    """``obj`` with runguard's records as expected, or None when it has them already."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    metadata = dict(metadata)
    changed = False
    for key, value in expected.items():
        where = "labels" if key == POLICY_LABEL else "annotations"
        current = metadata.get(where)
        mapping = dict(current) if isinstance(current, dict) else {}
        if mapping.get(key) == value:
            continue
        if value is None:
            mapping.pop(key, None)
        else:
            mapping[key] = value
        metadata[where] = mapping
        changed = True
    return {**obj, "metadata": metadata} if changed else None


def _record_changes(r: Review, result: JSON) -> tuple[JSON, list[Change]]:
    expected = expected_records(r)
    recorded = _with_records(result, expected)
    if recorded is None:
        return result, []
    if r.old is not None:
        return recorded, [RECORDS_KEPT]
    return recorded, [STAMPED] if expected.get(REQUESTED_BY) else []


def _with_spec(obj: JSON, target: Target, spec: JSON) -> JSON:
    """A copy of ``obj`` whose pod spec is ``spec`` (shares untouched subtrees read-only)."""
    out = dict(obj)
    node = out
    for key in target.keys:
        node[key] = dict(node[key])
        node = node[key]
    node["spec"] = spec
    return out


def _guarded(fn: Callable[P, Decision]) -> Callable[P, Decision]:
    """Last line of defence: a bug in a step denies the object (fail closed) and says so."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Decision:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the engine must answer, whatever the input
            obj, policy = args[0], args[1]
            assert isinstance(policy, Policy)
            namespace = kwargs.get("namespace")
            message = (
                f"runguard failed on this object (internal error {type(exc).__name__}); "
                "it is logged for the administrators: retry later or contact them"
            )
            return _decision(
                obj,
                policy,
                namespace if isinstance(namespace, str) else None,
                applies=True,
                allowed=False,
                violations=[Violation(ENGINE_ERROR, "", message)],
                error=exc,
            )

    return wrapper


def _finish(decision: Decision, policy: Policy) -> Decision:
    """Apply the enforcement mode: Deny denies, Warn warns, Audit only records."""
    if not decision.violations:
        decision.allowed = True
        return decision
    if any(v.rule in _ALWAYS_DENIED for v in decision.violations):
        decision.allowed = False  # what cannot be understood is never let through
        return decision
    if any(_always_denied(v) for v in decision.violations):
        decision.allowed = False
        if policy.enforcement == "Warn":
            decision.warnings.extend(
                _violation_warning(v) for v in decision.violations if not _always_denied(v)
            )
        return decision
    decision.allowed = policy.enforcement != "Deny"
    if policy.enforcement == "Warn":
        decision.warnings.extend(_violation_warning(v) for v in decision.violations)
    return decision


def _always_denied(v: Violation) -> bool:
    return v.rule.partition(".")[0] in _ALWAYS_DENIED_CONCERNS and not v.drift


def _violation_warning(v: Violation) -> str:
    return f"runguard: [{v.rule}] {v.path}: {v.message}"[:WARNING_LIMIT]


@_guarded
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
        return _decision(obj, governing, namespace, applies=False, allowed=True)
    target, problems = _select(r)
    changes: list[Change] = []
    profile = None
    result = obj
    mutated: Pod | None = None  # the steps' Pod at CREATE, for the receipt
    if target is not None and not problems and target.kind == "Pod":
        hardened = _debug_containers_hardened(target, governing, r.old) if r.old else None
        if hardened is not None:
            spec, change = hardened
            result, changes = _with_spec(obj, target, spec), [change]
        else:
            spec, pod, changes = _mutated(target, governing, _Who(r, governing))
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
                result = _with_spec(obj, target, spec)
    elif target is not None and not problems and r.old is None and _template_mutated(r, target):
        # At CREATE only: an UPDATE leaves the template as sent, changed or not (no
        # rollout runguard did not ask for; a Job's template is immutable anyway).
        spec, mutated_template, changes = _mutated(target, governing, _Who(r, governing))
        profile = mutated_template.profile.name if mutated_template.profile else None
        if spec == target.spec:
            changes = []
        else:
            result = _with_spec(obj, target, spec)
        result = _queued(result, target, mutated_template, r, changes)
    elif target is not None and not problems and r.old_target and _template_mutated(r, target):
        # An UPDATE writes nothing new into the template. Only ``kubectl apply`` of the
        # manifest again, whose three-way merge re-sends the values runguard changed at
        # CREATE, is turned back into the stored template: unchanged, as a Job's must be.
        spec, _, _ = _mutated(target, governing, _Who(r, governing))
        if spec != target.spec and spec == r.old_target.spec:
            result, changes = _with_spec(obj, target, spec), [TEMPLATE_REAPPLIED]
    elif target is None and not r.invalid and r.old is None and isinstance(obj, dict):
        result, changes, profile = _operator_templates(r, obj)
    if mutated is not None and isinstance(result, dict):
        result = _queued(result, target, mutated, r, changes)
    if isinstance(result, dict) and not r.invalid and not problems:
        # (an object that cannot be understood is denied by /validate: nothing to record)
        result, recorded = _record_changes(r, result)
        changes.extend(recorded)
    applies = r.governing is not None or bool(problems) or profile is not None
    if receipts is not None and mutated is not None:
        _leave_receipt(mutated, result, receipts, version)
    if result is obj:
        return _decision(obj, governing, namespace, applies=applies, allowed=True)
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
    owners = _owner_references(r.metadata)
    result, change = send_to_queue(
        result, target.kind, pod.profile, pod.policy, owners, suspend, r.context.requester
    )
    if change is not None:
        changes.append(change)
    return result


def _operator_templates(r: Review, obj: JSON) -> tuple[JSON, list[Change], str | None]:
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
        spec, pod, made = _mutated(target, governing, _Who(r, governing))
        profile = profile or (pod.profile.name if pod.profile else None)
        if spec != target.spec:
            result = templates.with_spec(result, keys, spec)
            changes.extend(c for c in made if c not in changes)
        if queued is None and pod.profile is not None and pod.profile.queue is not None:
            queued = target, pod
    if queued is not None:
        result = _queued(result, queued[0], queued[1], r, changes, entry.suspend_steps)
    return result, changes, profile


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
    return _decision(
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


@_guarded
def validate(
    obj: Any,
    policy: Policy,
    *,
    namespace: str | None = None,
    old: Any = None,
    context: Context = NO_CONTEXT,
    governing: Policy | None = None,
    admitted: bool = False,
    receipts: Receipts | None = None,
) -> Decision:
    """The validating webhook: every violation of the object as it arrives.

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
    governing = r.policy
    if not scope.looked_at(r.root, r.namespace):
        return _decision(obj, governing, namespace, applies=False, allowed=True)
    reserved = run_object_checks(r)
    if reserved:
        return _deny(obj, governing, namespace, reserved)
    trust = run_trust_checks(r)
    target, problems = _select(r)
    if problems or (r.invalid and r.old is not None):
        return _deny(obj, governing, namespace, [*problems, *trust])
    if target is None:
        return _outside_selector(r, trust)
    who = _Who(r, governing)
    pod = _pod(target, governing, target.spec, who)
    mutations: list[Change] = []
    if target.kind != "Pod":
        spec, pod, mutations = _mutated(target, governing, who)
        if spec == target.spec:
            mutations = []  # a template /mutate changed already, or nothing to change
    violations = run_checks(pod)
    violations.extend(not_a_run.check_ownership(pod))
    if r.old is None and not admitted and isinstance(obj, dict):
        violations.extend(_not_queued(obj, target, pod, r))
    if target.kind == "Pod" and r.old is None and not _has_receipt(pod, receipts):
        drifted = admitted and ownership.records(r.metadata)[2] == governing.name
        violations.extend(_not_mutated(target, governing, violations, who, drifted))
    decision = _decision(
        obj,
        governing,
        namespace,
        applies=True,
        allowed=True,
        violations=violations,
        profile=pod.profile.title if pod.profile else None,
        warnings=[*([TEMPLATE_KEPT] if mutations else []), *(c.warning for c in mutations)],
        mutations=mutations,
    )
    if r.old is not None and violations:
        before = validate(r.old, governing, namespace=namespace, governing=governing)
        known = {(v.rule, v.path): v.amount for v in before.violations}
        present = [v for v in violations if _already_present(v, known)]
        decision.violations = [v for v in violations if not _already_present(v, known)]
        decision.warnings.extend(
            f"runguard: allowed on update, already present: [{v.rule}] {v.path}"[:WARNING_LIMIT]
            for v in present
        )
    decision.violations.extend(trust)
    return _finish(decision, governing)


def _not_queued(obj: JSON, target: Target, pod: Pod, r: Review) -> list[Violation]:
    """The backstop of a queue profile: a run created without its queue's label (or, a
    Job-like one, not suspended) skipped ``/mutate``, and would start unqueued."""
    if pod.profile is None or pod.profile.queue is None:
        return []
    if target.kind not in ("Pod", *TEMPLATES_MUTATED):
        return []
    owners = _owner_references(r.metadata)
    requester = r.context.requester
    _, change = send_to_queue(obj, target.kind, pod.profile, pod.policy, owners, None, requester)
    if change is None:
        return []
    return [
        Violation(
            change.rule,
            "metadata.labels",
            f"not applied: {change.warning.removeprefix('runguard: ')} "
            "(runguard's mutating webhook does this: was it bypassed?)",
            backstop=True,
        )
    ]


def _has_receipt(pod: Pod, receipts: Receipts | None) -> bool:
    return receipts is not None and backstop_key(pod) in receipts


def _deny(obj: Any, policy: Policy, namespace: str | None, found: list[Violation]) -> Decision:
    return _finish(
        _decision(obj, policy, namespace, applies=True, allowed=False, violations=found), policy
    )


def _outside_selector(r: Review, trust: list[Violation]) -> Decision:
    """Not a run: allowed untouched, unless it uses the platform's objects without being
    the platform's (``ownership.not-a-run``), or breaks a trust check."""
    policy = r.policy
    violations = list(trust)
    if r.target is not None:
        violations.extend(_not_a_run(r))
        if r.old is not None and names_platform_objects(r):
            violations.extend(_stamp_violations(r))
    if not violations:
        return _decision(r.obj, policy, r.namespace, applies=False, allowed=True)
    return _deny(r.obj, policy, r.namespace, violations)


def _not_a_run(r: Review) -> list[Violation]:
    assert r.target is not None
    found: list[Violation] = []
    for policy in scope.platforms(r.root, r.namespace):  # each by its own exclusions
        who = _Who(r, policy)
        violations = not_a_run.check_not_a_run(
            r.target.spec, r.target.spec_path, who.ownership, policy
        )
        if violations and r.old_target is not None:
            # On UPDATE a reference the old object already had is not new: the object was
            # admitted with it (a controller removing its finalizer must go through).
            had = {(k, n) for k, n, _ in ownership.platform_references(r.old_target.spec, policy)}
            now = ownership.platform_references(r.target.spec, policy)
            fresh = {path for k, n, path in now if (k, n) not in had}
            prefix = spec_prefix(r.target.spec_path)
            violations = [v for v in violations if v.path.removeprefix(prefix) in fresh]
        violations += podclaims.check_pod_claims(r, policy, who.ownership)
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


def _not_mutated(
    target: Target, policy: Policy, found: list[Violation], who: _Who, drifted: bool = False
) -> list[Violation]:
    """Validation is a complete backstop of mutation: a Pod created
    without passing through ``/mutate`` (webhook bypassed, misordered, or a failure
    policy of Ignore) is allowed only if mutating it would change nothing. Each step
    that would still change something is a violation under its own rule id, unless a
    check already reported a violation of that concern (``security``, ``resources``...),
    which says the same thing more precisely."""
    spec, _, changes = _mutated(target, policy, who)
    if spec == target.spec:
        return []
    reported = {v.rule.partition(".")[0] for v in found}
    if drifted:
        return [
            Violation(
                c.rule,
                target.spec_path,
                f"policy drift: the policy now does {c.warning.removeprefix('runguard: ')}; "
                "runguard admitted this Pod before the policy changed (recreate it to apply "
                "the current policy)",
                drift=True,
            )
            for c in changes
            if c.rule.partition(".")[0] not in reported
        ]
    return [
        Violation(
            c.rule,
            target.spec_path,
            f"not applied: {c.warning.removeprefix('runguard: ')} "
            "(runguard's mutating webhook does this: was it bypassed?)",
            backstop=True,
        )
        for c in changes
        if c.rule.partition(".")[0] not in reported
    ]


@_guarded
def connect(
    pod: Any,
    policy: Policy,
    *,
    namespace: str | None = None,
    context: Context = NO_CONTEXT,
    by: Any = None,
) -> Decision:
    """A door opened into ``pod`` (``context.subresource``: ``kubectl exec``, ``attach``,
    ``port-forward``, ``pods/proxy`` or ``services/proxy``, a token bound to it), the
    Pod as the cluster holds it (the request itself carries only the command, the ports
    or the TokenRequest; a Service's proxy, each Pod it reaches): a Pod the platform
    created, or that holds its objects or runs as its account, is the platform's to
    open (``ownership.debug``, as a debug container), or one of its own Pods' (``by``:
    the Pod of the same namespace whose token asks). Nothing else of the Pod is judged
    here: it was judged when it was created."""
    found = check_shell(pod, policy, namespace, context, by)
    if not found:
        return _decision(pod, policy, namespace, applies=False, allowed=True)
    return _deny(pod, policy, namespace, found)


@_guarded
def evaluate(
    obj: Any, policy: Policy, *, namespace: str | None = None, context: Context = NO_CONTEXT
) -> Decision:
    """``runguard apply``: what the cluster would do, mutating webhook then validating one."""
    receipts = LocalReceipts()
    mutation = mutate(obj, policy, namespace=namespace, context=context, receipts=receipts)
    if not mutation.applies:
        # Not a run, but still judged: a reserved name, an unlabelled copy of a run.
        validation = validate(mutation.object, policy, namespace=namespace, context=context)
        return validation if validation.applies else mutation
    if mutation.error is not None:
        return mutation
    validation = validate(
        mutation.object, policy, namespace=namespace, context=context, receipts=receipts
    )
    return _decision(
        mutation.object,
        policy,
        namespace,
        applies=True,
        allowed=validation.allowed,
        patch=mutation.patch,
        warnings=[*mutation.warnings, *validation.warnings],
        mutations=[*mutation.mutations, *validation.mutations],
        violations=validation.violations,
        profile=mutation.profile or validation.profile,
        error=validation.error,
    )


__all__ = ["mutate", "validate", "evaluate", "copy_json", "Decision", "Violation", "Change"]
