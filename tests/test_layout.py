"""The tests are laid out like the package: a folder per package of ``webhook/`` they test
(``tests/engine/``, ``tests/policy/``, ...; the attack chains in ``tests/engine/attacks/``),
``tests/e2e/`` against a real apiserver, and at the top only what covers the whole
repository. No test module outside ``tests/e2e/`` imports another: what several share is
in ``tests/harness/`` (docs/dev/contributing.md, "Tests: where they go and where the
harness is")."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from harness import REPO

TESTS = REPO / "tests"
LOOSE = 15  # files at the top of tests/: conftest.py and the checks of the whole repository
BESIDE_THE_PACKAGE = {"e2e", "harness"}  # the real apiserver's tests; what the tests share
DATA = {"cases", "openreports", "platforms"}  # what the tests read, no test module in them


def imported_test_modules(path: Path) -> Iterator[str]:
    """Every test module (``test_*``) the file at ``path`` imports, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (f"{node.module}." if node.module else "")
            names = [base + alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if any(part.startswith("test_") for part in name.split(".")):
                yield f"{node.lineno}: {name}"


def test_no_test_module_imports_another() -> None:
    """``tests/e2e/`` aside: its modules share one cluster session and keep their layout."""
    found = [
        f"{path.relative_to(TESTS)}:{hit}"
        for path in sorted(TESTS.rglob("*.py"))
        if "e2e" not in path.relative_to(TESTS).parts
        for hit in imported_test_modules(path)
    ]
    assert not found, found


def test_the_test_import_finder_finds_them(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text(
        "from test_trust import ALICE\n"
        "import test_doors\n"
        "from .test_templates import QUEUE\n"
        "from . import test_shells\n"
        "def f():\n"
        "    from engine.test_trust import pod\n"
        "from harness.shipped import ALICE\n"
        "import harness.inputs\n"
    )
    assert list(imported_test_modules(source)) == [
        "1: test_trust.ALICE",
        "2: test_doors",
        "3: .test_templates.QUEUE",
        "4: .test_shells",
        "6: engine.test_trust.pod",
    ]


def test_few_files_are_loose_at_the_top() -> None:
    loose = sorted(path.name for path in TESTS.iterdir() if path.is_file())
    assert "conftest.py" in loose and len(loose) <= LOOSE, loose


def test_every_folder_of_tests_is_a_package_of_webhook() -> None:
    """A folder of test modules is named after the package of ``webhook/`` it tests (or
    ``tests/e2e/``), and is a package (``__init__.py``): two modules of one name in two
    folders stay two modules."""
    packages = {path.parent.name for path in (REPO / "webhook").glob("*/__init__.py")}
    folders = {path.parent for path in TESTS.rglob("test_*.py")} - {TESTS}
    assert folders, "no test module in a folder"
    for folder in sorted(folders):
        top = folder.relative_to(TESTS).parts[0]
        assert top in packages | BESIDE_THE_PACKAGE and top not in DATA, folder
        for package in [folder, *folder.parents]:
            if package == TESTS:
                break
            assert (package / "__init__.py").is_file(), package
