"""What both admission paths share: the run located in the object under review, its Pod
built and the mutation steps run on a copy, runguard's records written, and a
``Decision`` made and finished by the enforcement mode. ``guarded`` is the engine's last
line of defence: a bug in a step denies the object (``engine.error``).

``webhook.engine.mutation`` (``/mutate``) and ``webhook.engine.validation``
(``/validate``) are built from these; ``webhook.engine.review`` is the entry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec

from webhook.engine.context import Ownership
from webhook.engine.pod import WARNING_LIMIT, Pod, copy_json
from webhook.engine.pod import warning as warning_text
from webhook.engine.podspec import Target, object_meta
from webhook.engine.rule import Declarations
from webhook.engine.rules import ownership, run_steps
from webhook.engine.rules.stamp import OWNERSHIP_STAMP
from webhook.engine.shape import check_shape
from webhook.engine.subject import (
    Review,
    expected_records,
)
from webhook.engine.types import INVALID, JSON, Change, Decision, Violation
from webhook.keys import POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import Policy

RULES = Declarations(__name__)
RULES = Declarations(__name__)


# A bug in runguard: denied (fail closed), logged with its traceback, counted.
ENGINE_ERROR = RULES.rule(
    "engine.error",
    mutation="",
    violation="a bug in runguard (always denied, logged with its traceback, counted)",
)


P = ParamSpec("P")


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


def decided(obj: Any, policy: Policy, namespace: str | None, **fields: Any) -> Decision:
    kind, ns, name = object_meta(obj)
    return Decision(
        kind=kind,
        namespace=namespace or ns,
        name=name,
        object=obj if isinstance(obj, dict) else {},
        enforcement=policy.enforcement,
        **fields,
    )


def selected(r: Review) -> tuple[Target | None, list[Violation]]:
    """The pod template when the object is a run its RunPolicy governs, else None."""
    if r.invalid:
        return None, r.invalid
    if r.target is None or r.governing is None:
        return None, []
    return r.target, check_shape(r.target.spec, r.target.spec_path)


def pod_of(target: Target, policy: Policy, spec: JSON, who: Who) -> Pod:
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
        owner_references(who.metadata),
        who.root,
    )


def owner_references(metadata: JSON) -> tuple[Any, ...]:
    refs = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    return tuple(refs) if isinstance(refs, list) else ()


class Who:
    """Where the object lives, who asks, and whether the platform created it."""

    def __init__(self, r: Review, policy: Policy):
        self.namespace = r.namespace
        self.context = r.context
        self.metadata: JSON = r.metadata
        self.root = r.root
        self.ownership: Ownership = ownership.ownership_of(
            self.metadata, self.namespace, policy, r.context, r.old_metadata, r.root
        )


def steps_applied(target: Target, policy: Policy, who: Who) -> tuple[JSON, Pod, list[Change]]:
    """Run the mutation steps on a copy of the target's pod spec."""
    pod = pod_of(target, policy, copy_json(target.spec), who)
    changes = run_steps(pod)
    return pod.spec, pod, changes


def with_records(obj: JSON, expected: dict[str, str | None]) -> JSON | None:
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


def record_changes(r: Review, result: JSON) -> tuple[JSON, list[Change]]:
    expected = expected_records(r)
    recorded = with_records(result, expected)
    if recorded is None:
        return result, []
    if r.old is not None:
        return recorded, [RECORDS_KEPT]
    return recorded, [STAMPED] if expected.get(REQUESTED_BY) else []


def with_spec(obj: JSON, target: Target, spec: JSON) -> JSON:
    """A copy of ``obj`` whose pod spec is ``spec`` (shares untouched subtrees read-only)."""
    out = dict(obj)
    node = out
    for key in target.keys:
        node[key] = dict(node[key])
        node = node[key]
    node["spec"] = spec
    return out


def guarded(fn: Callable[P, Decision]) -> Callable[P, Decision]:
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
            return decided(
                obj,
                policy,
                namespace if isinstance(namespace, str) else None,
                applies=True,
                allowed=False,
                violations=[Violation(ENGINE_ERROR, "", message)],
                error=exc,
            )

    return wrapper


def finish(decision: Decision, policy: Policy) -> Decision:
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


def deny(obj: Any, policy: Policy, namespace: str | None, found: list[Violation]) -> Decision:
    return finish(
        decided(obj, policy, namespace, applies=True, allowed=False, violations=found), policy
    )
