"""``webhook/engine/rules/resources.py`` on its own: steps 2-4 (``fill_defaults``,
``derive_memory_limits``, ``clamp_to_maximums``) and the checks ``check_resources``,
``check_run_totals`` and ``check_device_families`` on a ``Pod`` built directly."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from harness.pods import container, pod_of, policy_of

from webhook.engine.rules.resources import (
    RESOURCES_CLAMPED,
    RESOURCES_DEFAULTS,
    RESOURCES_EXCEEDED,
    RESOURCES_GPU_MISMATCH,
    RESOURCES_MEMORY_LIMIT,
    check_device_families,
    check_resources,
    check_run_totals,
    clamp_to_maximums,
    derive_memory_limits,
    fill_defaults,
)
from webhook.policy.model import Policy

GPU = "nvidia.com/gpu"


def policy(tmp_path: Path, **resources: Any) -> Policy:
    """The resources section below, ``resources`` replacing its keys (None: left out)."""
    section = {
        "gpuResourceName": GPU,
        "defaults": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "memoryLimitFactor": 1.5,
        "maximums": {"cpu": "4", "memory": "8Gi", "gpu": "2"},
        **resources,
    }
    kept = {k: v for k, v in section.items() if v is not None}
    return policy_of(tmp_path, {"resources": kept})


def sized(
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    name: str = "main",
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return container(name, resources=resources)


def test_defaults_fill_what_a_container_does_not_ask(tmp_path: Path) -> None:
    spec = {"initContainers": [container("init")], "containers": [sized({"cpu": "2"})]}
    run = pod_of(policy(tmp_path), spec)
    change = fill_defaults(run)
    assert change is not None and change.rule == RESOURCES_DEFAULTS
    assert run.spec == {
        "initContainers": [sized({"cpu": "100m", "memory": "256Mi"}, {"memory": "1Gi"}, "init")],
        "containers": [sized({"cpu": "2", "memory": "256Mi"}, {"memory": "1Gi"})],
    }
    assert fill_defaults(run) is None  # a fixed point


def test_a_default_limit_never_goes_below_the_containers_request(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), {"containers": [sized({"cpu": "1", "memory": "4Gi"})]})
    fill_defaults(run)
    assert run.spec["containers"][0]["resources"]["limits"] == {"memory": "4Gi"}


def test_defaults_leave_a_fully_sized_container_alone(tmp_path: Path) -> None:
    spec = {"containers": [sized({"cpu": "1", "memory": "1Gi"}, {"memory": "2Gi"})]}
    run = pod_of(policy(tmp_path), spec)
    assert fill_defaults(run) is None
    assert run.spec == spec


def test_a_memory_limit_is_derived_from_the_request(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), {"containers": [sized({"memory": "1Gi"})]})
    change = derive_memory_limits(run)
    assert change is not None and change.rule == RESOURCES_MEMORY_LIMIT
    assert run.spec["containers"][0]["resources"] == {
        "requests": {"memory": "1Gi"},
        "limits": {"memory": "1536Mi"},
    }


def test_a_memory_limit_set_or_a_factor_unset_derives_nothing(tmp_path: Path) -> None:
    spec = {"containers": [sized({"memory": "1Gi"}, {"memory": "1Gi"}), sized(name="b")]}
    run = pod_of(policy(tmp_path), spec)
    assert derive_memory_limits(run) is None
    assert run.spec == spec
    no_factor = policy(tmp_path / "n", memoryLimitFactor=None)
    assert (
        derive_memory_limits(pod_of(no_factor, {"containers": [sized({"memory": "1Gi"})]})) is None
    )


def test_clamp_lowers_values_above_a_maximum_and_requests_above_limits(tmp_path: Path) -> None:
    spec = {"containers": [sized({"cpu": "3", "memory": "16Gi"}, {"cpu": "2", "memory": "32Gi"})]}
    run = pod_of(policy(tmp_path), spec)
    assert {(v.rule, v.path) for v in check_resources(run)} == {
        (RESOURCES_EXCEEDED, "spec.containers[0].resources.requests.memory"),
        (RESOURCES_EXCEEDED, "spec.containers[0].resources.limits.memory"),
    }
    change = clamp_to_maximums(run)
    assert change is not None and change.rule == RESOURCES_CLAMPED
    assert run.spec["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }
    assert check_resources(run) == []


def test_a_gpu_request_becomes_its_limit(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), {"containers": [sized({GPU: "1"}, {GPU: "2"})]})
    [violation] = check_resources(run)
    assert (violation.rule, violation.path) == (
        RESOURCES_GPU_MISMATCH,
        f"spec.containers[0].resources.requests.{GPU}",
    )
    assert clamp_to_maximums(run) is not None
    assert run.spec["containers"][0]["resources"] == {"requests": {GPU: "2"}, "limits": {GPU: "2"}}
    assert check_resources(run) == []


def test_deny_clamps_nothing_above_a_maximum(tmp_path: Path) -> None:
    spec = {"containers": [sized({"cpu": "1", "memory": "16Gi"})]}
    run = pod_of(policy(tmp_path, onExceed="Deny"), spec)
    assert clamp_to_maximums(run) is None
    assert run.spec == spec
    [violation] = check_resources(run)
    assert violation.rule == RESOURCES_EXCEEDED
    assert violation.amount == Decimal(16 * 2**30)


def test_values_within_the_maximums_pass_unchanged(tmp_path: Path) -> None:
    spec = {
        "containers": [sized({"cpu": "4", "memory": "2Gi", GPU: "1"}, {"memory": "8Gi", GPU: "1"})]
    }
    run = pod_of(policy(tmp_path), spec)
    assert clamp_to_maximums(run) is None
    assert run.spec == spec
    assert check_resources(run) == []
    assert check_run_totals(run) == []


def test_a_run_total_above_a_maximum_is_denied_where_no_container_is(tmp_path: Path) -> None:
    spec = {"containers": [sized({"cpu": "3"}), sized({"cpu": "3"}, name="b")]}
    run = pod_of(policy(tmp_path), spec)
    assert check_resources(run) == []
    [violation] = check_run_totals(run)
    assert (violation.rule, violation.path) == (RESOURCES_EXCEEDED, "spec.resources.requests.cpu")
    assert violation.amount == Decimal(6)


def test_an_init_container_runs_before_the_others_and_is_not_summed_with_them(
    tmp_path: Path,
) -> None:
    spec = {
        "initContainers": [sized({"cpu": "3"}, name="init")],
        "containers": [sized({"cpu": "3"}), sized({"cpu": "1"}, name="b")],
    }
    assert check_run_totals(pod_of(policy(tmp_path), spec)) == []
    sidecar = {**sized({"cpu": "1"}, name="proxy"), "restartPolicy": "Always"}
    spec["initContainers"] = [sidecar]  # a sidecar runs beside them: counted
    assert [v.rule for v in check_run_totals(pod_of(policy(tmp_path), spec))] == [
        RESOURCES_EXCEEDED
    ]


FAMILY = {
    "name": "a100",
    "max": 1,
    "members": {"nvidia.com/mig-1g.10gb": 0.25, "nvidia.com/mig-3g.40gb": 0.5},
}


def test_a_device_familys_weighted_total_above_its_maximum_is_denied(tmp_path: Path) -> None:
    families = policy(tmp_path, families=[FAMILY])
    spec = {
        "containers": [
            sized(limits={"nvidia.com/mig-3g.40gb": "1"}),
            sized(limits={"nvidia.com/mig-1g.10gb": "3"}, name="b"),
        ]
    }
    [violation] = check_device_families(pod_of(families, spec))
    assert (violation.rule, violation.path) == (
        RESOURCES_EXCEEDED,
        "spec.resources.limits.family:a100",
    )
    assert violation.amount == Decimal("1.25")


def test_a_device_family_within_its_maximum_or_unasked_passes(tmp_path: Path) -> None:
    families = policy(tmp_path, families=[FAMILY])
    spec = {"containers": [sized(limits={"nvidia.com/mig-3g.40gb": "2"})]}
    assert check_device_families(pod_of(families, spec)) == []
    assert check_device_families(pod_of(families, {"containers": [sized({"cpu": "4"})]})) == []
