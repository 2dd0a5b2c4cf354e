"""The engine's entry points: ``mutate``, ``validate`` and ``evaluate`` (mutate, then validate).

Pure and total: any input, however malformed, becomes a ``Decision``. An object that
cannot be understood is denied with ``input.invalid``; an exception inside a step is a
bug in runguard, not in the input: it is denied as ``engine.error`` with the exception
in ``Decision.error`` for the server to log and count.
"""

from __future__ import annotations

from typing import Any

from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.decision import decided, deny, guarded
from webhook.engine.mutation import TEMPLATES_MUTATED, mutate
from webhook.engine.pod import copy_json
from webhook.engine.receipts import LocalReceipts
from webhook.engine.rules.debug import check_shell
from webhook.engine.types import Change, Decision, Violation
from webhook.engine.validation import TEMPLATE_KEPT, validate
from webhook.policy.model import Policy


@guarded
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
        return decided(pod, policy.first, namespace, applies=False, allowed=True)
    return deny(pod, policy.first, namespace, found)


@guarded
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
    return decided(
        mutation.object,
        policy.first,
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


__all__ = [
    "TEMPLATES_MUTATED",
    "TEMPLATE_KEPT",
    "Change",
    "Decision",
    "Violation",
    "connect",
    "copy_json",
    "evaluate",
    "mutate",
    "validate",
]
