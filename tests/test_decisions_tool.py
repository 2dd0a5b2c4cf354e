"""``harness.decisions`` (``bench/decisions.py``'s tool), the record of every decision a
speed-only change must keep: it sees a change of any one step, and an unchanged engine
gives the same record twice."""

from __future__ import annotations

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
