"""The registry: every rule id the engine can emit, collected from the modules that
declare it beside the code that mutates or checks under it.

The modules are listed here once; each holds ``RULES`` (a ``webhook.engine.rule``
``Declarations``). ``runguard rules`` / ``docs/rules.md``, ``runguard explain`` and
``runguard audit``'s categories and severities read ``RULES``; ``runguard rules``
adds the ids only ``runguard audit`` reports (declared beside the code that reports
them). ``tests/engine/test_rule_ids.py`` fails on an id the engine emits that is not declared
exactly once, in a module of this list whose code emits it.
"""

from __future__ import annotations

from webhook.engine import decision, mutation, types
from webhook.engine.rule import CONCERNS, Concern, Declarations, Rule, collect
from webhook.engine.rules import (
    debug,
    devices,
    dra,
    growth,
    hardening,
    not_a_run,
    operator_objects,
    pod_security,
    profile,
    queue,
    reserved,
    resources,
    runtime,
    scheduling,
    scope,
    secrets,
    security,
    stamp,
    trust,
    volumes,
)

__all__ = ["CONCERNS", "DECLARATIONS", "RULES", "Concern", "Rule"]

# In the order ``docs/rules.md`` lists a concern's rules.
DECLARATIONS: tuple[Declarations, ...] = tuple(
    module.RULES
    for module in (
        profile,
        runtime,
        resources,
        growth,
        devices,
        dra,
        security,
        hardening,
        pod_security,
        volumes,
        secrets,
        scheduling,
        scope,
        stamp,
        reserved,
        not_a_run,
        trust,
        operator_objects,
        debug,
        queue,
        mutation,
        decision,
        types,
    )
)

RULES, _reported = collect(DECLARATIONS)
assert not _reported, "the engine only reports through its webhooks' rules"
