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

from webhook.engine.context import NO_CONTEXT, STAMP, Context, Ownership
from webhook.engine.diff import make_patch
from webhook.engine.pod import WARNING_LIMIT, Pod, copy_json, spec_prefix
from webhook.engine.pod import warning as warning_text
from webhook.engine.podspec import InvalidObject, Target, locate, object_meta
from webhook.engine.rules import ownership, run_checks, run_steps
from webhook.engine.rules.profile import PRIORITY_COMPUTED
from webhook.engine.rules.scope import check_scope_labels
from webhook.engine.rules.security import harden_debug_containers
from webhook.engine.shape import check_shape
from webhook.engine.types import ENGINE_ERROR, INVALID, JSON, Change, Decision, Violation
from webhook.policy.model import Policy

P = ParamSpec("P")
UPDATE_KEPT = "a running pod's spec cannot change: kept the values runguard set at creation"
STAMPED = Change("ownership.stamp", warning_text(f"stamped {STAMP}"))
_ALWAYS_DENIED = frozenset({INVALID, ENGINE_ERROR})


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


def _select(
    obj: Any, policy: Policy, namespace: str | None
) -> tuple[Target | None, list[Violation]]:
    """The pod template when the object is a run this policy governs, else None."""
    try:
        target = locate(obj)
    except InvalidObject as exc:
        return None, exc.violations
    if target is None:
        return None, []
    ns = namespace or object_meta(obj)[1]
    if ns in policy.exclude_namespaces or not policy.selector.matches(target.labels):
        return None, []
    return target, check_shape(target.spec, target.spec_path)


def _run_policy_for(obj: Any, policy: Policy, namespace: str | None) -> Policy:
    """The RunPolicy that governs ``obj`` (SPEC section 1: the first by name whose selector
    matches its pod's labels); ``policy`` itself when none does or there is no other."""
    if not policy.alternatives:
        return policy
    try:
        target = locate(obj)
    except InvalidObject:
        return policy
    if target is None:
        return policy
    return policy.choose(target.labels, namespace or object_meta(obj)[1]) or policy


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
    )


class _Who:
    """Where the object lives, who asks, and whether the platform created it."""

    def __init__(self, obj: Any, policy: Policy, namespace: str | None, context: Context):
        self.namespace = namespace or object_meta(obj)[1]
        self.context = context
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        self.metadata: JSON = meta if isinstance(meta, dict) else {}
        self.ownership: Ownership = ownership.ownership_of(
            self.metadata, self.namespace, policy, context
        )


def _mutated(target: Target, policy: Policy, who: _Who) -> tuple[JSON, Pod, list[Change]]:
    """Run the mutation steps on a copy of the target's pod spec."""
    pod = _pod(target, policy, copy_json(target.spec), who)
    changes = run_steps(pod)
    return pod.spec, pod, changes


def _stamped(obj: JSON, policy: Policy, context: Context) -> JSON | None:
    """``obj`` stamped with the requester at CREATE (any value sent is overwritten), or None
    when there is nothing to stamp (ownership off, an UPDATE, no requester known)."""
    if not ownership.enabled(policy) or context.operation != "CREATE" or context.requester is None:
        return None
    metadata = dict(obj.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    if annotations.get(STAMP) == context.requester.username:
        return None
    annotations[STAMP] = context.requester.username
    metadata["annotations"] = annotations
    return {**obj, "metadata": metadata}


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
    decision.allowed = policy.enforcement != "Deny"
    if policy.enforcement == "Warn":
        decision.warnings.extend(_violation_warning(v) for v in decision.violations)
    return decision


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
) -> Decision:
    """The mutating webhook: patch a run Pod. Never denies; other objects pass untouched.

    On UPDATE (``old`` given) a Pod's spec is immutable, so the patch is kept only when
    it turns the spec back into the running one: that is ``kubectl apply`` of the
    user's manifest again, whose three-way merge re-sends the values runguard changed
    at creation. Any other change (a policy edited since) is not made on UPDATE, which
    would make the apiserver refuse unrelated updates such as a finalizer removal.
    """
    chosen = _run_policy_for(obj, policy, namespace)
    if chosen is not policy:
        return mutate(obj, chosen, namespace=namespace, old=old, context=context)
    target, problems = _select(obj, policy, namespace)
    if target is None and not problems:
        return _stamp_only(obj, policy, namespace, context, applies=False)
    if problems or target is None or target.kind != "Pod":
        # Controllers are judged by validate(); malformed pods are denied there too.
        return _stamp_only(obj, policy, namespace, context, applies=True)
    debug = _debug_containers_hardened(obj, target, policy, namespace, old) if old else None
    if debug is not None:
        return debug
    spec, pod, changes = _mutated(target, policy, _Who(obj, policy, namespace, context))
    if spec == target.spec:
        changes = []  # steps that undid each other changed nothing
    elif old is not None:
        running = old.get("spec") if isinstance(old, dict) else None
        if isinstance(running, dict):
            for key in PRIORITY_COMPUTED:  # computed at creation, kept for the pod's life
                if key in running:
                    spec[key] = running[key]
        if spec != running:
            return _decision(obj, policy, namespace, applies=True, allowed=True)
        changes = [Change("update.spec-kept", warning_text(UPDATE_KEPT))]
    result = _with_spec(obj, target, spec)
    stamped = _stamped(result, policy, context)
    if stamped is not None:
        result = stamped
        changes.append(STAMPED)
    return _patched(
        obj, result, policy, namespace, changes, profile=pod.profile.name if pod.profile else None
    )


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
    obj: JSON, target: Target, policy: Policy, namespace: str | None, old: Any
) -> Decision | None:
    """UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``): the ephemeral containers
    added, the only part of a running Pod's spec that may change, get their hardening and
    nothing else is patched. None when no container was added or none needs it."""
    running = old.get("spec") if isinstance(old, dict) else None
    if not isinstance(running, dict):
        return None
    hardened = harden_debug_containers(target.spec, running, policy)
    if hardened is None:
        return None
    spec, change = hardened
    return _patched(obj, _with_spec(obj, target, spec), policy, namespace, [change])


@_guarded
def validate(
    obj: Any,
    policy: Policy,
    *,
    namespace: str | None = None,
    old: Any = None,
    context: Context = NO_CONTEXT,
) -> Decision:
    """The validating webhook: every violation of the object as it arrives.

    A pod controller is judged by its template *after* mutation, since that is what its
    pods will look like. On UPDATE (``old`` given), violations the old object already had
    are reported as warnings instead of denying, so labels and annotations of an existing
    object can still be edited.
    """
    chosen = _run_policy_for(obj, policy, namespace)
    if chosen is not policy:
        return validate(obj, chosen, namespace=namespace, old=old, context=context)
    reserved = ownership.check_reserved_name(obj, policy, context) if isinstance(obj, dict) else []
    if reserved:
        return _finish(
            _decision(obj, policy, namespace, applies=True, allowed=False, violations=reserved),
            policy,
        )
    target, problems = _select(obj, policy, namespace)
    scope = _scope_violations(obj, old, policy, namespace) if old is not None else []
    if scope and (target is None or problems):
        # A run leaving the selector: judged by what it was.
        return _finish(
            _decision(obj, policy, namespace, applies=True, allowed=False, violations=scope),
            policy,
        )
    if target is None and not problems:
        return _outside_selector(obj, policy, namespace, old, context)
    if problems or target is None:
        return _finish(
            _decision(obj, policy, namespace, applies=True, allowed=False, violations=problems),
            policy,
        )
    who = _Who(obj, policy, namespace, context)
    pod = _pod(target, policy, target.spec, who)
    mutations: list[Change] = []
    if target.kind != "Pod":
        _, pod, mutations = _mutated(target, policy, who)
    violations = run_checks(pod)
    violations.extend(ownership.check_ownership(pod))
    if isinstance(old, dict):
        violations.extend(_stamp_violations(who, old, policy, namespace))
    if target.kind == "Pod" and old is None:
        violations.extend(_not_mutated(target, policy, violations, who))
    decision = _decision(
        obj,
        policy,
        namespace,
        applies=True,
        allowed=True,
        violations=violations,
        profile=pod.profile.name if pod.profile else None,
        warnings=[c.warning for c in mutations],
        mutations=mutations,
    )
    if old is not None and violations:
        before = validate(old, policy, namespace=namespace)
        known = {(v.rule, v.path): v.amount for v in before.violations}
        present = [v for v in violations if _already_present(v, known)]
        decision.violations = [v for v in violations if not _already_present(v, known)]
        decision.warnings.extend(
            f"runguard: allowed on update, already present: [{v.rule}] {v.path}"[:WARNING_LIMIT]
            for v in present
        )
    decision.violations.extend(scope)
    return _finish(decision, policy)


def _stamp_only(
    obj: Any, policy: Policy, namespace: str | None, context: Context, *, applies: bool
) -> Decision:
    """A controller run, or a pod outside the selector naming the platform's objects: only
    the stamp is written (SPEC section 7); anything else passes untouched."""
    stamped = None
    if isinstance(obj, dict) and (applies or _names_platform_objects(obj, policy)):
        stamped = _stamped(obj, policy, context)
    if stamped is None:
        return _decision(obj, policy, namespace, applies=applies, allowed=True)
    # applies: a stamped pod outside the selector is still not a run
    return _patched(obj, stamped, policy, namespace, [STAMPED], applies=applies)


def _names_platform_objects(obj: Any, policy: Policy) -> bool:
    if not ownership.enabled(policy):
        return False
    try:
        target = locate(obj)
    except InvalidObject:
        return False
    return target is not None and bool(ownership.platform_references(target.spec, policy))


def _already_present(v: Violation, known: dict[tuple[str, str], Decimal | None]) -> bool:
    """The old object had this violation, and (for an amount) at least as much of it."""
    if (v.rule, v.path) not in known:
        return False
    before = known[(v.rule, v.path)]
    return v.amount is None or (before is not None and v.amount <= before)


def _scope_violations(obj: Any, old: Any, policy: Policy, namespace: str | None) -> list[Violation]:
    """``scope.labels`` when an UPDATE changes the labels that make ``old`` a governed run."""
    before, _ = _select(old, policy, namespace)
    if before is None or before.kind != "Pod":
        return []  # a controller's new template labels only shape pods judged at creation
    try:
        after = locate(obj)
    except InvalidObject:
        return []  # the new object's own problems are reported as input.invalid
    labels = after.labels if after is not None else {}
    return check_scope_labels(
        before.labels, labels, policy, spec_prefix(before.spec_path) + "metadata"
    )


def _outside_selector(
    obj: Any, policy: Policy, namespace: str | None, old: Any, context: Context
) -> Decision:
    """Not a run: allowed untouched, unless it uses the platform's objects without being
    the platform's (``ownership.not-a-run``)."""
    if not ownership.enabled(policy):
        return _decision(obj, policy, namespace, applies=False, allowed=True)
    try:
        target = locate(obj)
    except InvalidObject:
        target = None
    if target is None:
        return _decision(obj, policy, namespace, applies=False, allowed=True)
    who = _Who(obj, policy, namespace, context)
    if who.namespace in policy.exclude_namespaces:
        return _decision(obj, policy, namespace, applies=False, allowed=True)
    violations = ownership.check_not_a_run(target.spec, target.spec_path, who.ownership, policy)
    if violations and isinstance(old, dict):
        # On UPDATE a reference the old object already had is not new: the object was
        # admitted with it (a controller removing its finalizer must go through).
        try:
            before = locate(old)
        except InvalidObject:
            before = None
        if before is not None:
            had = {(k, n) for k, n, _ in ownership.platform_references(before.spec, policy)}
            now = ownership.platform_references(target.spec, policy)
            fresh = {path for k, n, path in now if (k, n) not in had}
            prefix = spec_prefix(target.spec_path)
            violations = [v for v in violations if v.path.removeprefix(prefix) in fresh]
    if isinstance(old, dict) and ownership.platform_references(target.spec, policy):
        violations.extend(_stamp_violations(who, old, policy, namespace))
    if not violations:
        return _decision(obj, policy, namespace, applies=False, allowed=True)
    return _finish(
        _decision(obj, policy, namespace, applies=True, allowed=False, violations=violations),
        policy,
    )


def _stamp_violations(
    who: _Who, old: JSON, policy: Policy, namespace: str | None
) -> list[Violation]:
    """On UPDATE: the stamp kept, and no object entering the platform's scope."""
    return ownership.check_stamp(
        who.metadata,
        old.get("metadata") or {},
        _in_scope(old, policy, namespace),
        policy,
        who.context,
    )


def _in_scope(obj: Any, policy: Policy, namespace: str | None) -> bool:
    """Whether runguard governs ``obj``: a run, or an object naming the platform's objects."""
    target, problems = _select(obj, policy, namespace)
    return target is not None or bool(problems) or _names_platform_objects(obj, policy)


def _not_mutated(
    target: Target, policy: Policy, found: list[Violation], who: _Who
) -> list[Violation]:
    """Validation is a complete backstop of mutation (SPEC section 6): a Pod created
    without passing through ``/mutate`` (webhook bypassed, misordered, or a failure
    policy of Ignore) is allowed only if mutating it would change nothing. Each step
    that would still change something is a violation under its own rule id, unless a
    check already reported a violation of that concern (``security``, ``resources``...),
    which says the same thing more precisely."""
    spec, _, changes = _mutated(target, policy, who)
    if spec == target.spec:
        return []
    reported = {v.rule.partition(".")[0] for v in found}
    return [
        Violation(
            c.rule,
            target.spec_path,
            f"not applied: {c.warning.removeprefix('runguard: ')} "
            "(runguard's mutating webhook does this: was it bypassed?)",
        )
        for c in changes
        if c.rule.partition(".")[0] not in reported
    ]


@_guarded
def evaluate(
    obj: Any, policy: Policy, *, namespace: str | None = None, context: Context = NO_CONTEXT
) -> Decision:
    """``runguard apply``: what the cluster would do, mutating webhook then validating one."""
    mutation = mutate(obj, policy, namespace=namespace, context=context)
    if not mutation.applies:
        # Not a run, but still judged: a reserved name, an unlabelled copy of a run.
        validation = validate(obj, policy, namespace=namespace, context=context)
        return validation if validation.applies else mutation
    if mutation.error is not None:
        return mutation
    validation = validate(mutation.object, policy, namespace=namespace, context=context)
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
