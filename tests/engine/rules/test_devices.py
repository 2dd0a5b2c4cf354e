"""``webhook/engine/rules/devices.py`` on its own: ``drop_device_env`` (step 5),
``drop_device_claims`` (step 6) and their checks on a ``Pod`` built directly: devices only
through resource requests and the run's own claims."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.pods import NOT_PLATFORM, container, pod_of, policy_of

from webhook.engine.rules.devices import (
    RESOURCES_DEVICE_CLAIM,
    RESOURCES_DEVICE_ENV,
    check_device_claims,
    check_device_env,
    drop_device_claims,
    drop_device_env,
)
from webhook.policy.model import Policy

ALL_GPUS = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
PLAIN = {"name": "MODE", "value": "train"}
RUN = {"dhcore/run": "r1"}


def policy(
    tmp_path: Path, *, on_root: str = "Strip", on_pre_existing: str = "Strip", **profiles: Any
) -> Policy:
    return policy_of(
        tmp_path,
        {
            "security": {"level": "baseline", "onRoot": on_root},
            "resources": {
                "deviceEnv": ["NVIDIA_VISIBLE_DEVICES"],
                "platformDeviceClaims": ["gpu-{labels[dhcore/run]}"],
            },
            "volumes": {"onPreExisting": on_pre_existing},
        },
        profiles,
    )


def test_strip_removes_a_device_variable_and_a_prefix_that_can_make_one(
    tmp_path: Path,
) -> None:
    spec = {
        "initContainers": [container("init", env=[ALL_GPUS])],
        "containers": [
            container(
                env=[PLAIN, ALL_GPUS],
                envFrom=[
                    {"prefix": "NVIDIA_VISIBLE_", "configMapRef": {"name": "c"}},
                    {"configMapRef": {"name": "d"}},
                ],
            )
        ],
    }
    run = pod_of(policy(tmp_path), spec)
    change = drop_device_env(run)
    assert change is not None and change.rule == RESOURCES_DEVICE_ENV
    assert run.spec == {
        "initContainers": [container("init")],
        "containers": [container(env=[PLAIN], envFrom=[{"configMapRef": {"name": "d"}}])],
    }
    assert check_device_env(run) == []
    assert drop_device_env(run) is None


def test_a_value_that_selects_no_device_is_kept(tmp_path: Path) -> None:
    spec = {
        "containers": [
            container(
                env=[
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
                    PLAIN,
                ]
            )
        ]
    }
    run = pod_of(policy(tmp_path), spec)
    assert drop_device_env(run) is None
    assert run.spec == spec
    assert check_device_env(run) == []


def test_the_profiles_own_value_for_the_main_container_is_kept(tmp_path: Path) -> None:
    pinned = policy(tmp_path, pinned={"env": [ALL_GPUS]})
    spec = {"containers": [container(env=[ALL_GPUS]), container("side", env=[ALL_GPUS])]}
    run = pod_of(pinned, spec, labels={"runguard.io/profile": "pinned"})
    assert run.profile is not None
    assert [(v.rule, v.path) for v in check_device_env(run)] == [
        (RESOURCES_DEVICE_ENV, "spec.containers[1].env[0]")
    ]
    assert drop_device_env(run) is not None
    assert run.spec["containers"] == [container(env=[ALL_GPUS]), container("side")]


def test_without_strip_the_variable_stays_and_the_check_names_it(tmp_path: Path) -> None:
    spec = {
        "containers": [
            container(
                env=[PLAIN, ALL_GPUS], envFrom=[{"prefix": "NVIDIA_", "secretRef": {"name": "s"}}]
            )
        ]
    }
    run = pod_of(policy(tmp_path, on_root="Deny"), spec)
    assert drop_device_env(run) is None
    assert run.spec == spec
    assert [(v.rule, v.path) for v in check_device_env(run)] == [
        (RESOURCES_DEVICE_ENV, "spec.containers[0].envFrom[0].prefix"),
        (RESOURCES_DEVICE_ENV, "spec.containers[0].env[1]"),
    ]


def claims_spec(*claims: dict[str, Any]) -> dict[str, Any]:
    uses = [{"name": c["name"]} for c in claims]
    return {
        "containers": [container(resources={"claims": uses})],
        "resourceClaims": list(claims),
    }


TEMPLATED = {"name": "own", "resourceClaimTemplateName": "one-gpu"}
SHARED = {"name": "shared", "resourceClaimName": "someone-elses-gpu"}
PLATFORMS = {"name": "given", "resourceClaimName": "gpu-r1"}


def test_strip_removes_an_existing_claim_and_the_containers_use_of_it(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), claims_spec(TEMPLATED, SHARED, PLATFORMS), labels=RUN)
    change = drop_device_claims(run)
    assert change is not None and change.rule == RESOURCES_DEVICE_CLAIM
    assert "someone-elses-gpu" in change.warning
    assert run.spec == claims_spec(TEMPLATED, PLATFORMS)
    assert check_device_claims(run) == []
    assert drop_device_claims(run) is None


def test_a_claim_from_a_template_and_the_platforms_claim_are_kept(tmp_path: Path) -> None:
    spec = claims_spec(TEMPLATED, PLATFORMS)
    run = pod_of(policy(tmp_path), spec, labels=RUN)
    assert drop_device_claims(run) is None
    assert run.spec == spec
    assert check_device_claims(run) == []


def test_deny_keeps_the_claims_and_the_check_names_each(tmp_path: Path) -> None:
    spec = claims_spec(SHARED, PLATFORMS)
    run = pod_of(policy(tmp_path, on_pre_existing="Deny"), spec, labels=RUN, ownership=NOT_PLATFORM)
    assert drop_device_claims(run) is None
    assert run.spec == spec
    found = check_device_claims(run)
    assert [(v.rule, v.path) for v in found] == [
        (RESOURCES_DEVICE_CLAIM, "spec.resourceClaims[0]"),
        (RESOURCES_DEVICE_CLAIM, "spec.resourceClaims[1]"),
    ]
    assert "only runs the platform creates" in found[1].message
