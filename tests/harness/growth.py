"""Runs grown after admission (``pods/resize`` and the like): an exact profile of the
shipped RunPolicy (``EXACT``, ``exact_policy``) and a resize through both webhooks."""

from __future__ import annotations

from typing import Any

from webhook.engine import mutate, validate
from webhook.engine.context import Context, Requester
from webhook.policy.model import Policy, Profile

from .cluster_state import State
from .shipped import SHIPPED
from .templates import GPU

EXACT = {**GPU, "dhcore/template": "cpu-4"}


def exact_policy() -> Any:
    """The shipped RunPolicy with an exact profile that sets requests only (cpu 4, 16Gi)."""
    run = SHIPPED.named("digitalhub")
    assert run is not None
    exact = Profile.model_validate(
        {"name": "cpu-4", "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}
    )
    return Policy.of(run.model_copy(update={"profiles": {**run.profiles, "cpu-4": exact}}))


def resize(new: Any, old: Any, who: Requester, policy: Any) -> Any:
    """``pods/resize`` through both webhooks: the validating one's decision."""
    context = Context(who, State([]), "UPDATE", "resize")
    patched = mutate(new, policy, namespace="ml", old=old, context=context).object
    return validate(patched, policy, namespace="ml", old=old, context=context)
