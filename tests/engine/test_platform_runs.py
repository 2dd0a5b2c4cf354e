"""What the platforms' own runs need, with the example MLRun policy (issue: the operators).

- A default never shrinks what the user asked: an MLRun run asking 4 cpu / 16Gi with no
  limits got the default limits 2 / 4Gi, and then its requests clamped down to them.
- A device variable whose value selects no device only takes devices away: MLRun's MPI
  launcher sets ``NVIDIA_VISIBLE_DEVICES=""`` so that a CUDA image does not take every
  GPU of its node; removing it did exactly that.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import REPO

from webhook.engine import evaluate
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

MLRUN = load_policy(REPO / "policies" / "examples" / "mlrun")
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
        "cpu": "2",
        "memory": "4Gi",
    }


@pytest.mark.parametrize(("value", "kept"), [("", True), ("void", True), ("none", True),
                                             ("all", False), ("0,1", False)])  # fmt: skip
def test_a_device_variable_that_selects_no_device_is_kept(value: str, kept: bool) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    decision = evaluate(run({"env": env}), MLRUN)
    after = decision.object["spec"]["containers"][0].get("env", [])
    assert (after == env) is kept, after
    assert ("resources.device-env" in {c.rule for c in decision.mutations}) is not kept


def test_a_run_with_no_uid_at_all_gets_the_policys() -> None:
    """MLRun's default enrichment sets no uid and mlrun/mlrun defaults to root: with
    ``security.assignRunAsUser`` the pod gets the policy's uid, so the kubelet starts it
    under runAsNonRoot instead of refusing it."""
    decision = evaluate(run({}), MLRUN)
    pod = decision.object["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsNonRoot"]) == (1000, True)
    # a uid the run chose (not root) is its own
    own = run({"securityContext": {"runAsUser": 4242}})
    own["spec"]["securityContext"] = {"runAsUser": 4242}
    decision = evaluate(own, MLRUN)
    assert decision.object["spec"]["securityContext"]["runAsUser"] == 4242
    # without the key, nothing is assigned (the shipped DigitalHub policy's behaviour)
    first, *others = MLRUN.run_policies
    security = first.security.model_copy(update={"assign_run_as_user": False})
    plain = Policy.of(first.model_copy(update={"security": security}), *others)
    assert "runAsUser" not in evaluate(run({}), plain).object["spec"]["securityContext"]
