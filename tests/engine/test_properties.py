"""Properties of the engine on generated pods (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from harness.pod_strategies import PLATFORM, POLICY_SET, SETTINGS, STRICT, pods
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.engine import evaluate, mutate, shape, validate

# What mutation cannot fix under the platform policy (Strip / Clamp everywhere).
UNFIXABLE = {
    "profile.unknown",
    "security.host-namespace",
    "volumes.forbidden-type",
    "scheduling.preemption-mode",
}


@SETTINGS
@given(pod=pods(), policy=st.sampled_from(POLICY_SET))
def test_mutation_is_idempotent(pod: dict[str, Any], policy: Any) -> None:
    first = mutate(pod, policy)
    second = mutate(first.object, policy)
    assert second.patch == [], second.patch
    assert second.mutations == []


@SETTINGS
@given(pod=pods())
def test_after_mutation_only_unfixable_violations_remain(pod: dict[str, Any]) -> None:
    mutated = mutate(pod, PLATFORM).object
    # A run's total above a maximum is denied, never clamped (docs/dev/guarantees.md, "Every
    # admitted object"): clamping is per container, and there is no fair way to split a total the
    # user sized.
    rules = {
        v.rule
        for v in validate(mutated, PLATFORM).violations
        if not (v.rule == "resources.exceeded" and v.path.startswith("spec.resources."))
    }
    assert rules <= UNFIXABLE, rules - UNFIXABLE


@SETTINGS
@given(pod=pods(), policy=st.sampled_from(POLICY_SET))
def test_validation_allows_only_what_mutation_would_leave_unchanged(
    pod: dict[str, Any], policy: Any
) -> None:
    """The two webhooks tied together (docs/dev/guarantees.md, "Every admitted object"): a Pod
    validation allows on CREATE is one mutation would not change, so skipping /mutate gains
    nothing."""
    if validate(pod, policy).allowed and policy.first.enforcement == "Deny":
        assert mutate(pod, policy).patch == []


@SETTINGS
@given(pod=pods(), policy=st.sampled_from(POLICY_SET))
def test_patch_turns_the_input_into_the_result(pod: dict[str, Any], policy: Any) -> None:
    original = copy.deepcopy(pod)
    decision = mutate(pod, policy)
    assert pod == original, "mutate must not modify its input"
    assert jsonpatch.apply_patch(original, decision.patch) == decision.object


@SETTINGS
@given(pod=pods())
def test_strict_policy_denies_what_platform_fixes(pod: dict[str, Any]) -> None:
    """Deny mode never silently fixes: whatever Strip would remove, Deny reports."""
    stripped = {c.rule for c in mutate(pod, PLATFORM).mutations}
    denied = {v.rule for v in evaluate(pod, STRICT).violations}
    for rule in ("volumes.pre-existing", "secrets.forbidden"):
        if rule in stripped:
            assert rule in denied


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
pod_keys = st.sampled_from(
    [
        "containers",
        "initContainers",
        "volumes",
        "securityContext",
        "tolerations",
        "affinity",
        "nodeSelector",
        "priorityClassName",
        "hostNetwork",
    ]
)
container_keys = st.sampled_from(
    ["resources", "env", "envFrom", "securityContext", "volumeMounts", "name", "volumeDevices"]
)


@st.composite
def damaged_pods(draw: Any) -> Any:
    """A valid generated pod with garbage written into a few of its fields."""
    pod = draw(pods())
    spec = pod["spec"]
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["pod", "container", "metadata"]))
        if target == "pod":
            spec[draw(pod_keys)] = draw(json_values)
        elif target == "container":
            first = (
                (spec.get("containers") or [None])[0]
                if isinstance(spec.get("containers"), list)
                else None
            )
            if isinstance(first, dict):
                first[draw(container_keys)] = draw(json_values)
        else:
            pod["metadata"][draw(st.sampled_from(["labels", "annotations"]))] = draw(json_values)
    if draw(st.integers(0, 4)) == 0:
        pod[draw(st.sampled_from(["spec", "kind", "metadata"]))] = draw(json_values)
    return pod


@settings(max_examples=500, deadline=None)
@given(obj=st.one_of(damaged_pods(), json_values))
@pytest.mark.parametrize("policy", [PLATFORM, STRICT], ids=["platform", "strict"])
def test_nothing_raises(obj: Any, policy: Any) -> None:
    for fn in (mutate, validate, evaluate):
        decision = fn(obj, policy)
        assert isinstance(decision.allowed, bool)
        if decision.violations and any(v.rule == "input.invalid" for v in decision.violations):
            assert decision.allowed is False
            assert all(v.message for v in decision.violations)
        assert decision.error is None, decision.message()
        assert all(v.rule != "engine.error" for v in decision.violations)


@settings(max_examples=500, deadline=None)
@given(obj=damaged_pods())
def test_a_spec_the_shape_check_passes_never_breaks_a_step(obj: Any) -> None:
    """The shape check is the steps' only guard: whatever it lets through, every mutation
    step and every check handles without an exception (which would be ``engine.error``)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if isinstance(spec, dict) and shape.check_shape(spec, "spec") == []:
        for fn in (mutate, validate, evaluate):
            for policy in POLICY_SET:
                assert fn(obj, policy).error is None


@settings(max_examples=500, deadline=None)
@given(obj=damaged_pods())
def test_the_compiled_shape_check_and_the_walker_agree(obj: Any) -> None:
    """Both checkers come from one declaration: the yes/no function compiled from it says
    yes exactly when the walker that names problems finds none."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if isinstance(spec, dict):
        walker: list[Any] = []
        shape.POD_SPEC.check(spec, ("spec",), walker)
        containers = spec.get("containers")
        if isinstance(containers, list):
            shape.ListOf(shape.CONTAINER).check(containers, ("spec", "containers"), walker)
        compiled = shape.POD_SPEC.compile()(spec) and (
            not isinstance(containers, list) or shape.ListOf(shape.CONTAINER).compile()(containers)
        )
        assert compiled == (walker == []), walker
