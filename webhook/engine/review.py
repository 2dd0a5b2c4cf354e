"""The engine's entry points: ``mutate``, ``validate`` and ``evaluate`` (mutate, then validate).

Pure and total: any input, however malformed, becomes a ``Decision``. An object that
cannot be understood is denied with ``input.invalid``; an exception inside a step is a
bug in runguard, not in the input: it is denied as ``engine.error`` with the exception
in ``Decision.error`` for the server to log and count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ParamSpec

from webhook.engine.context import (
    NO_CONTEXT,
    PLATFORM_RECORD,
    POLICY_LABEL,
    STAMP,
    Context,
    Ownership,
)
from webhook.engine.diff import make_patch
from webhook.engine.pod import WARNING_LIMIT, Pod, copy_json, spec_prefix
from webhook.engine.pod import warning as warning_text
from webhook.engine.podspec import InvalidObject, Target, locate, object_meta
from webhook.engine.rule_ids import (
    OWNERSHIP_CHANGED,
    OWNERSHIP_DEBUG,
    OWNERSHIP_SERVICE_ACCOUNT,
    OWNERSHIP_STAMP,
    SCOPE_LABELS,
    UPDATE_SPEC_KEPT,
)
from webhook.engine.rules import ownership, run_checks, run_steps
from webhook.engine.rules.profile import PRIORITY_COMPUTED
from webhook.engine.rules.scope import check_scope_labels, scope_label_keys
from webhook.engine.rules.security import harden_debug_containers
from webhook.engine.shape import check_shape
from webhook.engine.types import ENGINE_ERROR, INVALID, JSON, Change, Decision, Violation
from webhook.policy.model import Policy

P = ParamSpec("P")
UPDATE_KEPT = "a running pod's spec cannot change: kept the values runguard set at creation"
STAMPED = Change(OWNERSHIP_STAMP, warning_text(f"stamped {STAMP}"))
RECORDS_KEPT = Change(
    OWNERSHIP_STAMP,
    warning_text("runguard's records (who created it, its RunPolicy) cannot change: kept"),
)
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


@dataclass
class _Review:
    """One review, worked out once: the pod template of the object and of the old one,
    the RunPolicy that governs it (fixed at CREATE, SPEC section 8) and who asks."""

    root: Policy  # every RunPolicy (``root.run_policies()``)
    obj: Any
    old: Any
    namespace: str
    context: Context
    target: Target | None = None
    invalid: list[Violation] = field(default_factory=list)  # the object cannot be located
    old_target: Target | None = None
    governing: Policy | None = None  # None: outside every RunPolicy

    @property
    def policy(self) -> Policy:
        """The governing RunPolicy, else the first (ownership of objects outside them)."""
        return self.governing or self.root

    @property
    def metadata(self) -> JSON:
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        return meta if isinstance(meta, dict) else {}

    @property
    def old_metadata(self) -> JSON | None:
        if not isinstance(self.old, dict):
            return None
        meta = self.old.get("metadata")
        return meta if isinstance(meta, dict) else {}


def _review(
    obj: Any,
    root: Policy,
    namespace: str | None,
    old: Any,
    context: Context,
    governing: Policy | None = None,
) -> _Review:
    ns = namespace or object_meta(obj)[1]
    r = _Review(root, obj, old if isinstance(old, dict) else None, ns, context)
    try:
        r.target = locate(obj)
    except InvalidObject as exc:
        r.invalid = exc.violations
    if r.old is not None:
        try:
            r.old_target = locate(r.old)
        except InvalidObject:
            r.old_target = None
    r.governing = governing or _governing(r)
    return r


def _governing(r: _Review) -> Policy | None:
    """The RunPolicy that governs the object. On UPDATE, the one recorded at CREATE
    (label ``runguard.io/policy`` of the old object), whatever the labels say now; for an
    object from before that label, the one its old labels chose. At CREATE, the first
    whose selector matches and whose ``requesters`` created it."""
    if r.old is not None:
        recorded = ownership.records(r.old_metadata or {})[2]
        named = r.root.named(recorded) if recorded else None
        if named is not None:
            return named if r.namespace not in named.exclude_namespaces else None
        if r.old_target is None:
            return None
        # From before the label: its labels choose, and a RunPolicy with requesters only
        # when the stamp names one of them (a lax policy is never assumed).
        stamp = ownership.records(r.old_metadata or {})[0]
        return r.root.choose(
            r.old_target.labels,
            r.namespace,
            lambda p: ownership.stamped_by(p.requesters, stamp),
        )
    if r.target is None:
        return None
    return r.root.choose(
        r.target.labels,
        r.namespace,
        lambda p: ownership.requested_by(p, r.metadata, r.namespace, r.context),
    )


def _select(r: _Review) -> tuple[Target | None, list[Violation]]:
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
    )


class _Who:
    """Where the object lives, who asks, and whether the platform created it."""

    def __init__(self, r: _Review, policy: Policy):
        self.namespace = r.namespace
        self.context = r.context
        self.metadata: JSON = r.metadata
        self.ownership: Ownership = ownership.ownership_of(
            self.metadata, self.namespace, policy, r.context, r.old_metadata
        )


def _mutated(target: Target, policy: Policy, who: _Who) -> tuple[JSON, Pod, list[Change]]:
    """Run the mutation steps on a copy of the target's pod spec."""
    pod = _pod(target, policy, copy_json(target.spec), who)
    changes = run_steps(pod)
    return pod.spec, pod, changes


def _stamps_owner(r: _Review) -> Policy | None:
    """The RunPolicy whose ``platform`` records who created the object, when runguard
    records it: a governed object, an operator's object, or one naming the platform's
    objects or carrying runguard's records (which only runguard may write)."""
    policy = r.policy
    if not ownership.enabled(policy):
        policy = next((p for p in r.root.run_policies() if ownership.enabled(p)), policy)
        if not ownership.enabled(policy):
            return None
    if r.governing is not None or ownership.is_operator_object(r.obj, r.root):
        return policy
    if any(ownership.records(r.metadata)[:2]) or _names_platform_objects(r):
        return policy
    return None


def _expected_records(r: _Review) -> dict[str, str | None]:
    """What runguard writes on the object: at CREATE, the stamp, the platform record and
    the governing RunPolicy (None: the key is removed); on UPDATE, what the old object has."""
    if r.old is not None:
        stamp, record, label = ownership.records(r.old_metadata or {})
        return {STAMP: stamp, PLATFORM_RECORD: record, POLICY_LABEL: label}
    label = ownership.records(r.metadata)[2]
    if r.governing is not None and r.target is not None:
        label = r.governing.name
    elif label is not None and r.root.named(label) is not None:
        label = None  # one of ours on an object none of ours governs: forged
    # (a name none of our RunPolicies has is inert: another installation's, or a renamed
    # policy's; UPDATEs of such an object are judged by its labels, as at CREATE)
    out: dict[str, str | None] = {POLICY_LABEL: label}
    owner = _stamps_owner(r)
    if owner is not None and r.context.requester is not None:
        out[STAMP] = r.context.requester.username
        out[PLATFORM_RECORD] = ownership.creator_record(r.metadata, r.namespace, owner, r.context)
    elif owner is not None:
        out[PLATFORM_RECORD] = None  # nobody known asks: never the platform
    return out


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


def _record_changes(r: _Review, result: JSON) -> tuple[JSON, list[Change]]:
    expected = _expected_records(r)
    recorded = _with_records(result, expected)
    if recorded is None:
        return result, []
    if r.old is not None:
        return recorded, [RECORDS_KEPT]
    return recorded, [STAMPED] if expected.get(STAMP) else []


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
    """The mutating webhook: patch a run Pod, and write runguard's records. Never denies.

    On UPDATE (``old`` given) a Pod's spec is immutable, so the patch is kept only when
    it turns the spec back into the running one: that is ``kubectl apply`` of the
    user's manifest again, whose three-way merge re-sends the values runguard changed
    at creation. Any other change (a policy edited since) is not made on UPDATE, which
    would make the apiserver refuse unrelated updates such as a finalizer removal.
    runguard's records (stamp, platform record, governing RunPolicy) are put back as
    they were: a controller copying its parent's annotations cannot change them.
    """
    r = _review(obj, policy, namespace, old, context)
    governing = r.policy
    target, problems = _select(r)
    changes: list[Change] = []
    profile = None
    result = obj
    if target is not None and not problems and target.kind == "Pod":
        hardened = _debug_containers_hardened(target, governing, r.old) if r.old else None
        if hardened is not None:
            spec, change = hardened
            result, changes = _with_spec(obj, target, spec), [change]
        else:
            spec, pod, changes = _mutated(target, governing, _Who(r, governing))
            profile = pod.profile.name if pod.profile else None
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
    if isinstance(result, dict) and not r.invalid and not problems:
        # (an object that cannot be understood is denied by /validate: nothing to record)
        result, recorded = _record_changes(r, result)
        changes.extend(recorded)
    applies = r.governing is not None or bool(problems)
    if result is obj:
        return _decision(obj, governing, namespace, applies=applies, allowed=True)
    return _patched(obj, result, governing, namespace, changes, applies=applies, profile=profile)


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
) -> Decision:
    """The validating webhook: every violation of the object as it arrives.

    A pod controller is judged by its template *after* mutation, since that is what its
    pods will look like. On UPDATE (``old`` given), violations the old object already had
    are reported as warnings instead of denying, so labels and annotations of an existing
    object can still be edited; what SPEC section 8 forbids (leaving or changing the
    RunPolicy, rewriting owners or runguard's records) never is.
    """
    r = _review(obj, policy, namespace, old, context, governing)
    governing = r.policy
    reserved = (
        ownership.check_reserved_name(obj, r.root, context)
        + ownership.check_claim_clones(obj, r.root, context)
        if isinstance(obj, dict)
        else []
    )
    if reserved:
        return _deny(obj, governing, namespace, reserved)
    trust = _trust_violations(r)
    target, problems = _select(r)
    if problems or (r.invalid and r.old is not None):
        return _deny(obj, governing, namespace, [*problems, *trust])
    if target is None:
        return _outside_selector(r, trust)
    who = _Who(r, governing)
    pod = _pod(target, governing, target.spec, who)
    mutations: list[Change] = []
    if target.kind != "Pod":
        _, pod, mutations = _mutated(target, governing, who)
    violations = run_checks(pod)
    violations.extend(ownership.check_ownership(pod))
    if target.kind == "Pod" and r.old is None:
        violations.extend(_not_mutated(target, governing, violations, who))
    decision = _decision(
        obj,
        governing,
        namespace,
        applies=True,
        allowed=True,
        violations=violations,
        profile=pod.profile.name if pod.profile else None,
        warnings=[c.warning for c in mutations],
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


def _deny(obj: Any, policy: Policy, namespace: str | None, found: list[Violation]) -> Decision:
    return _finish(
        _decision(obj, policy, namespace, applies=True, allowed=False, violations=found), policy
    )


def _trust_violations(r: _Review) -> list[Violation]:
    """SPEC section 8, whatever the object's own rules say: runguard's records as
    ``/mutate`` writes them, the scope kept on UPDATE, owners not rewritten, no debug
    container in a platform Pod but the platform's, no platform ServiceAccount."""
    out = _record_violations(r)
    out.extend(_policy_label_in_template(r))
    if r.old is not None:
        out.extend(_platform_change_violations(r))
        out.extend(_scope_violations(r))
        old_meta = r.old_metadata or {}
        out.extend(ownership.check_owner_change(r.metadata, old_meta, r.root, r.context))
        out.extend(_debug_violations(r))
    out.extend(_service_account_violations(r))
    return out


def _record_violations(r: _Review) -> list[Violation]:
    """The records are what ``/mutate`` writes: at CREATE for the request's user (a
    forged stamp or record of a Pod that skipped ``/mutate`` is denied), on UPDATE the
    old object's. Unknown requester (offline without ``--as``): nothing to compare with."""
    if r.invalid or (r.old is None and r.context.requester is None):
        return []
    stamp, record, label = ownership.records(r.metadata)
    now = {STAMP: stamp, PLATFORM_RECORD: record, POLICY_LABEL: label}
    out = []
    for key, expected in _expected_records(r).items():
        if now[key] == expected:
            continue
        rule = SCOPE_LABELS if key == POLICY_LABEL else OWNERSHIP_STAMP
        where = "labels" if key == POLICY_LABEL else "annotations"
        when = "at creation" if r.old is None else "and cannot change"
        out.append(
            Violation(
                rule,
                f"metadata.{where}[{key}]",
                f"{key} is written by runguard's mutating webhook {when}: "
                f"{now[key]!r} is not {expected!r} (was the webhook bypassed?)",
            )
        )
    return out


def _outside_selector(r: _Review, trust: list[Violation]) -> Decision:
    """Not a run: allowed untouched, unless it uses the platform's objects without being
    the platform's (``ownership.not-a-run``), or breaks SPEC section 8."""
    policy = r.policy
    violations = list(trust)
    if r.target is not None and r.namespace not in policy.exclude_namespaces:
        violations.extend(_not_a_run(r))
        if r.old is not None and _names_platform_objects(r):
            violations.extend(_stamp_violations(r))
    if not violations:
        return _decision(r.obj, policy, r.namespace, applies=False, allowed=True)
    return _deny(r.obj, policy, r.namespace, violations)


def _not_a_run(r: _Review) -> list[Violation]:
    assert r.target is not None
    found: list[Violation] = []
    for policy in r.root.run_policies():
        if not ownership.enabled(policy):
            continue
        who = _Who(r, policy)
        violations = ownership.check_not_a_run(
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
        found.extend(v for v in violations if v not in found)
    return found


def _names_platform_objects(r: _Review) -> bool:
    """The pod spec names the platform's objects or runs as one of its ServiceAccounts."""
    if r.target is None:
        return False
    account = _service_account(r.target.spec)
    return any(
        ownership.enabled(p)
        and (
            bool(ownership.platform_references(r.target.spec, p))
            or (r.namespace, account) in ownership.service_account_identities(p)
        )
        for p in r.root.run_policies()
    )


def _service_account(spec: JSON) -> str:
    name = spec.get("serviceAccountName") or spec.get("serviceAccount")
    return name if isinstance(name, str) else ""


def _already_present(v: Violation, known: dict[tuple[str, str], Decimal | None]) -> bool:
    """The old object had this violation, and (for an amount) at least as much of it."""
    if (v.rule, v.path) not in known:
        return False
    before = known[(v.rule, v.path)]
    return v.amount is None or (before is not None and v.amount <= before)


def _scope_violations(r: _Review) -> list[Violation]:
    """``scope.labels`` when an UPDATE changes a label that decides whether and how an
    object is governed (any RunPolicy's selector keys, profile label and pattern labels),
    for a Pod's labels and for a controller's template labels alike."""
    if r.old_target is None:
        return []
    labels = r.target.labels if r.target is not None else {}
    if r.governing is None:
        entering = r.root.choose(labels, r.namespace, lambda _p: True)
        if entering is None:
            return []
        return [
            Violation(
                SCOPE_LABELS,
                spec_prefix(r.old_target.spec_path) + "metadata.labels",
                f"these labels make it a run of RunPolicy {entering.name}: an existing object "
                "cannot become a run by an update; create it anew",
            )
        ]
    keys: list[str] = []
    for p in r.root.run_policies():
        keys.extend(scope_label_keys(p))
    return check_scope_labels(
        r.old_target.labels,
        labels,
        list(dict.fromkeys(keys)),
        spec_prefix(r.old_target.spec_path) + "metadata",
    )


def _platform_old(r: _Review) -> Policy | None:
    """The RunPolicy with ownership on whose record says the platform created the old
    object, unless the request comes from a platform identity or a controller (they may
    change what the platform's objects run); None otherwise."""
    annotations = ownership.string_map(r.old_metadata, "annotations")
    requester = r.context.requester
    for p in r.root.run_policies():
        installed = annotations.get(PLATFORM_RECORD) == ownership.INSTALLER
        if not ownership.enabled(p) or not (
            installed or ownership.recorded_platform(p, annotations)
        ):
            continue
        if ownership.is_platform_identity(p, requester) or ownership.is_identity(
            p.platform.installers, requester
        ):
            return None
        if requester is not None and requester.username in p.platform.owner_kinds:
            return None
        return p
    return None


def _images(spec: JSON) -> list[Any]:
    return [
        [c.get("image") for c in spec.get(name) or () if isinstance(c, dict)]
        for name in ("initContainers", "containers")
    ]


def _platform_change_violations(r: _Review) -> list[Violation]:
    """``ownership.changed``: the platform's objects keep running what the platform asked.
    A user with edit rights may scale them, annotate them or restart a rollout, but not
    change a controller's pod template spec or a Pod's images: the Pods would run her code
    with the platform's secrets, recorded as the platform's."""
    if r.old_target is None or r.target is None or _platform_old(r) is None:
        return []
    if r.target.kind == "Pod":
        if _images(r.old_target.spec) == _images(r.target.spec):
            return []
        what, where = "the images of a Pod", f"{r.target.spec_path}.containers"
    else:
        if r.old_target.spec == r.target.spec:
            return []
        what, where = f"the pod template of a {r.target.kind}", r.target.spec_path
    return [
        Violation(
            OWNERSHIP_CHANGED,
            where,
            f"{what} the platform created is the platform's to change: its Pods run with the "
            "platform's secrets and volumes; ask the platform, or create your own",
        )
    ]


def _policy_label_in_template(r: _Review) -> list[Violation]:
    """A controller may not select or template Pods by runguard's RunPolicy label: the
    label is runguard's to write on each Pod, and a Pod it relabels would leave its
    controller's selector, which would create another, without end."""
    if r.target is None or r.target.kind == "Pod" or not isinstance(r.obj, dict):
        return []
    spec = r.obj.get("spec")
    selector = spec.get("selector") if isinstance(spec, dict) else None
    keys = set(r.target.labels)
    if isinstance(selector, dict):
        labels = selector.get("matchLabels")
        keys.update(labels if isinstance(labels, dict) else ())
        for expression in selector.get("matchExpressions") or ():
            if isinstance(expression, dict) and isinstance(expression.get("key"), str):
                keys.add(expression["key"])
    if POLICY_LABEL not in keys:
        return []
    return [
        Violation(
            SCOPE_LABELS,
            "spec.selector",
            f"{POLICY_LABEL} is runguard's label, written on each Pod: a controller may not "
            "select or template Pods by it; remove it",
        )
    ]


def _debug_violations(r: _Review) -> list[Violation]:
    """``ownership.debug``: an ephemeral container added to a Pod that holds the platform's
    objects, by anyone but a platform identity (a shell in the run, with its secrets)."""
    if r.context.subresource != "ephemeralcontainers" or r.target is None:
        return []
    if r.old_target is None or r.target.kind != "Pod":
        return []
    before = r.old_target.spec.get("ephemeralContainers") or []
    after = r.target.spec.get("ephemeralContainers") or []
    if not isinstance(after, list) or len(after) <= len(before if isinstance(before, list) else []):
        return []
    out = []
    old_annotations = ownership.string_map(r.old_metadata, "annotations")
    for p in r.root.run_policies():
        if not ownership.enabled(p) or ownership.is_platform_identity(p, r.context.requester):
            continue
        if ownership.recorded_platform(p, old_annotations) or ownership.platform_references(
            r.old_target.spec, p
        ):
            out.append(
                Violation(
                    OWNERSHIP_DEBUG,
                    "spec.ephemeralContainers",
                    "the platform created this Pod, or it holds the platform's secrets or "
                    "volumes: only the platform may add a debug container to it",
                )
            )
            break
    return out


def _service_account_violations(r: _Review) -> list[Violation]:
    """``ownership.service-account``: only the platform's own objects run as its accounts."""
    if r.target is None or (r.old is not None and r.old_target is not None):
        return []  # a Pod's service account never changes after CREATE
    name = _service_account(r.target.spec)
    if not name:
        return []
    for p in r.root.run_policies():
        if not ownership.enabled(p) or (r.namespace, name) not in (
            ownership.service_account_identities(p)
        ):
            continue
        # the platform, its installers (the chart), or their controllers
        if ownership.creator_record(r.metadata, r.namespace, p, r.context) is not None:
            return []
        return [
            Violation(
                OWNERSHIP_SERVICE_ACCOUNT,
                f"{r.target.spec_path}.serviceAccountName",
                f"ServiceAccount {name!r} is the platform's own identity: only objects the "
                "platform creates run as it",
            )
        ]
    return []


def _stamp_violations(r: _Review) -> list[Violation]:
    """On UPDATE: no object entering the platform's scope."""
    return ownership.check_stamp(
        r.metadata, r.old_metadata or {}, _in_scope(r), r.policy, r.context
    )


def _in_scope(r: _Review) -> bool:
    """Whether runguard governed the old object: a run, or one naming the platform's."""
    if r.old_target is None:
        return False
    if r.governing is not None:
        return True
    return any(
        ownership.enabled(p) and ownership.platform_references(r.old_target.spec, p)
        for p in r.root.run_policies()
    )


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
        validation = validate(mutation.object, policy, namespace=namespace, context=context)
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
