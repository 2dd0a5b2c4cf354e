"""The policy engine: pure functions from (object, Policy) to a Decision. No I/O.

``mutate`` is the mutating webhook (patches run Pods), ``validate`` the validating one
(judges Pods and the pod templates of controllers), ``evaluate`` both in a row, as the
cluster would apply them (``runguard apply``), ``connect`` a shell opened into a Pod
(``kubectl exec``, ``attach``). None of them raises.
"""

from webhook.engine.review import connect, evaluate, mutate, validate
from webhook.engine.types import Change, Decision, Violation

__all__ = ["Change", "Decision", "Violation", "connect", "evaluate", "mutate", "validate"]
