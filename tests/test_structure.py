"""The shape of the package: no import circles (``webhook/``, ``bench/`` and the tests'
harness), layers that hold (a table of which package of ``webhook/`` imports which),
modules of a readable size (every module of ``webhook/`` at most 500 lines, a serving
module at most 400: no list of exceptions, no docstring that excuses one), no function
over cyclomatic complexity 20 (and no mark excusing one), settings declared once, an
engine that loads no I/O layer, and tests that import nothing of ``bench/``."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Set
from pathlib import Path

from webhook.serving.settings import SETTINGS, ServeSettings

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "webhook"
BENCH = REPO / "bench"
TESTS = REPO / "tests"
MAX_LINES = 400  # a serving module (the hot path a reviewer reads first)
MODULE_LINES = 500  # any module of webhook/


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def bench_names() -> set[str]:
    """What a bench script imports another by (``bench/`` is its import path): its stem."""
    return {path.stem for path in BENCH.glob("*.py")}


def all_modules() -> dict[str, Path]:
    """``webhook``'s modules, the bench scripts (``bench.<stem>``) and the tests' harness
    (``harness.*``, imported so from ``tests/``)."""
    modules = package_modules()
    modules.update({f"bench.{path.stem}": path for path in sorted(BENCH.glob("*.py"))})
    harness = sorted((TESTS / "harness").rglob("*.py"))
    modules.update({module_name(path, TESTS): path for path in harness})
    return modules


def imported(
    name: str, path: Path, modules: dict[str, Path], top_level: Set[str] = frozenset()
) -> Iterator[str]:
    """Every module of ``modules`` that ``name`` imports, at any depth of the file
    (function-level imports, ``if TYPE_CHECKING:`` blocks and ``importlib.import_module``
    of a literal name included); ``import x`` of a name in ``top_level`` is ``bench.x``
    (a bench script's import of another)."""
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
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):  # an import by name is an import all the same
            targets = [node.args[0].value]
        else:
            continue
        for target in targets:
            if target.partition(".")[0] in top_level:
                target = f"bench.{target}"
            # ``import webhook.policy.loader`` names the module, or a name inside one
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def import_graph() -> dict[str, set[str]]:
    """Who imports whom among ``all_modules()``."""
    modules, top_level = all_modules(), bench_names()
    return {
        name: set(imported(name, path, modules, top_level if name.startswith("bench.") else set()))
        for name, path in modules.items()
    }


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


def test_no_import_circles_among_webhook_bench_and_harness_modules() -> None:
    graph = import_graph()
    serving = "webhook.serving"
    wanted = {f"{serving}.{m}" for m in ("policystore", "settings", "tls")}
    assert graph[f"{serving}.server"] >= wanted
    assert f"{serving}.app" in graph[f"{serving}.server"]  # the function-level import is seen
    # the bench scripts' imports of each other and of the harness are seen
    assert graph["bench.bench_all"] >= {"bench.bench_opa", "bench.bench_config"}
    assert "harness.slow_clients" in graph["bench.bench_all"]
    assert "harness.workloads" in graph["harness.soak"]  # relative, inside the harness
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
        "    import webhook.serving.app\n"
        "    from webhook.policy import loader\n"
        "    importlib.import_module('webhook.inputs.quantity')\n"
    )
    names = ("webhook.m", "webhook.metrics", "webhook.policy.model", "webhook.serving.app")
    modules = {m: source for m in names}
    modules["webhook.policy.loader"] = source
    modules["webhook.policy"] = source
    modules["webhook.inputs.quantity"] = source
    assert set(imported("webhook.m", source, modules)) == {
        "webhook.metrics",
        "webhook.policy.model",
        "webhook.serving.app",
        "webhook.policy.loader",
        "webhook.inputs.quantity",
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


def test_no_serving_module_over_400_lines() -> None:
    modules = serving_modules()
    assert {"webhook.serving.app", "webhook.serving.policystore", "webhook.serving.server"} <= set(
        modules
    )
    too_long = [
        f"{name}: {line_count(path)} lines"
        for name, path in modules.items()
        if line_count(path) > MAX_LINES
    ]
    assert not too_long, f"split by concern: {too_long}"


def line_count(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n")


def test_no_webhook_module_over_500_lines() -> None:
    """A module past ``MODULE_LINES`` is split by concern: no list of exceptions, and no
    docstring excuses one."""
    too_long = [
        f"{name}: {line_count(path)} lines"
        for name, path in package_modules().items()
        if line_count(path) > MODULE_LINES
    ]
    assert not too_long, f"split by concern: {too_long}"


MAX_COMPLEXITY = 20  # cyclomatic, per function of webhook/
BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Cyclomatic complexity of ``function``, its nested functions and classes apart:
    1, plus one per branch, loop, handler and case, per comprehension and each of its
    conditions, and per extra operand of ``and`` / ``or``. Stricter than ruff's C901
    (which counts no boolean operand): both hold the bound of 20."""
    count, todo = 1, list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, (*FUNCTIONS, ast.ClassDef)):
            continue  # measured on its own
        if isinstance(node, BRANCHES):
            count += 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        todo.extend(ast.iter_child_nodes(node))
    return count


def too_complex(source: str, name: str) -> Iterator[str]:
    """Each function of ``source`` over ``MAX_COMPLEXITY``, marked or not."""
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, FUNCTIONS) and (measured := complexity(node)) > MAX_COMPLEXITY:
            yield f"{name}:{node.lineno} {node.name}: {measured}"


def test_no_function_of_webhook_over_complexity_20() -> None:
    """No function over the bound (split it: a table, or steps), and no ``# noqa``
    silencing ruff's C901 on one either: the bound holds without exceptions."""
    found = [
        hit
        for name, path in package_modules().items()
        for hit in too_complex(path.read_text(encoding="utf-8"), name)
    ]
    assert not found, found
    marked = [name for name, path in package_modules().items()
              if "noqa: C901" in path.read_text(encoding="utf-8")]  # fmt: skip
    assert not marked, marked


def test_the_complexity_measure_counts_branches_and_operands() -> None:
    branches = "\n".join(f"    if x == {i} and y:\n        return {i}" for i in range(10))
    source = f"def f(x, y):\n{branches}\n    return [z for z in y if z]\n"
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    assert complexity(function) == 1 + 10 * 2 + 2
    assert list(too_complex(source, "m")) == ["m:1 f: 23"]
    marked = source.replace("(x, y):", "(x, y):  # noqa: C901", 1)
    assert list(too_complex(marked, "m")) == ["m:1 f: 23"]


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


# The I/O layers the engine must not load: its callers (the server, the CLI, the watch)
# bring them; ``import webhook.engine`` stays a pure import.
IO_LAYERS = ("kubernetes", "jsonschema", "requests", "urllib3", "flask")


def modules_loaded_by(*imports: str) -> set[str]:
    """Every module a fresh interpreter holds after importing ``imports``."""
    probe = (
        f"import json, sys\nimport {', '.join(imports)}\nprint(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_the_engine_imports_no_io_layer() -> None:
    loaded = {name.partition(".")[0] for name in modules_loaded_by("webhook.engine")}
    assert "webhook" in loaded and "pydantic" in loaded  # the probe saw the import
    assert not loaded & set(IO_LAYERS), sorted(loaded & set(IO_LAYERS))


# Which of ``webhook``'s packages each may import (its own modules aside): the lower
# layers (inputs, policy, clusterstate, engine) never reach up into the server, the
# installer, the audit or the CLI; the watch processes' programs (``watches``) sit above
# what they drive. A top-level module (``keys``) is a package of its own here.
LOWER = frozenset({"inputs", "keys", "policy", "clusterstate"})
LAYERS: dict[str, frozenset[str]] = {
    "webhook": frozenset(),
    "keys": frozenset(),
    "inputs": frozenset(),
    "policy": frozenset({"inputs", "keys", "clusterstate"}),
    "clusterstate": frozenset({"inputs", "keys", "policy"}),
    "engine": LOWER,
    "install": LOWER | {"engine"},
    "audit": LOWER | {"engine", "install"},
    "serving": LOWER | {"engine"},
    "watches": LOWER | {"install", "serving"},
    "cli": LOWER | {"engine", "install", "audit", "serving", "watches"},
    "__main__": frozenset({"cli"}),
}
UPPER = ("serving", "install", "cli", "audit", "watches")


def layer(module: str) -> str:
    """The package of ``webhook`` a module belongs to (``webhook.engine.rules.x``: engine)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph``'s webhook modules that the table of layers does not allow."""
    breaches = []
    for name in sorted(graph):
        if not name.startswith("webhook"):
            continue
        allowed = LAYERS.get(layer(name))
        for target in sorted(graph[name]):
            if target == "webhook" or layer(target) == layer(name):
                continue  # the package itself (its version) is everyone's
            if allowed is None or layer(target) not in allowed:
                breaches.append(f"{name} -> {target}")
    return breaches


def test_every_package_of_webhook_has_its_layer() -> None:
    packages = {layer(name) for name in package_modules()}
    assert packages == set(LAYERS), sorted(packages ^ set(LAYERS))


def test_the_layers_hold() -> None:
    """The lower layers import nothing of the server, the installer, the audit or the
    CLI; each package only what the table allows (imports in functions included)."""
    breaches = layer_breaches(import_graph())
    assert not breaches, breaches


def test_the_layer_check_finds_a_breach() -> None:
    graph = {
        "webhook.inputs.documents": {"webhook.serving.settings", "webhook.inputs.quantity"},
        "webhook.engine.review": {"webhook.policy.model", "webhook.keys"},
        "webhook.policy.source": {"webhook.install.manifests"},
        "webhook.cli.serve": {"webhook.serving.server"},
    }
    assert layer_breaches(graph) == [
        "webhook.inputs.documents -> webhook.serving.settings",
        "webhook.policy.source -> webhook.install.manifests",
    ]


def test_importing_a_lower_layer_loads_no_upper_one() -> None:
    """``import webhook.engine`` (and the policy, the inputs, the cluster state) loads
    none of the server, the installer, the audit, the CLI or the watch programs."""
    loaded = modules_loaded_by(
        "webhook.engine",
        "webhook.policy.source",
        "webhook.policy.mirror.process",
        "webhook.inputs.limits",
        "webhook.inputs.kubeconfig",
        "webhook.clusterstate.watch",
    )
    assert "webhook.engine.review" in loaded and "webhook.inputs.limits" in loaded
    upper = sorted(name for name in loaded if name.startswith("webhook.") and layer(name) in UPPER)
    assert not upper, upper


def _targets(node: ast.Assign | ast.AugAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _bench_imports(path: Path, bench: set[str]) -> Iterator[str]:
    """Where the test file ``path`` imports ``bench/``: an import of ``bench`` or of a
    bench script by its name, or ``bench/`` put on the import path."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Call | ast.Assign | ast.AugAssign):
            changed = [node.func] if isinstance(node, ast.Call) else _targets(node)
            names = []
            text = ast.unparse(node)
            if any(ast.unparse(c).startswith("sys.path") for c in changed) and "bench" in text:
                yield f"{path.name}:{node.lineno}: {text[:80]}"
        else:
            continue
        for imported_name in names:
            top = imported_name.partition(".")[0]
            if top == "bench" or top in bench:
                yield f"{path.name}:{node.lineno}: import {imported_name}"


def test_no_test_imports_bench() -> None:
    """The benchmarks are not part of what the tests need: shared pieces live in
    ``tests/harness`` (the benchmarks import them, never the other way)."""
    bench = bench_names()
    assert {"bench_config", "bench_http"} <= bench
    found = [hit for path in sorted(TESTS.rglob("*.py")) for hit in _bench_imports(path, bench)]
    assert not found, found


def test_the_bench_import_finder_finds_them(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text(
        "import sys\n"
        "sys.path.insert(0, str(REPO / 'bench'))\n"
        "import bench_http\n"
        "from bench.trivial_app import create_app\n"
        "from harness import soak\n"
    )
    source.write_text(source.read_text() + "sys.path[:0] = ['bench']\nprint('bench')\n")
    hits = list(_bench_imports(source, {"bench_http", "trivial_app"}))
    assert sorted(int(hit.split(":")[1]) for hit in hits) == [2, 3, 4, 6], hits
