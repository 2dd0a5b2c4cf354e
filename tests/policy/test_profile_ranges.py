"""Ranges in a profile: ``{min, default, max}`` per resource, beside the plain quantity
(exactly that). A run's value inside is kept, none gets the default, one outside is
clamped (``onExceed: Clamp``) or denied (``onExceed: Deny``) under ``profile.range``;
lint refuses a default outside its range and a bound above the RunPolicy's maximums."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import REPO, write
from pydantic import ValidationError

from webhook.engine import evaluate, mutate, validate
from webhook.engine.rules.profile import PROFILE_RANGE
from webhook.policy.errors import PolicyError
from webhook.policy.kube import ProfileResources, QuantityRange
from webhook.policy.loader import load_policy
from webhook.policy.mirror.objects import check_object
from webhook.policy.model import Policy

RUN_POLICY = """\
    kind: RunPolicy
    apiVersion: runguard.io/v1
    metadata: {name: ranges}
    spec:
      resources:
        maximums: {cpu: "16", memory: 64Gi, gpu: "2", example.com/fpga: "4"}
        onExceed: ON_EXCEED
      selector: {matchLabels: {app.kubernetes.io/managed-by: dhcore}}
      profiles: {label: dhcore/template, unknown: Deny}
      security: {runAsUser: 8877}
    """
PROFILE = """\
    apiVersion: runguard.io/v1
    kind: Profile
    metadata: {name: pick}
    spec:
      resources:
        requests:
          cpu: "4"
          memory: {min: 16Gi, default: 32Gi, max: 64Gi}
          gpu: {min: "1", default: "1", max: "2"}
          example.com/fpga: {min: "0", default: "1", max: "4"}
          ephemeral-storage: {min: 1Gi, default: 10Gi, max: 20Gi}
        limits:
          memory: {min: 16Gi, default: 32Gi, max: 64Gi}
          gpu: {min: "1", default: "1", max: "2"}
    """


def policy(tmp_path: Path, on_exceed: str = "Clamp", profile: str = PROFILE) -> Policy:
    write(tmp_path, "runpolicy.yaml", RUN_POLICY.replace("ON_EXCEED", on_exceed))
    write(tmp_path, "profiles.yaml", profile)
    return load_policy(tmp_path)


def run(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> Any:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/template": "pick"},
        },
        "spec": {"containers": [{"name": "main", "image": "python:3.12", "resources": resources}]},
    }


def resources_of(decision: Any) -> Any:
    return decision.object["spec"]["containers"][0]["resources"]


GPU = "nvidia.com/gpu"


def test_absent_values_get_the_defaults_and_exact_values_win(tmp_path: Path) -> None:
    decision = evaluate(run({"cpu": "1"}), policy(tmp_path), namespace="ml")
    assert decision.allowed, decision.violations
    assert resources_of(decision) == {
        "requests": {
            "cpu": "4",  # exact: the profile's, as before
            "memory": "32Gi",
            GPU: "1",
            "example.com/fpga": "1",
            "ephemeral-storage": "10Gi",
        },
        "limits": {"memory": "32Gi", GPU: "1"},
    }


def test_values_inside_the_ranges_are_kept(tmp_path: Path) -> None:
    asked = {"memory": "48Gi", GPU: "2", "example.com/fpga": "0", "ephemeral-storage": "1Gi"}
    decision = evaluate(run(asked, {"memory": "60Gi", GPU: "2"}), policy(tmp_path), namespace="ml")
    assert decision.allowed, decision.violations
    assert resources_of(decision) == {
        "requests": {**asked, "cpu": "4"},
        "limits": {"memory": "60Gi", GPU: "2"},
    }
    assert PROFILE_RANGE not in [c.rule for c in decision.mutations]


def test_an_absent_limit_is_never_below_the_request(tmp_path: Path) -> None:
    decision = evaluate(run({"memory": "48Gi"}), policy(tmp_path), namespace="ml")
    assert resources_of(decision)["limits"] == {"memory": "48Gi", GPU: "1"}


def test_values_outside_are_clamped_to_the_nearest_bound(tmp_path: Path) -> None:
    decision = evaluate(
        run({"memory": "8Gi", "ephemeral-storage": "50Gi"}, {"memory": "96Gi"}),
        policy(tmp_path),
        namespace="ml",
    )
    assert decision.allowed, decision.violations
    got = resources_of(decision)
    assert (got["requests"]["memory"], got["requests"]["ephemeral-storage"]) == ("16Gi", "20Gi")
    assert got["limits"]["memory"] == "64Gi"
    warnings = [c.warning for c in decision.mutations if c.rule == PROFILE_RANGE]
    assert warnings == [
        "runguard: outside profile pick's range: memory request 8Gi -> 16Gi, "
        "ephemeral-storage request 50Gi -> 20Gi (+1 more)"  # 120 characters at most
    ]


def test_values_outside_are_denied_with_on_exceed_deny(tmp_path: Path) -> None:
    strict = policy(tmp_path, "Deny")
    mutated = mutate(run({"memory": "8Gi", GPU: "3"}), strict, namespace="ml")
    assert resources_of(mutated)["requests"]["memory"] == "8Gi"  # left for validation to deny
    decision = evaluate(run({"memory": "8Gi"}), strict, namespace="ml")
    assert not decision.allowed
    assert [(v.rule, v.path, v.message) for v in decision.violations] == [
        (
            PROFILE_RANGE,
            "spec.containers[0].resources.requests.memory",
            "memory request 8Gi is outside profile pick's range 16Gi..64Gi",
        )
    ]


def test_a_pod_that_bypassed_mutation_is_judged_by_the_ranges(tmp_path: Path) -> None:
    decision = validate(
        run({"memory": "100Gi"}, {"memory": "100Gi"}), policy(tmp_path), namespace="ml"
    )
    assert not decision.allowed
    assert {v.path for v in decision.violations if v.rule == PROFILE_RANGE} == {
        "spec.containers[0].resources.requests.memory",
        "spec.containers[0].resources.limits.memory",
    }


def test_the_model_needs_min_default_max_in_order() -> None:
    ok = ProfileResources.model_validate(
        {"requests": {"memory": {"min": "1Gi", "default": "1Gi", "max": "1Gi"}, "cpu": 2}}
    )
    assert ok.requests == {"memory": QuantityRange(min="1Gi", default="1Gi", max="1Gi"), "cpu": "2"}
    with pytest.raises(ValidationError, match="min <= default <= max"):
        ProfileResources.model_validate(
            {"requests": {"memory": {"min": "16Gi", "default": "8Gi", "max": "64Gi"}}}
        )


def errors(tmp_path: Path, profile: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        policy(tmp_path, profile=profile)
    return [str(e).replace(str(tmp_path) + "/", "") for e in caught.value.errors]


def test_lint_refuses_a_default_outside_its_range(tmp_path: Path) -> None:
    bad = PROFILE.replace(
        "{min: 16Gi, default: 32Gi, max: 64Gi}\n          gpu",
        "{min: 16Gi, default: 8Gi, max: 64Gi}\n          gpu",
        1,
    )
    bad = bad.replace(
        "{min: 1Gi, default: 10Gi, max: 20Gi}", "{min: 1Gi, default: 30Gi, max: 20Gi}"
    )
    assert errors(tmp_path, bad) == [
        'profiles.yaml:8: spec.resources.requests.memory.default: default "8Gi" is below '
        'min "16Gi"',
        "profiles.yaml:11: spec.resources.requests.ephemeral-storage.default: "
        'default "30Gi" is above max "20Gi"',
    ]


def test_lint_refuses_a_range_above_the_maximums(tmp_path: Path) -> None:
    bad = PROFILE.replace(
        "limits:\n          memory: {min: 16Gi, default: 32Gi, max: 64Gi}",
        "limits:\n          memory: {min: 16Gi, default: 32Gi, max: 96Gi}",
    )
    assert errors(tmp_path, bad) == [
        'profiles.yaml:13: spec.resources.limits.memory.max: "96Gi" is above the '
        'maximum "64Gi" (runpolicy.yaml:6)'
    ]


@pytest.mark.parametrize(
    ("written", "error"),
    [
        ("{min: 1Gi, default: 10Gi}", "ephemeral-storage.max: required key is missing"),
        (
            "{min: 1Gi, default: 10Gi, max: 20Gi, mx: 2}",
            'ephemeral-storage.mx: unknown key "mx" (did you mean "max"?)',
        ),
        ("{min: 1Gi, default: 10Gi, max: 20xx}", 'ephemeral-storage.max: "20xx" is not a quantity'),
        ("20xx", 'ephemeral-storage: "20xx" is not a quantity'),
    ],
)
def test_lint_names_what_is_wrong_in_a_range(tmp_path: Path, written: str, error: str) -> None:
    bad = PROFILE.replace("{min: 1Gi, default: 10Gi, max: 20Gi}", written)
    assert errors(tmp_path, bad) == [f"profiles.yaml:11: spec.resources.requests.{error}"]


def test_a_profile_object_with_a_range_above_the_maximums_is_refused() -> None:
    profile = {
        "apiVersion": "runguard.io/v1",
        "kind": "Profile",
        "metadata": {"name": "pick"},
        "spec": {
            "resources": {"requests": {"memory": {"min": "1Gi", "default": "2Gi", "max": "4Ti"}}}
        },
    }
    (error,) = check_object(profile, REPO / "policies").errors
    assert error.startswith('Profile pick: spec.resources.requests.memory.max: "4Ti" is above')


def test_on_update_a_value_outside_may_come_closer_never_go_further(tmp_path: Path) -> None:
    strict = policy(tmp_path, "Deny")
    old = mutate(run({"memory": "80Gi"}, {"memory": "80Gi"}), strict, namespace="ml").object

    def resized(memory: str) -> Any:
        new = json.loads(json.dumps(old))
        new["spec"]["containers"][0]["resources"] = {
            "requests": {**old["spec"]["containers"][0]["resources"]["requests"], "memory": memory},
            "limits": {**old["spec"]["containers"][0]["resources"]["limits"], "memory": memory},
        }
        return validate(new, strict, namespace="ml", old=old)

    assert resized("72Gi").allowed
    grown = resized("90Gi")
    assert not grown.allowed
    assert PROFILE_RANGE in {v.rule for v in grown.violations}


def test_a_request_above_the_range_without_a_limit_is_not_hidden_by_the_filled_limit(
    tmp_path: Path,
) -> None:
    # The limit filled for a run without one is its request, not the range's max: a max
    # there would lower the request quietly (the resources clamp) before the range's
    # own rule could deny it.
    (tmp_path / "deny").mkdir()
    (tmp_path / "clamp").mkdir()
    denied = evaluate(run({"memory": "100Gi"}), policy(tmp_path / "deny", "Deny"), namespace="ml")
    assert not denied.allowed
    assert (PROFILE_RANGE, "spec.containers[0].resources.requests.memory") in [
        (v.rule, v.path) for v in denied.violations
    ]
    clamped = evaluate(run({"memory": "100Gi"}), policy(tmp_path / "clamp"), namespace="ml")
    assert clamped.allowed, clamped.violations
    got = resources_of(clamped)
    assert (got["requests"]["memory"], got["limits"]["memory"]) == ("64Gi", "64Gi")
