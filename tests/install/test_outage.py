"""``runguard audit --outage``: what holds while runguard is unreachable, read from the
admission objects (here the files ``runguard manifests`` renders, as --cluster-state)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import REPO

from webhook.cli import main
from webhook.install import manifests
from webhook.install.outage import GIVEN_UP, carried, only_runguard
from webhook.policy.loader import load_policy

POLICIES = REPO / "policies"


def audit(tmp_path: Path, objects: list[dict[str, Any]], capsys: Any) -> tuple[int, dict[str, Any]]:
    state = tmp_path / "admission.yaml"
    state.write_text(manifests.to_yaml(objects))
    capsys.readouterr()
    code = main(
        ["audit", "-p", str(POLICIES), "--outage", "--cluster-state", str(state), "-o", "json"]
    )
    return code, json.loads(capsys.readouterr().out)


def test_the_available_mode_with_the_floor_says_what_it_gives_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = load_policy(POLICIES)
    objects = [
        *manifests.webhook_configurations(policy, available=True),
        *manifests.floor_policies(policy),
    ]
    code, answer = audit(tmp_path, objects, capsys)
    assert code == 0 and answer["problems"] == []
    lines = answer["lines"]
    assert lines[0].startswith("mode: available: 8 webhooks judging runs fail open")
    assert all(f"  - {item}" in lines for item in GIVEN_UP)
    assert "floor: the policy's" in lines
    digitalhub = lines.index("RunPolicy digitalhub:")
    assert (
        lines[digitalhub + 1]
        == f"  the floor carries: {', '.join(carried(policy.run_policies[1]))}"
    )
    assert (
        "security.root" in lines[digitalhub + 1] and "resources.exceeded" in lines[digitalhub + 1]
    )
    assert "profile.applied" in lines[digitalhub + 2] and "ownership.stamp" in lines[digitalhub + 2]


def test_the_available_mode_without_the_policys_floor_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = load_policy(POLICIES)
    opened = manifests.webhook_configurations(policy, available=True)
    code, answer = audit(tmp_path, opened, capsys)
    assert code == 1
    assert answer["problems"] == [
        "the available mode without the policy's floor (missing: runguard-floor-builds, "
        "runguard-floor-digitalhub)"
    ]
    # A floor rendered from another policy (a maximum raised since) is not the policy's.
    floor = manifests.floor_policies(policy)
    for obj in floor:
        for validation in obj["spec"].get("validations", []):
            validation["expression"] = validation["expression"].replace("'18'", "'99'")
    code, answer = audit(tmp_path, [*opened, *floor], capsys)
    assert code == 1
    assert answer["problems"] == [
        "the available mode without the policy's floor (not what the policy renders: "
        "runguard-floor-digitalhub)"
    ]


def test_fail_closed_needs_no_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = load_policy(POLICIES)
    code, answer = audit(tmp_path, manifests.webhook_configurations(policy), capsys)
    assert code == 0
    assert answer["lines"][0] == "mode: fail-closed: while runguard is down, no run starts"
    assert answer["lines"][1].startswith("floor: missing")


def test_every_rule_is_carried_or_only_runguards() -> None:
    from webhook.engine.registry import RULES

    for p in load_policy(POLICIES).run_policies:
        assert sorted([*carried(p), *only_runguard(p)]) == sorted(RULES)
        assert set(carried(p)) <= set(RULES)
