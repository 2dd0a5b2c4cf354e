"""Beside the cluster's neighbours: a vertical autoscaler's limits, meshes' sidecars and
CA bundles, their init containers, and device families (``docs/neighbours.md``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from harness import run_pod

from webhook.engine import evaluate
from webhook.policy.loader import load_policy

PLATFORM = load_policy(Path(__file__).parent / "cases" / "_policies" / "platform")


def run(containers: list[dict[str, Any]], profile: str = "1xa100", **spec: Any) -> dict[str, Any]:
    """A run naming ``profile``, with these containers (``run_pod``'s metadata)."""
    pod = run_pod(**spec)
    pod["metadata"]["labels"]["dhcore/template"] = profile
    pod["spec"] = {"containers": containers, **spec}
    return pod


# --- the profile wins against limits ---------------------------------------------------


def test_a_limit_below_the_profiles_request_is_raised_to_it() -> None:
    # A vertical autoscaler (or the user) left cpu 3 as the limit; the profile asks 8.
    pod = run(
        [
            {
                "name": "main",
                "image": "x",
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "3", "memory": "8Gi"}},
            }
        ]
    )
    decision = evaluate(pod, PLATFORM)
    assert decision.allowed, decision.violations
    main = decision.object["spec"]["containers"][0]
    assert main["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    }
    assert any("cpu limit 3 -> 8 (its request)" in w for w in decision.warnings)


def test_a_limit_above_the_profiles_request_is_kept() -> None:
    pod = run([{"name": "main", "image": "x", "resources": {"limits": {"cpu": "12"}}}])
    main = evaluate(pod, PLATFORM).object["spec"]["containers"][0]
    assert main["resources"]["requests"]["cpu"] == "8"
    assert main["resources"]["limits"]["cpu"] == "12"


def test_the_profiles_own_limit_wins_over_the_runs() -> None:
    # 1xa100 names its memory limit: the run's lower one is replaced by it, not the request.
    pod = run([{"name": "main", "image": "x", "resources": {"limits": {"memory": "1Gi"}}}])
    main = evaluate(pod, PLATFORM).object["spec"]["containers"][0]
    assert main["resources"]["requests"]["memory"] == "32Gi"
    assert main["resources"]["limits"]["memory"] == "64Gi"


def test_only_the_main_containers_limits_are_raised_and_twice_is_once() -> None:
    pod = run(
        [
            {"name": "main", "image": "x", "resources": {"limits": {"cpu": "3"}}},
            {"name": "side", "image": "x", "resources": {"limits": {"cpu": "1"}}},
        ]
    )
    once = evaluate(pod, PLATFORM).object
    main, side = once["spec"]["containers"]
    assert main["resources"]["limits"]["cpu"] == "8"
    assert side["resources"]["limits"] == {"cpu": "1", "memory": "282Mi"}
    again = evaluate(copy.deepcopy(once), PLATFORM)
    assert again.object == once
    assert again.patch == []
