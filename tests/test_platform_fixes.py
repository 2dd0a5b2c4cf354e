"""What the platforms' own runs need, with the example MLRun policy (issue: the operators).

- A default never shrinks what the user asked: an MLRun run asking 4 cpu / 16Gi with no
  limits got the default limits 2 / 4Gi, and then its requests clamped down to them.
- A device variable whose value selects no device only takes devices away: MLRun's MPI
  launcher sets ``NVIDIA_VISIBLE_DEVICES=""`` so that a CUDA image does not take every
  GPU of its node; removing it did exactly that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.engine import evaluate
from webhook.policy.loader import load_policy

MLRUN = load_policy(Path(__file__).resolve().parents[1] / "policies" / "examples" / "mlrun")
LABELS = {"mlrun/class": "job", "mlrun/project": "demo", "mlrun/uid": "u1"}


def run(container: dict[str, Any]) -> dict[str, Any]:
    main = {"name": "base", "image": "mlrun/mlrun", **container}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train", "namespace": "mlrun", "labels": LABELS},
            "spec": {"containers": [main]}}  # fmt: skip


def test_default_limits_never_below_the_containers_own_request() -> None:
    asked = {"resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}
    decision = evaluate(run(asked), MLRUN)
    assert decision.applies, "the example policy must govern this run"
    resources = decision.object["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert resources["limits"] == {"cpu": "4", "memory": "16Gi"}
    # a small request still gets the admin's default limit
    small = evaluate(run({"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}), MLRUN)
    assert small.object["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "2", "memory": "4Gi"
    }


@pytest.mark.parametrize(("value", "kept"), [("", True), ("void", True), ("none", True),
                                             ("all", False), ("0,1", False)])  # fmt: skip
def test_a_device_variable_that_selects_no_device_is_kept(value: str, kept: bool) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    decision = evaluate(run({"env": env}), MLRUN)
    after = decision.object["spec"]["containers"][0].get("env", [])
    assert (after == env) is kept, after
    assert ("resources.device-env" in {c.rule for c in decision.mutations}) is not kept
