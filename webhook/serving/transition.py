"""A policy edit reaches ``/mutate`` and ``/validate`` a moment apart.

The apiserver calls the mutating and the validating webhook separately, and either
call may land on another gunicorn worker (each adopts the master's decision within a
reload interval) or on another replica (each reads the ConfigMap when its kubelet
syncs it, up to about a minute apart). A Pod that ``/mutate`` made with the policy of
a moment ago then meets a ``/validate`` serving the new one, whose backstop finds the
new profile default or mode "not applied" and denies a Pod nobody bypassed.

So a denial made of backstop violations only (``Violation.backstop``) is judged once
more, never more leniently than one of the two policies that serve right now:

1. with the policy after a look at the master's decision now (this worker may be the
   one behind): allowed if it allows;
2. with the policy the current one replaced, kept ``policystore.TRANSITION`` seconds
   (``PolicyState.recent``): allowed if that whole policy allows the Pod, every check
   and its own backstop, with a warning saying so, and only if a ``/mutate`` of this
   server still serving that policy made the object. ``/mutate`` leaves a key of the
   object it returned and the digest of the policy it served
   (``receipts.made_key``) in the table every worker of this server maps
   (``admission.RECEIPTS``): its presence is how a worker knows the replaced policy was
   still being served, by any worker, when the object was made. An object no ``/mutate``
   of this server made under that policy (one that skipped ``/mutate``, or one another
   replica made) cannot show it, and its denial is kept: in doubt, denied. (Another
   replica's Pods denied so are recreated by their controller, and the next ``/mutate``
   serves the new policy.)

Any other violation (a check of the current policy) keeps the denial as it is, so an
edit that tightens a maximum or forbids an image holds from the moment it serves.
"""

from __future__ import annotations

from webhook.engine.context import ClusterView
from webhook.engine.receipts import leave_made, made_key
from webhook.policy.model import Policy
from webhook.serving import admission
from webhook.serving.admission import AdmissionRequest, Endpoint, Outcome
from webhook.serving.policystore import PolicyStore

__all__ = ["backstop_only", "settle"]


def backstop_only(outcome: Outcome) -> bool:
    """Denied, and only because steps of ``/mutate`` are missing."""
    decision = outcome.decision
    return (
        decision is not None
        and not decision.allowed
        and outcome.error is None
        and bool(decision.violations)
        and all(v.backstop for v in decision.violations)
    )


def settle(
    endpoint: Endpoint,
    request: AdmissionRequest,
    policy: Policy,
    outcome: Outcome,
    store: PolicyStore,
    cluster: ClusterView | None,
) -> tuple[Outcome, Policy]:
    """``outcome`` of ``policy``, or the judgment of the policy that made the Pod when
    ``outcome`` is a backstop denial (see the module doc); with the policy that decided.
    A ``/mutate`` at CREATE leaves the key of what it made (``receipts.made_key``)."""
    decision = outcome.decision
    if endpoint == "mutate" and decision is not None and decision.applies:
        if request.get("operation") == "CREATE":
            leave_made(admission.RECEIPTS, policy.digest, decision.object)
    if endpoint != "validate" or not backstop_only(outcome):
        return outcome, policy
    newer = store.catch_up()
    if newer is not None and newer.digest != policy.digest:
        outcome, policy = admission.review(endpoint, request, newer, cluster), newer
        if not backstop_only(outcome):
            return outcome, policy
    previous = store.state.recent()
    if previous is None or previous.digest == policy.digest:
        return outcome, policy
    if made_key(previous.digest, request.get("object")) not in admission.RECEIPTS:
        return outcome, policy  # no /mutate here made it with that policy: in doubt, denied
    again = admission.review(endpoint, request, previous, cluster)
    if again.decision is None or not again.decision.allowed:
        return outcome, policy
    missing = "; ".join(
        v.message.removeprefix("not applied: ").partition(" (runguard's")[0]
        for v in outcome.decision.violations  # type: ignore[union-attr]
    )
    again.decision.warnings.insert(
        0,
        f"runguard: made with the policy replaced a moment ago (digest {previous.digest}); "
        f"the one serving now (digest {policy.digest}) would apply: {missing}",
    )
    response = admission.decision_response(request["uid"], again.decision, patch=False)
    return Outcome(response, again.decision, again.error), previous
