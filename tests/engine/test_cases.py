"""The declarative cases under tests/cases, each a pytest test, through the same runner as
``runguard test``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness import TESTS

from webhook.audit.casetest import find_cases, run_case

CASES = TESTS / "cases"
ALL = find_cases(CASES)


def test_enough_cases_cover_every_rule() -> None:
    rules = set()
    for folder in ALL:
        rules.update(
            word.strip("[],'\" ")
            for word in (folder / "case.yaml").read_text().split()
            if "." in word
            and word.strip("[],'\" ").split(".")[0]
            in {"profile", "resources", "security", "volumes", "secrets", "scheduling", "input"}
        )
    expected = {
        "profile.unknown",
        "resources.exceeded",
        "resources.gpu-mismatch",
        "security.root",
        "security.privileged",
        "security.capabilities",
        "security.host-namespace",
        "security.host-ports",
        "security.sysctls",
        "security.selinux",
        "security.apparmor",
        "security.seccomp",
        "security.proc-mount",
        "security.probe-host",
        "volumes.forbidden-type",
        "volumes.pre-existing",
        "secrets.forbidden",
        "scheduling.priority-class",
        "scheduling.preemption-mode",
        "input.invalid",
    }
    assert len(ALL) >= 40
    assert expected <= rules, expected - rules


@pytest.mark.parametrize("folder", ALL, ids=[f.name for f in ALL])
def test_case(folder: Path) -> None:
    result = run_case(folder, CASES)
    assert result.passed, "\n".join(result.failures)


def test_cli_runs_the_same_cases() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "test", str(CASES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(ALL)} passed, 0 failed" in proc.stdout
    assert proc.stdout.count("PASS ") == len(ALL)


def test_cli_reports_a_failing_case(tmp_path: Path) -> None:
    case = tmp_path / "wrong"
    case.mkdir()
    (case / "input.yaml").write_text((CASES / "host-namespaces" / "input.yaml").read_text())
    (case / "case.yaml").write_text(
        f"policy: {CASES / '_policies' / 'platform'}\nexpect: {{allowed: true}}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "test", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "FAIL wrong" in proc.stdout
    assert "allowed is False, expected True" in proc.stdout
    assert "0 passed, 1 failed" in proc.stdout


def test_cli_without_cases_is_an_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "webhook", "test", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "no case folders" in proc.stderr
