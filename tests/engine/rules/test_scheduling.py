"""``webhook/engine/rules/scheduling.py`` on its own: ``default_priority_class`` (step 8a),
``apply_preemption_mode`` (step 8b, MLRun's modes) and ``check_scheduling`` on a ``Pod``
built directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness.pods import container, pod_of, policy_of

from webhook.engine.rules.scheduling import (
    REQUIRED,
    SCHEDULING_PREEMPTION_MODE,
    SCHEDULING_PRIORITY_CLASS,
    apply_preemption_mode,
    check_scheduling,
    default_priority_class,
)
from webhook.policy.model import Policy

MODE = "runguard.io/preemption-mode"
SPOT = {"key": "node-lifecycle", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
ON_SPOT = {"key": "node-lifecycle", "operator": "In", "values": ["spot"]}
OFF_SPOT = {"key": "node-lifecycle", "operator": "NotIn", "values": ["spot"]}


def policy(tmp_path: Path, **scheduling: Any) -> Policy:
    return policy_of(
        tmp_path,
        {
            "scheduling": {
                "priorityClasses": {"default": "medium", "allowed": ["low", "medium", "high"]},
                "preemption": {
                    "annotation": MODE,
                    "default": "prevent",
                    "nodeSelector": {"node-lifecycle": "spot"},
                    "tolerations": [SPOT],
                },
                **scheduling,
            }
        },
    )


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    terms_ = [{"matchExpressions": t} for t in terms]
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms_}}}


def test_a_run_without_a_class_gets_the_default(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), {"containers": [container()], "priority": 0})
    change = default_priority_class(run)
    assert change is not None and change.rule == SCHEDULING_PRIORITY_CLASS
    assert change.warning == "runguard: priority class defaulted to medium"
    assert run.spec == {"containers": [container()], "priorityClassName": "medium"}


def test_a_disallowed_class_is_replaced_by_the_default(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), {"containers": [container()], "priorityClassName": "top"})
    assert [v.rule for v in check_scheduling(run)] == [SCHEDULING_PRIORITY_CLASS]
    change = default_priority_class(run)
    assert change is not None
    assert change.warning == "runguard: priority class top not allowed, set to medium"
    assert run.spec["priorityClassName"] == "medium"
    assert check_scheduling(run) == []


def test_an_allowed_class_is_kept(tmp_path: Path) -> None:
    spec = {"containers": [container()], "priorityClassName": "high", "priority": 1000}
    run = pod_of(policy(tmp_path), spec)
    assert default_priority_class(run) is None
    assert run.spec == spec
    assert check_scheduling(run) == []


def test_without_a_default_a_disallowed_class_is_left_to_the_check(tmp_path: Path) -> None:
    strict = policy(tmp_path, priorityClasses={"allowed": ["low"]})
    run = pod_of(strict, {"containers": [container()], "priorityClassName": "top"})
    assert default_priority_class(run) is None
    assert run.spec["priorityClassName"] == "top"
    [violation] = check_scheduling(run)
    assert (violation.rule, violation.path) == (
        SCHEDULING_PRIORITY_CLASS,
        "spec.priorityClassName",
    )


def test_prevent_takes_a_run_off_spot_nodes(tmp_path: Path) -> None:
    spec = {
        "containers": [container()],
        "nodeSelector": {"node-lifecycle": "spot", "zone": "a"},
        "tolerations": [SPOT],
        "affinity": required([ON_SPOT]),
    }
    run = pod_of(policy(tmp_path), spec)  # the default mode
    change = apply_preemption_mode(run)
    assert change is not None and change.rule == SCHEDULING_PREEMPTION_MODE
    assert change.warning == "runguard: preemption mode prevent applied"
    assert run.spec == {
        "containers": [container()],
        "nodeSelector": {"zone": "a"},
        "affinity": required([OFF_SPOT]),
    }
    assert apply_preemption_mode(run) is None  # a fixed point


def test_constrain_keeps_a_run_on_spot_nodes(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), annotations={MODE: "constrain"})
    change = apply_preemption_mode(run)
    assert change is not None and change.warning == "runguard: preemption mode constrain applied"
    assert run.spec == {
        "containers": [container()],
        "tolerations": [SPOT],
        "affinity": required([ON_SPOT]),
    }


def test_allow_lifts_the_spot_requirements_and_tolerates_spot(tmp_path: Path) -> None:
    spec = {
        "containers": [container()],
        "nodeSelector": {"node-lifecycle": "spot"},
        "affinity": required([OFF_SPOT]),
    }
    run = pod_of(policy(tmp_path), spec, labels={MODE: "allow"})
    change = apply_preemption_mode(run)
    assert change is not None and change.warning == "runguard: preemption mode allow applied"
    assert run.spec == {"containers": [container()], "tolerations": [SPOT]}


@pytest.mark.parametrize("mode", ["none", "sometimes"])
def test_mode_none_or_an_unknown_one_changes_nothing(tmp_path: Path, mode: str) -> None:
    spec = {"containers": [container()], "nodeSelector": {"node-lifecycle": "spot"}}
    run = pod_of(policy(tmp_path), spec, annotations={MODE: mode})
    assert apply_preemption_mode(run) is None
    assert run.spec == spec


def test_an_unknown_mode_is_named_where_the_run_states_it(tmp_path: Path) -> None:
    by_annotation = pod_of(policy(tmp_path), annotations={MODE: "sometimes"})
    assert [(v.rule, v.path) for v in check_scheduling(by_annotation)] == [
        (SCHEDULING_PREEMPTION_MODE, f"metadata.annotations[{MODE}]")
    ]
    by_label = pod_of(policy(tmp_path), labels={MODE: "sometimes"}, spec_path="spec.template.spec")
    assert [(v.rule, v.path) for v in check_scheduling(by_label)] == [
        (SCHEDULING_PREEMPTION_MODE, f"spec.template.metadata.labels[{MODE}]")
    ]
    known = pod_of(policy(tmp_path), annotations={MODE: "allow"})
    assert check_scheduling(known) == []
