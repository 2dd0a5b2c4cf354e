"""``docs/policy-reference.md`` is generated from the model and kept up to date."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import REPO

from webhook.cli import main
from webhook.policy.declare import iter_keys
from webhook.policy.model import KINDS
from webhook.policy.reference import policy_reference

PUBLISHED = REPO / "docs" / "policy-reference.md"


def test_published_reference_is_up_to_date() -> None:
    # After changing the model: runguard schema --format markdown -o docs/policy-reference.md
    assert PUBLISHED.read_text(encoding="utf-8") == policy_reference()


def test_every_key_of_every_kind_has_a_row_with_a_description() -> None:
    text = policy_reference()
    for spec, _ in KINDS.values():
        for key in iter_keys(spec):
            row = next(
                (
                    line
                    for line in text.splitlines()
                    if line.startswith(f"| `spec.{'.'.join(key.path)}` |")
                ),
                None,
            )
            assert row is not None, key.path
            assert row.rstrip(" |").split(" | ")[-1], f"no description: {key.path}"


def test_schema_command_prints_and_writes_the_reference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["schema", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == policy_reference()
    out = tmp_path / "reference.md"
    assert main(["schema", "--format", "markdown", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == policy_reference()
