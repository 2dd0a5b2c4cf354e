"""``webhook/engine/rules/profile.py`` on its own: step 1 (``note_profile_fallback``,
``apply_profile``, ``clamp_to_profile_ranges``) and the checks ``check_profile`` and
``check_profile_ranges`` on a ``Pod`` built directly."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from harness.pods import container, pod_of, policy_of

from webhook.engine.rules.profile import (
    PROFILE_APPLIED,
    PROFILE_NOT_ALLOWED,
    PROFILE_RANGE,
    PROFILE_UNKNOWN,
    apply_profile,
    check_profile,
    check_profile_ranges,
    clamp_to_profile_ranges,
    note_profile_fallback,
)
from webhook.policy.model import Policy

LABEL = "dhcore/template"
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
A100 = {
    "resources": {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "64Gi"}},
    "nodeSelector": {"gpu.product": "A100"},
    "tolerations": [GPU_TAINT],
    "priorityClassName": "high",
    "runtimeClassName": "nvidia",
    "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
}
RANGED = {"resources": {"requests": {"cpu": {"min": "1", "default": "2", "max": "4"}}}}


def policy(
    tmp_path: Path, *, unknown: str = "Deny", on_exceed: str = "Clamp", **extra: Any
) -> Policy:
    profiles = {
        "small": {"resources": {"requests": {"cpu": "1"}}},
        "a100": A100,
        "ranged": RANGED,
        **extra,
    }
    return policy_of(
        tmp_path,
        {
            "profiles": {"label": LABEL, "default": "small", "unknown": unknown},
            "resources": {"onExceed": on_exceed},
        },
        profiles,
    )


def named(profile: str) -> dict[str, str]:
    return {LABEL: profile}


def test_the_profile_wins_over_the_runs_values(tmp_path: Path) -> None:
    spec = {
        "containers": [
            container(
                resources={"requests": {"cpu": "1"}},
                env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}],
            )
        ],
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule"}
        ],
        "priorityClassName": "low",
        "priority": 10,
    }
    run = pod_of(policy(tmp_path), spec, labels=named("a100"))
    change = apply_profile(run)
    assert change is not None and change.rule == PROFILE_APPLIED
    assert run.spec == {
        "containers": [container(resources=A100["resources"], env=A100["env"])],
        "tolerations": [GPU_TAINT],
        "priorityClassName": "high",  # the apiserver computes priority again
        "nodeSelector": A100["nodeSelector"],
        "runtimeClassName": "nvidia",
    }
    assert apply_profile(run) is None  # a fixed point


def test_the_profile_applies_to_the_main_container_not_a_mesh_proxy(tmp_path: Path) -> None:
    spec = {"containers": [container("linkerd-proxy"), container("train")]}
    run = pod_of(policy(tmp_path), spec, labels=named("small"))
    apply_profile(run)
    assert run.spec["containers"] == [
        container("linkerd-proxy"),
        container("train", resources={"requests": {"cpu": "1"}}),
    ]


def test_a_run_already_as_its_profile_says_is_left_alone(tmp_path: Path) -> None:
    spec = {"containers": [container(resources={"requests": {"cpu": "1000m"}})]}
    run = pod_of(policy(tmp_path), spec, labels=named("small"))
    assert apply_profile(run) is None  # the same amount, written differently
    assert run.spec == spec


def test_a_limit_below_the_profiles_request_is_raised_to_it(tmp_path: Path) -> None:
    spec = {"containers": [container(resources={"limits": {"cpu": "500m"}})]}
    run = pod_of(policy(tmp_path), spec, labels=named("small"))
    change = apply_profile(run)
    assert change is not None and "cpu limit 500m -> 1 (its request)" in change.warning
    assert run.spec["containers"][0]["resources"] == {
        "limits": {"cpu": "1"},
        "requests": {"cpu": "1"},
    }


def test_no_profile_no_change(tmp_path: Path) -> None:
    bare = policy_of(tmp_path, {})
    run = pod_of(bare)
    assert run.profile is None
    assert apply_profile(run) is None
    assert run.spec == {"containers": [container()]}


def test_an_unknown_name_falls_back_to_the_default_and_says_so(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path, unknown="Default"), labels=named("huge"))
    change = note_profile_fallback(run)
    assert change is not None and change.rule == PROFILE_UNKNOWN
    assert change.warning == "runguard: unknown profile 'huge', using 'small'"
    assert check_profile(run) == []
    assert note_profile_fallback(pod_of(policy(tmp_path), labels=named("a100"))) is None


def test_an_unknown_name_is_denied_under_unknown_deny(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), labels=named("huge"))
    assert run.profile is None and apply_profile(run) is None
    [violation] = check_profile(run)
    assert (violation.rule, violation.path) == (PROFILE_UNKNOWN, f"metadata.labels[{LABEL}]")
    assert "known: a100, ranged, small" in violation.message
    assert check_profile(pod_of(policy(tmp_path), labels=named("a100"))) == []


def test_a_profile_kept_to_other_namespaces_is_not_applied_and_denied(tmp_path: Path) -> None:
    kept = {**A100, "namespaceSelector": {"matchLabels": {"team": "vision"}}}
    run = pod_of(policy(tmp_path, kept=kept), labels=named("kept"), namespace="ml")
    assert run.profile is None  # no cluster view: the namespace's labels are unknown
    assert apply_profile(run) is None
    [violation] = check_profile(run)
    assert (violation.rule, violation.path) == (PROFILE_NOT_ALLOWED, f"metadata.labels[{LABEL}]")


def test_a_range_fills_its_default_where_the_run_asks_nothing(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), labels=named("ranged"))
    change = apply_profile(run)
    assert change is not None and change.rule == PROFILE_APPLIED
    assert run.spec["containers"][0]["resources"] == {"requests": {"cpu": "2"}}


def test_clamp_sets_a_value_outside_the_range_to_the_bound(tmp_path: Path) -> None:
    spec = {"containers": [container(resources={"requests": {"cpu": "6"}})]}
    run = pod_of(policy(tmp_path), spec, labels=named("ranged"))
    assert apply_profile(run) is None  # a value the run asked: the range's step judges it
    change = clamp_to_profile_ranges(run)
    assert change is not None and change.rule == PROFILE_RANGE
    assert run.spec["containers"][0]["resources"] == {"requests": {"cpu": "4"}}
    assert check_profile_ranges(run) == []


def test_a_value_inside_the_range_is_kept(tmp_path: Path) -> None:
    spec = {"containers": [container(resources={"requests": {"cpu": "3"}})]}
    run = pod_of(policy(tmp_path), spec, labels=named("ranged"))
    assert clamp_to_profile_ranges(run) is None
    assert run.spec == spec
    assert check_profile_ranges(run) == []


def test_deny_keeps_a_value_outside_the_range_and_the_check_says_how_far(
    tmp_path: Path,
) -> None:
    spec = {
        "containers": [container("istio-proxy"), container(resources={"requests": {"cpu": "500m"}})]
    }
    run = pod_of(policy(tmp_path, on_exceed="Deny"), spec, labels=named("ranged"))
    assert clamp_to_profile_ranges(run) is None
    assert run.spec == spec
    [violation] = check_profile_ranges(run)
    assert (violation.rule, violation.path) == (
        PROFILE_RANGE,
        "spec.containers[1].resources.requests.cpu",
    )
    assert violation.amount == Decimal("0.5")
