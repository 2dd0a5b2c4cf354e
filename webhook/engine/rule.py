"""What a rule id is, and how a module declares the ones it emits.

A rule id is in kubectl warnings, in ``status.message``, in the audit annotations
``mutations`` / ``violations``, in runguard's JSON log, in the metrics and in
``runguard audit``'s reports. Each is declared once, in the module whose code mutates,
checks or reports under it::

    RULES = Declarations(__name__)
    SECURITY_ROOT = RULES.rule("security.root", mutation="...", violation="...")

``rule`` (and ``report``) returns the id itself, so the code names the rule by that constant.
``webhook.engine.registry`` collects the engine's declarations (what the webhooks judge
under); ``runguard rules`` adds the ids only ``runguard audit`` reports. A rule id
written as a string anywhere but in its declaration fails ``tests/engine/test_rule_ids.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CONCERNS", "Concern", "Declarations", "ReportRule", "Rule", "collect"]


@dataclass(frozen=True)
class Concern:
    """What a rule id's concern (the part before the dot) is about, as ``runguard audit``
    files its results: a PolicyReport ``category``, and the ``severity`` of a failure (one
    of the three every version of the Policy WG's schema accepts)."""

    category: str
    severity: str


# In the order ``docs/rules.md`` lists them.
CONCERNS: dict[str, Concern] = {
    "profile": Concern("Profiles", "medium"),
    "resources": Concern("Resources", "medium"),
    "security": Concern("Pod security", "high"),
    "volumes": Concern("Volumes", "high"),
    "secrets": Concern("Secrets", "high"),
    "scheduling": Concern("Scheduling", "medium"),
    "scope": Concern("Scope", "high"),
    "ownership": Concern("Ownership", "high"),
    "queue": Concern("Queues", "medium"),
    "update": Concern("Updates", "medium"),
    "input": Concern("Input", "medium"),
    "engine": Concern("Engine", "medium"),
    # Not the webhooks': the results ``runguard audit`` files about the policy objects
    # and about the doors only RBAC can close.
    "policy": Concern("Policy", "medium"),
    "rbac": Concern("RBAC", "high"),
}


@dataclass(frozen=True)
class _Declared:
    id: str

    @property
    def concern(self) -> str:
        return self.id.partition(".")[0]


@dataclass(frozen=True)
class Rule(_Declared):
    """A rule id with what each webhook does under it ("" where it does nothing), and
    the module that declares it."""

    mutation: str
    violation: str
    module: str

    @property
    def category(self) -> str:
        return CONCERNS[self.concern].category

    @property
    def severity(self) -> str:
        return CONCERNS[self.concern].severity


@dataclass(frozen=True)
class ReportRule(_Declared):
    """An id no webhook judges under, only ``runguard audit`` reports: the policy
    objects' results, and each door only RBAC can close."""

    description: str
    module: str


class Declarations:
    """The rule ids one module emits, in the order it declares them."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.rules: list[Rule] = []
        self.reported: list[ReportRule] = []

    def _check(self, rule_id: str) -> None:
        declared = {r.id for r in self.rules} | {r.id for r in self.reported}
        assert rule_id not in declared, f"rule {rule_id} declared twice"
        assert rule_id.partition(".")[0] in CONCERNS, f"rule {rule_id}: no such concern"

    def rule(self, rule_id: str, *, mutation: str, violation: str) -> str:
        """A rule the webhooks mutate or judge under; returns ``rule_id``."""
        self._check(rule_id)
        self.rules.append(Rule(rule_id, mutation, violation, self.module))
        return rule_id

    def report(self, rule_id: str, description: str) -> str:
        """An id only ``runguard audit`` reports; returns ``rule_id``."""
        self._check(rule_id)
        self.reported.append(ReportRule(rule_id, description, self.module))
        return rule_id


def collect(declarations: Iterable[Declarations]) -> tuple[dict[str, Rule], dict[str, ReportRule]]:
    """Every rule and every report-only id of ``declarations``, each once: listed by
    concern (``CONCERNS``' order), then in the order of ``declarations``, then as each
    module declares them."""
    rules: dict[str, Rule] = {}
    reported: dict[str, ReportRule] = {}
    for d in declarations:
        for rule in d.rules:
            assert rule.id not in rules, f"rule {rule.id} declared in {rules[rule.id].module} too"
            rules[rule.id] = rule
        for report in d.reported:
            assert report.id not in reported, f"{report.id} declared twice"
            reported[report.id] = report
    assert not rules.keys() & reported.keys(), "an id both judged and only reported"
    order = list(CONCERNS)

    def by_concern(r: Rule | ReportRule) -> int:
        return order.index(r.concern)

    return (
        {r.id: r for r in sorted(rules.values(), key=by_concern)},
        {r.id: r for r in sorted(reported.values(), key=by_concern)},
    )
