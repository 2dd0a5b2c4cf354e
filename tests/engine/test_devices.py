"""Devices only through requests: a profile's device variable stays, a user's does not."""

from __future__ import annotations

from harness import TESTS

from webhook.engine import evaluate
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

PLATFORM = load_policy(TESTS / "cases" / "_policies" / "platform")


def test_a_profile_may_set_a_device_variable_a_user_may_not() -> None:
    a100 = PLATFORM.first.profiles["1xa100"]
    pinned = a100.model_copy(
        update={"env": (*a100.env, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})}
    )
    policy = Policy.of(
        PLATFORM.first.model_copy(
            update={"profiles": {**PLATFORM.first.profiles, "1xa100": pinned}}
        )
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/run": "r1",
                "dhcore/template": "1xa100",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                },
                {
                    "name": "side",
                    "image": "x",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                },
            ]
        },
    }
    decision = evaluate(pod, policy)
    assert "resources.device-env" not in {v.rule for v in decision.violations}
    main, side = decision.object["spec"]["containers"]
    device = [e for e in main["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
    assert device == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]  # the profile's
    assert "env" not in side
