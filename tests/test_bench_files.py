"""The benchmarks' generated files stay what the shipped policy renders (no silent drift).

The benchmarks' own commands check them (``--check-vap``, ``--check-policy``): the tests
import nothing of ``bench/``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [
        ["bench/bench_create.py", "--check-vap"],  # and the VAP says the rules it carries
        ["bench/bench_kyverno.py", "--check-policy"],
        ["bench/bench_cel.py", "--check-policy"],  # Kyverno's CEL pair, and MAP + VAP
    ],
    ids=["vap", "kyverno", "cel"],
)
def test_the_generated_file_is_the_one_policies_renders(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr or done.stdout


def test_make_test_never_builds_kyverno() -> None:
    """Only ``make bench`` (bench_all.py, through bench_kyverno.py) builds Kyverno."""
    makefile = (REPO / "Makefile").read_text()
    test_target = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "kyverno" not in test_target.lower()
    users = [p.name for p in (REPO / "bench").glob("*.py") if "kyverno/build.sh" in p.read_text()]
    assert users == ["bench_kyverno.py"]
