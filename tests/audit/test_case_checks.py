"""What ``runguard test`` says of a case that fails or cannot run: each expectation a
decision misses, in the order of the expect keys, and each broken case file."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import TESTS

from webhook.audit.casetest import EXPECT_KEYS, CaseError, check, run_case
from webhook.engine import evaluate
from webhook.inputs.documents import read_objects
from webhook.policy.loader import load_policy

CASES = TESTS / "cases"
POLICY = CASES / "_policies" / "platform"
HOST_NAMESPACES = CASES / "host-namespaces" / "input.yaml"  # denied: 3 host namespaces


def test_every_missed_expectation_is_said_in_the_order_of_the_keys() -> None:
    decision = evaluate(read_objects(str(HOST_NAMESPACES))[0], load_policy(str(POLICY)))
    expect = {
        "absent": ["spec.hostNetwork"],
        "objectSubset": {"spec": {"hostPID": False}},
        "patch": "empty",
        "warnings": ["nowhere"],
        "mutations": ["m"],
        "violations": ["a"],
        "profile": "x",
        "applies": False,
        "allowed": True,
    }
    failures = check(decision, expect, CASES)
    assert [f.split(" ")[0] for f in failures] == [
        "allowed",
        "applies",
        "profile",
        "violations",
        "mutations",
        "no",
        "patch",
        "object",
        "spec.hostNetwork",
    ]
    assert failures[0].startswith("allowed is False, expected True: runguard denied Pod train")
    assert failures[1:3] == [
        "applies is True, expected False",
        "profile is 'default', expected 'x'",
    ]
    assert failures[3].startswith(
        "violations ['security.host-namespace', 'security.host-namespace', "
        "'security.host-namespace'], expected ['a'] ([security.host-namespace] spec.hostNetwork:"
    )
    assert failures[4] == (
        "mutations ['profile.applied', 'security.defaults', 'scheduling.priority-class', "
        "'scheduling.preemption-mode'], expected ['m']"
    )
    assert failures[5].startswith("no warning contains 'nowhere' (warnings: ['runguard: profile")
    assert failures[6].startswith("patch is [{") and failures[6].endswith("], expected empty")
    assert failures[7:] == [
        "object subset differs: spec.hostPID: True, want False",
        "spec.hostNetwork should be absent, is True",
    ]
    met = {"allowed": False, "violations": ["security.host-namespace"] * 3, "patch": "nonempty"}
    assert check(decision, met, CASES) == []


def test_an_expect_entry_is_checked_before_the_decision() -> None:
    decision = evaluate(read_objects(str(HOST_NAMESPACES))[0], load_policy(str(POLICY)))
    for expect, said in (
        ([], "each expect entry must be a mapping"),
        ({"allowd": True}, "expect: unknown keys ['allowd']"),
        ({"warnings": "x"}, "expect.warnings must be a list of strings"),
    ):
        with pytest.raises(CaseError) as raised:
            check(decision, expect, CASES)
        assert str(raised.value) == said
    assert "objectSubset" in EXPECT_KEYS and len(EXPECT_KEYS) == 10


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("- a list", "case.yaml must be a mapping"),
        ("expct: {}", "case.yaml: unknown keys ['expct']"),
        ("input: input.yaml\nold: [{}, {}]", "old must hold as many objects as input (1)"),
        ("expect: [{}, {}]", "expect must be a mapping or a list of 1 mappings"),
        ("expect: {}\nnamespace: 3", "namespace must be a string"),
        ("expect: {}\nmode: admit", "mode 'admit' is not evaluate, mutate or validate"),
    ],
)
def test_a_broken_case_file_is_a_failure_of_its_own(tmp_path: Path, case: str, said: str) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "input.yaml").write_text(HOST_NAMESPACES.read_text())
    if not case.startswith("-"):
        case = f"description: broken\npolicy: {POLICY}\n{case}\n"
    (folder / "case.yaml").write_text(case)
    result = run_case(folder, tmp_path)
    assert (result.name, result.failures, result.bad_input) == ("broken", [said], True)


@pytest.mark.parametrize("mode", ["evaluate", "mutate", "validate"])
def test_each_mode_judges_every_object(tmp_path: Path, mode: str) -> None:
    pod = HOST_NAMESPACES.read_text()
    (tmp_path / "input.yaml").write_text(f"{pod}---\n{pod}")
    (tmp_path / "case.yaml").write_text(
        f"policy: {POLICY}\nmode: {mode}\nexpect: {{applies: false}}\n"
    )
    result = run_case(tmp_path)
    assert result.failures == [f"object {i}: applies is True, expected False" for i in (0, 1)]
