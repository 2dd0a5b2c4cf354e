"""``harness.decisions`` (``bench/decisions.py``'s tool), the record of every decision a
speed-only change must keep: it sees a change of any one step, and an unchanged engine
gives the same record twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harness import decisions

from webhook.engine import rules
from webhook.engine.rules import security

INPUTS = decisions.generate()[:120]


def _records() -> list[str]:
    return [
        decisions._line(name, decisions.decisions(obj, policy, context))
        for name, obj, policy, context in decisions.cases(INPUTS)
    ]


def test_the_same_engine_gives_the_same_record() -> None:
    assert _records() == _records()


def test_a_step_left_out_changes_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _records()
    steps = tuple(s for s in rules.MUTATION_STEPS if s is not security.strip_root)
    monkeypatch.setattr(rules, "MUTATION_STEPS", steps)
    after = _records()
    changed = [a for a, b in zip(before, after, strict=True) if a != b]
    assert changed, "no decision changed without the root stripping step"


def test_policies_from_another_checkout_are_read_there_and_a_missing_one_skipped(
    tmp_path: Path,
) -> None:
    """``--policies-from``: the directories are read from that checkout; one it lacks
    gives its inputs no policy (skipped on both sides, not a difference)."""
    directory = INPUTS[0][2]
    shutil.copytree(decisions.ROOT / directory, tmp_path / directory)
    other = ("elsewhere", INPUTS[0][1], "tests/cases/_policies/not-there", 0)
    judged = list(decisions.cases([INPUTS[0], other], tmp_path))
    assert (
        judged[0][2] is not None
        and judged[0][2].digest == next(decisions.cases(INPUTS[:1]))[2].digest
    )
    assert judged[1][2:] == (None, None)
