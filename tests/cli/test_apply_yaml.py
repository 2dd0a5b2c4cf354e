"""``runguard apply -o yaml`` prints plain YAML: no ``&id001`` anchors where values are shared."""

from __future__ import annotations

import pytest
import yaml
from harness import TESTS

from webhook.cli import main

CASES = TESTS / "cases"


def test_yaml_output_has_no_anchors_and_reads_back_as_the_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A root pod: the patch adds the same securityContext dicts the object then holds.
    source = str(CASES / "bypassed-root" / "input.yaml")
    policy = str(CASES / "_policies" / "platform")
    main(["apply", "-p", policy, "-o", "yaml", source])
    text = capsys.readouterr().out
    assert "&id" not in text and "*id" not in text
    main(["apply", "-p", policy, "-o", "json", source])
    assert yaml.safe_load(text) == yaml.safe_load(capsys.readouterr().out)
    entry = yaml.safe_load(text)[0]
    assert entry["patch"], "the case must patch something, else nothing is shared"
