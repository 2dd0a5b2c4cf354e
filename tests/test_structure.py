"""The shape of the package: no import circles, modules of a readable size, settings
declared once."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

from webhook.serving.settings import SETTINGS, ServeSettings

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "webhook"
MAX_LINES = 400  # past this, a module says why in its docstring ("one job: ...")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every ``webhook`` module that ``name`` imports, at any depth of the file
    (function-level imports and ``if TYPE_CHECKING:`` blocks included)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up ``level - 1``
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from webhook import metrics`` imports the module webhook.serving.metrics
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # ``import webhook.policy.loader`` names the module, or a name inside one
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("webhook") and target != name:
                yield target


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: set(imported(name, path, modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles_among_webhook_modules() -> None:
    graph = import_graph()
    assert graph["webhook.serving.server"] >= {
        "webhook.serving.policystore",
        "webhook.serving.settings",
        "webhook.serving.tls",
    }
    assert (
        "webhook.serving.app" in graph["webhook.serving.server"]
    )  # the function-level import is seen
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_circles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_nested_imports_are_seen(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from . import metrics\n"
        "from .policy.model import Policy\n"
        "def f():\n"
        "    import webhook.app\n"
        "    from webhook.policy import loader\n"
    )
    modules = {
        m: source for m in ("webhook.m", "webhook.metrics", "webhook.policy.model", "webhook.app")
    }
    modules["webhook.policy.loader"] = source
    modules["webhook.policy"] = source
    assert set(imported("webhook.m", source, modules)) == {
        "webhook.metrics",
        "webhook.policy.model",
        "webhook.app",
        "webhook.policy.loader",
    }


def serving_modules() -> dict[str, Path]:
    """The serving layer: what ``runguard serve`` imports, the engine and the policy
    model aside (their size is their owners' call)."""
    graph, modules = import_graph(), package_modules()
    seen, todo = set(), ["webhook.cli.serve"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    others = ("webhook.engine", "webhook.policy", "webhook.inputs.quantity")
    return {
        name: modules[name]
        for name in sorted(seen)
        if not any(name == o or name.startswith(o + ".") for o in others)
    }


def test_no_serving_module_over_400_lines_without_a_reason() -> None:
    modules = serving_modules()
    assert {"webhook.serving.app", "webhook.serving.policystore", "webhook.serving.server"} <= set(
        modules
    )
    too_long = []
    for name, path in modules.items():
        text = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > MAX_LINES and not re.search(r"\bone job\b", doc, re.I):
            too_long.append(f"{name}: {text.count(chr(10))} lines")
    assert not too_long, too_long


def test_every_serve_setting_is_declared_once() -> None:
    fields = [field.name for field in dataclasses.fields(ServeSettings)]
    assert [setting.name for setting in SETTINGS] == fields
    envs = [setting.env for setting in SETTINGS]
    assert len(set(envs)) == len(envs) and all(e.startswith("RUNGUARD_") for e in envs)
    # No other module of the package spells an environment variable name of its own.
    spelled = re.compile(r"""["']RUNGUARD_[A-Z_]+["']""")
    for name, path in package_modules().items():
        if name != "webhook.serving.settings":
            assert not spelled.findall(path.read_text(encoding="utf-8")), name


def test_the_top_of_webhook_shows_the_architecture() -> None:
    """At most ten modules beside the packages (serving, install, audit, inputs, engine,
    policy, ...): a newcomer reads the layers off the directory listing."""
    top = sorted(p.name for p in (REPO / "webhook").glob("*.py"))
    assert len(top) <= 10, top
    packages = {p.name for p in (REPO / "webhook").iterdir() if (p / "__init__.py").exists()}
    assert {"serving", "install", "audit", "inputs", "engine", "policy", "cli"} <= packages


def test_every_runguard_key_is_declared_once() -> None:
    """A ``runguard.io/`` label or annotation key is spelled in ``webhook/keys.py`` only;
    everything else names it by its constant."""
    key = re.compile(r"runguard\.io/(?!v[0-9]+$)[a-z0-9.-]+")  # not the API version
    spelled = []
    for path in sorted((REPO / "webhook").rglob("*.py")):
        if path.name == "keys.py" and path.parent.name == "webhook":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and key.fullmatch(node.value)
            ):
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value}")
    assert not spelled, spelled
