"""Properties of the engine on generated pods (hypothesis)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.engine import evaluate, mutate, shape, validate
from webhook.policy.loader import load_policy

POLICIES = Path(__file__).parent / "cases" / "_policies"
PLATFORM = load_policy(POLICIES / "platform")
STRICT = load_policy(POLICIES / "strict")
POLICY_SET = [PLATFORM, STRICT, load_policy(POLICIES / "lenient"), load_policy(POLICIES / "warn")]

# What mutation cannot fix under the platform policy (Strip / Clamp everywhere).
UNFIXABLE = {
    "profile.unknown",
    "security.host-namespace",
    "volumes.forbidden-type",
    "scheduling.preemption-mode",
}

quantities = st.sampled_from(
    ["0.5", "500m", "1e3", "1G", "1Gi", "64Gi", "70G", "128Gi", "2", "16", "32", 1, 0.25, "100Mi"]
)
resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"])
resource_map = st.dictionaries(resource_names, quantities, max_size=4)
ids = st.sampled_from([0, 0, 1000, 8877])
secret_names = st.sampled_from(["sec-db-r1", "aws-creds", "sec-x-r2", "github"])
claim_names = st.sampled_from(["v-r1-data", "team-data", "v-r2-x"])
config_maps = st.sampled_from(["init-config-map-r1", "shared"])
capabilities = st.lists(st.sampled_from(["SYS_ADMIN", "NET_BIND_SERVICE", "NET_ADMIN"]), max_size=3)


@st.composite
def security_contexts(draw: Any, *, pod: bool) -> dict[str, Any]:
    sc: dict[str, Any] = {}
    keys = ["runAsUser", "runAsGroup"] + (["fsGroup"] if pod else [])
    for key in keys:
        if draw(st.booleans()):
            sc[key] = draw(ids)
    if draw(st.booleans()):
        sc["runAsNonRoot"] = draw(st.booleans())
    if draw(st.booleans()):
        sc["seccompProfile"] = {"type": draw(st.sampled_from(["Unconfined", "RuntimeDefault"]))}
    if not pod:
        for key in ("privileged", "allowPrivilegeEscalation"):
            if draw(st.booleans()):
                sc[key] = draw(st.booleans())
        if draw(st.booleans()):
            sc["capabilities"] = {"add": draw(capabilities), "drop": draw(capabilities)}
    return sc


@st.composite
def containers(draw: Any, name: str, volume_names: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "python:3.11"}
    if draw(st.booleans()):
        c["resources"] = {"requests": draw(resource_map), "limits": draw(resource_map)}
    if draw(st.booleans()):
        c["securityContext"] = draw(security_contexts(pod=False))
    if draw(st.booleans()):
        c["env"] = [
            {
                "name": f"E{i}",
                "valueFrom": {"secretKeyRef": {"name": draw(secret_names), "key": "k"}},
            }
            if draw(st.booleans())
            else {"name": f"E{i}", "value": "v"}
            for i in range(draw(st.integers(0, 3)))
        ]
    if draw(st.booleans()):
        c["envFrom"] = [{"secretRef": {"name": draw(secret_names)}}]
    if volume_names and draw(st.booleans()):
        c["volumeMounts"] = [{"name": v, "mountPath": f"/{v}"} for v in volume_names]
    return c


@st.composite
def volumes(draw: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["pvc", "cm", "secret", "projected", "emptyDir", "hostPath"]))
        name = f"v{i}"
        if kind == "pvc":
            out.append({"name": name, "persistentVolumeClaim": {"claimName": draw(claim_names)}})
        elif kind == "cm":
            out.append({"name": name, "configMap": {"name": draw(config_maps)}})
        elif kind == "secret":
            out.append({"name": name, "secret": {"secretName": draw(secret_names)}})
        elif kind == "projected":
            srcs = [
                {"secret": {"name": draw(secret_names)}} for _ in range(draw(st.integers(0, 2)))
            ]
            out.append({"name": name, "projected": {"sources": srcs}})
        elif kind == "emptyDir":
            out.append({"name": name, "emptyDir": {}})
        elif kind == "hostPath" and draw(st.integers(0, 4)) == 0:
            out.append({"name": name, "hostPath": {"path": "/"}})
    return out


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "dhcore"}
    if draw(st.booleans()):
        labels["dhcore/run"] = "r1"
    profile = draw(st.sampled_from([None, "default", "1xa100", "1xa100", "missing"]))
    if profile:
        labels["dhcore/template"] = profile
    annotations = {}
    mode = draw(st.sampled_from([None, "allow", "constrain", "prevent", "none"]))
    if mode:
        annotations["runguard.io/preemption-mode"] = mode
    vols = draw(volumes())
    names = [v["name"] for v in vols]
    spec: dict[str, Any] = {
        "containers": [draw(containers(f"c{i}", names)) for i in range(draw(st.integers(1, 3)))],
    }
    if draw(st.booleans()):
        spec["initContainers"] = [draw(containers("init", names))]
    if vols:
        spec["volumes"] = vols
    if draw(st.booleans()):
        spec["securityContext"] = draw(security_contexts(pod=True))
    if draw(st.booleans()):
        spec["priorityClassName"] = draw(st.sampled_from(["low", "high", "urgent"]))
    if draw(st.booleans()):
        spec["tolerations"] = [
            {"key": "node-lifecycle", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "t4", "effect": "NoSchedule"},
        ][: draw(st.integers(1, 2))]
    if draw(st.booleans()):
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        }
    if draw(st.integers(0, 5)) == 0:
        spec["hostNetwork"] = True
    meta: dict[str, Any] = {"name": "p", "namespace": "ml", "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
    if validate(pod, policy).allowed and policy.enforcement == "Deny":
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
