"""Every rule id declared once (``webhook/engine/rule_ids.py``), documented and tested.

The engine names rules by the registry's constants: a rule id written as a string
anywhere else in ``webhook/`` fails here, so a rule cannot be added, renamed or dropped
without its declaration; ``docs/rules.md`` is generated from the declarations; and
every declared rule is exercised by at least one test or case.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from webhook.cli import main
from webhook.engine.rule_ids import REPORT_RULES, RULES, rules_markdown

REPO = Path(__file__).resolve().parents[1]
CONCERNS = {rule.concern for rule in (*RULES.values(), *REPORT_RULES.values())}
# What a rule id looks like: a known concern, a dot, a lower-case name.
SHAPE = re.compile(rf"^(?:{'|'.join(sorted(CONCERNS))})\.[a-z][a-z-]*$")
NOT_RULES = {"input.yaml", "rbac.yaml"}  # file names, not rules


def string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_docs_rules_md_is_generated_from_the_declarations() -> None:
    assert (REPO / "docs" / "rules.md").read_text() == rules_markdown(), (
        "docs/rules.md is stale: run `runguard rules -o docs/rules.md`"
    )


def test_runguard_rules_prints_the_table(capsys: object) -> None:
    assert main(["rules"]) == 0
    out, _ = capsys.readouterr()  # type: ignore[attr-defined]
    assert out == rules_markdown()
    assert all(f"| `{rule_id}` |" in out for rule_id in RULES)


def test_no_rule_id_is_a_bare_string_outside_the_registry() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in sorted((REPO / "webhook").rglob("*.py"))
        if path.name != "rule_ids.py"
        for line, value in string_literals(path)
        if SHAPE.match(value) and value not in NOT_RULES
    ]
    assert not found, "rule ids written as strings (use webhook.engine.rule_ids): " + str(found)


def test_every_rule_has_a_concern_module_and_a_description() -> None:
    for rule in RULES.values():
        module = REPO / "webhook" / "engine" / "rules" / f"{rule.concern}.py"
        assert rule.category and rule.severity in ("low", "medium", "high"), rule.id
        assert module.exists() or rule.concern in {"update", "input", "engine"}, rule.id
        assert rule.mutation or rule.violation, rule.id


def test_every_rule_is_exercised_by_a_test() -> None:
    """The coverage list, from the declarations: each rule id appears in a test or a
    case's expectations (as the id, or as the registry constant)."""
    texts = [p.read_text(encoding="utf-8") for p in (REPO / "tests").rglob("*.py")]
    texts += [p.read_text(encoding="utf-8") for p in (REPO / "tests" / "cases").rglob("*.yaml")]
    corpus = "\n".join(texts)
    untested = [
        rule_id
        for rule_id in (*RULES, *REPORT_RULES)
        if rule_id not in corpus and rule_id.upper().replace(".", "_").replace("-", "_")
        not in corpus
    ]
    assert not untested, f"rules no test names: {untested}"
