"""A ``Decision`` made and finished by the enforcement mode; ``guarded`` is the engine's
last line of defence: a bug in a step denies the object (``engine.error``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec

from webhook.engine.pod import WARNING_LIMIT
from webhook.engine.podspec import object_meta
from webhook.engine.rule import Declarations
from webhook.engine.types import INVALID, Decision, Violation
from webhook.policy.model import Policy, RunPolicy

RULES = Declarations(__name__)


# A bug in runguard: denied (fail closed), logged with its traceback, counted.
ENGINE_ERROR = RULES.rule(
    "engine.error",
    mutation="",
    violation="a bug in runguard (always denied, logged with its traceback, counted)",
)


P = ParamSpec("P")


_ALWAYS_DENIED = frozenset({INVALID, ENGINE_ERROR})


# Who may use the platform's objects and accounts, and which RunPolicy governs an object,
# are enforced whatever ``enforcement`` says: Warn and Audit roll out limits and hardening
# a run may trip over, while a warning would not take back a secret, a token or a run
# that left its RunPolicy. (An installation rolling out ownership leaves
# ``platform.identities`` unset until it is ready: names then decide.)
_ALWAYS_DENIED_CONCERNS = frozenset({"ownership", "scope"})


def decided(obj: Any, policy: RunPolicy, namespace: str | None, **fields: Any) -> Decision:
    kind, ns, name = object_meta(obj)
    return Decision(
        kind=kind,
        namespace=namespace or ns,
        name=name,
        object=obj if isinstance(obj, dict) else {},
        enforcement=policy.enforcement,
        **fields,
    )


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
                policy.first,
                namespace if isinstance(namespace, str) else None,
                applies=True,
                allowed=False,
                violations=[Violation(ENGINE_ERROR, "", message)],
                error=exc,
            )

    return wrapper


def finish(decision: Decision, policy: RunPolicy) -> Decision:
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


def deny(obj: Any, policy: RunPolicy, namespace: str | None, found: list[Violation]) -> Decision:
    return finish(
        decided(obj, policy, namespace, applies=True, allowed=False, violations=found), policy
    )
