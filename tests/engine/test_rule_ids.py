"""Every rule id declared once, beside the code that emits it, documented and tested.

A module declares the ids it emits (``RULES = Declarations(__name__)``, then
``X = RULES.rule("concern.name", ...)`` or ``RULES.report(...)``);
``webhook.engine.registry`` collects the engine's, ``runguard rules`` adds the ids only
``runguard audit`` reports. The code names rules by the declared constants: a rule id
written as a string anywhere else in ``webhook/`` fails here, so a rule cannot be
added, renamed or dropped without its declaration; ``docs/rules.md`` is generated from
the declarations; and every declared rule is exercised by at least one test or case.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

import yaml
from harness import REPO

from webhook.cli import main
from webhook.cli.rules import registered, rules_markdown
from webhook.engine import registry
from webhook.engine.rule import CONCERNS
from webhook.engine.rules import CHECKS, MUTATION_STEPS
from webhook.engine.rules.trust import OBJECT_CHECKS, TRUST_CHECKS

RULES, REPORT_RULES = registered()
# What a rule id looks like: a known concern, a dot, a lower-case name.
SHAPE = re.compile(rf"^(?:{'|'.join(sorted(CONCERNS))})\.[a-z][a-z-]*$")
NOT_RULES = {"input.yaml", "rbac.yaml"}  # file names, not rules
DECLARE = ("rule", "report")  # the methods of ``Declarations``


class Declared(NamedTuple):
    rule_id: str
    module: str  # dotted
    constant: str  # the name the module binds it to
    node: ast.Call


def webhook_modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted((REPO / "webhook").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return out


MODULES = webhook_modules()


def is_declaration(node: ast.AST) -> bool:
    """``RULES.rule("id", ...)`` or ``RULES.report("id", ...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in DECLARE
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "RULES"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def declarations() -> list[Declared]:
    """Every declaration in ``webhook/``, read from the source (not imported)."""
    found = []
    for module, tree in MODULES.items():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and is_declaration(node.value)
            ):
                assert isinstance(node.value, ast.Call)
                rule_id = node.value.args[0].value  # type: ignore[attr-defined]
                found.append(Declared(rule_id, module, node.targets[0].id, node.value))
    return found


def test_docs_rules_md_is_generated_from_the_declarations() -> None:
    assert (REPO / "docs" / "rules.md").read_text() == rules_markdown(), (
        "docs/rules.md is stale: run `runguard rules -o docs/rules.md`"
    )


def test_runguard_rules_prints_the_table(capsys: object) -> None:
    assert main(["rules"]) == 0
    out, _ = capsys.readouterr()  # type: ignore[attr-defined]
    assert out == rules_markdown()
    assert all(f"| `{rule_id}` |" in out for rule_id in (*RULES, *REPORT_RULES))


def test_no_rule_id_is_a_bare_string_outside_its_declaration() -> None:
    """The only string literal shaped like a rule id is the id in its declaration."""
    found = []
    for module, tree in MODULES.items():
        declared_ids = {id(node.args[0]) for node in ast.walk(tree) if is_declaration(node)}
        found += [
            f"{module}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SHAPE.match(node.value)
            and node.value not in NOT_RULES
            and id(node) not in declared_ids
        ]
    assert not found, "rule ids written as strings (use the declared constant): " + str(found)


def test_every_id_is_declared_exactly_once_and_registered() -> None:
    """Read from the source: each id has one declaration in all of ``webhook/``, at
    module level; the registry (and ``runguard rules``) holds exactly those, each
    with the module that declares it."""
    found = declarations()
    ids = [d.rule_id for d in found]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    calls = sum(1 for tree in MODULES.values() for n in ast.walk(tree) if is_declaration(n))
    assert calls == len(found), "a declaration not bound to a module-level constant"
    where = {d.rule_id: d.module for d in found}
    assert where == {r.id: r.module for r in (*RULES.values(), *REPORT_RULES.values())}
    # the engine's ids are the engine's modules', and the registry lists them all
    engine = {d.module for d in registry.DECLARATIONS}
    assert {m for i, m in where.items() if i in RULES} == engine
    assert all(m.startswith("webhook.engine.") for m in engine)


def test_each_declaration_sits_in_the_module_whose_code_emits_it() -> None:
    """The constant a module declares is used by that module's own code (beyond the
    declaration): the rule is declared where it is mutated, checked or reported."""
    unused = []
    for d in declarations():
        loads = [
            node
            for node in ast.walk(MODULES[d.module])
            if isinstance(node, ast.Name)
            and node.id == d.constant
            and isinstance(node.ctx, ast.Load)
        ]
        if not loads:
            unused.append(f"{d.module}: {d.constant} ({d.rule_id})")
    assert not unused, "declared where no code uses it: " + str(unused)


def rule_argument(call: ast.Call) -> ast.expr | None:
    """The rule of ``Violation(rule, ...)`` / ``Change(rule, ...)``."""
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "rule"), None)


def test_every_id_the_engine_can_emit_is_registered() -> None:
    """Every ``Violation`` and ``Change`` the engine builds names its rule by a
    registered constant (imported from the module declaring it, or an alias of one
    there), or passes on the rule of another violation or change."""
    constants = {(d.module, d.constant): d.rule_id for d in declarations()}
    names_of = {c: m for m, c in constants}  # constant -> declaring module
    aliases = {}  # e.g. ``INVALID = INPUT_INVALID``
    for module, tree in MODULES.items():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and node.value.id in names_of
                and isinstance(node.targets[0], ast.Name)
            ):
                aliases[(module, node.targets[0].id)] = node.value.id
    unregistered, passed_on = [], 0
    for module, tree in MODULES.items():
        if not module.startswith("webhook.engine"):
            continue
        imported = {
            alias.asname or alias.name: (node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("Violation", "Change")
            ):
                continue
            arg = rule_argument(node)
            if isinstance(arg, ast.Name) and arg.id.isupper():
                name = arg.id
                source, original = imported.get(name, (module, name))
                original = aliases.get((source, original), original)
                if constants.get((names_of.get(original, ""), original)) not in RULES:
                    unregistered.append(f"{module}:{node.lineno}: {name}")
            elif isinstance(arg, (ast.Attribute, ast.Name)):
                passed_on += 1  # ``c.rule``, a ``rule`` parameter: another's rule
            else:
                unregistered.append(f"{module}:{node.lineno}: {ast.unparse(arg or node)}")
    assert not unregistered, unregistered
    assert passed_on < 10, "most rules are named by their constant"


def test_every_id_the_cases_expect_of_the_engine_is_registered() -> None:
    """The other side, from the engine's answers: every rule id a declarative case
    expects among the violations or mutations (``tests/engine/test_cases.py`` holds the engine
    to each) is in the registry."""
    ids: set[str] = set()
    for path in sorted((REPO / "tests" / "cases").rglob("case.yaml")):
        expect = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("expect") or []
        for each in expect if isinstance(expect, list) else [expect]:
            ids.update(each.get("violations") or [])
            ids.update(each.get("mutations") or [])
    assert len(ids) >= 20, sorted(ids)
    assert ids <= RULES.keys(), sorted(ids - RULES.keys())


def test_the_pipeline_runs_only_the_registrys_modules() -> None:
    """Every mutation step and check the engine runs is a function of a module the
    registry collects (or of the pod security module's companions it reads)."""
    engine = {d.module for d in registry.DECLARATIONS}
    steps = [*MUTATION_STEPS, *CHECKS, *TRUST_CHECKS]
    outside = [f"{f.__module__}.{f.__qualname__}" for f in steps if f.__module__ not in engine]
    assert not outside, outside
    assert all(f.__module__ in engine for f in OBJECT_CHECKS)  # lambdas of trust.py


def test_every_rule_has_a_concern_and_a_description() -> None:
    for rule in RULES.values():
        assert rule.category and rule.severity in ("low", "medium", "high"), rule.id
        assert rule.mutation or rule.violation, rule.id
    for report in REPORT_RULES.values():
        assert report.concern in CONCERNS and report.description, report.id


def test_every_rule_is_exercised_by_a_test() -> None:
    """The coverage list, from the declarations: each rule id appears in a test or a
    case's expectations (as the id, or as the declared constant)."""
    texts = [p.read_text(encoding="utf-8") for p in (REPO / "tests").rglob("*.py")]
    texts += [p.read_text(encoding="utf-8") for p in (REPO / "tests" / "cases").rglob("*.yaml")]
    corpus = "\n".join(texts)
    untested = [
        rule_id
        for rule_id in (*RULES, *REPORT_RULES)
        if rule_id not in corpus
        and rule_id.upper().replace(".", "_").replace("-", "_") not in corpus
    ]
    assert not untested, f"rules no test names: {untested}"
