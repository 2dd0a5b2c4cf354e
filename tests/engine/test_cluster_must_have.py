"""The cluster must have what runguard writes (docs/dev/guarantees.md, "Ownership"): a profile's
priority or runtime class the cluster lacks is never set, or the apiserver would refuse every
run."""

from __future__ import annotations

from typing import Any

from harness import TESTS

from webhook.clusterstate.static import StaticClusterState
from webhook.engine import evaluate
from webhook.engine.context import Context
from webhook.policy.loader import load_policy

POLICY = load_policy(TESTS / "cases" / "_policies" / "platform")


def gpu_run() -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
    labels["dhcore/template"] = "1xa100"  # sets priorityClassName high, runtimeClassName nvidia
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
    }


def cls(kind: str, name: str) -> dict[str, Any]:
    api = "scheduling.k8s.io/v1" if kind == "PriorityClass" else "node.k8s.io/v1"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "uid": f"u-{name}"}}


def test_a_class_the_cluster_lacks_is_not_written() -> None:
    state = StaticClusterState.from_documents([cls("PriorityClass", "medium")])
    decision = evaluate(gpu_run(), POLICY, context=Context(state=state))
    spec = decision.object["spec"]
    assert "runtimeClassName" not in spec
    assert spec.get("priorityClassName") != "high"
    assert any("the cluster has no RuntimeClass nvidia" in w for w in decision.warnings) or any(
        "not set" in w for w in decision.warnings
    )


def test_a_class_the_cluster_has_is_written() -> None:
    state = StaticClusterState.from_documents(
        [cls("PriorityClass", "high"), cls("RuntimeClass", "nvidia")]
    )
    spec = evaluate(gpu_run(), POLICY, context=Context(state=state)).object["spec"]
    assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("high", "nvidia")


def test_without_a_cluster_view_the_profile_is_applied_as_written() -> None:
    spec = evaluate(gpu_run(), POLICY).object["spec"]
    assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("high", "nvidia")


def test_a_default_priority_class_the_cluster_lacks_is_never_set() -> None:
    run = gpu_run()
    run["metadata"]["labels"].pop("dhcore/template")  # no profile: the default class
    state = StaticClusterState.from_documents([cls("PriorityClass", "high")])
    spec = evaluate(run, POLICY, context=Context(state=state)).object["spec"]
    assert "priorityClassName" not in spec  # 'medium' is not in the cluster
    state = StaticClusterState.from_documents([cls("PriorityClass", "medium")])
    spec = evaluate(run, POLICY, context=Context(state=state)).object["spec"]
    assert spec["priorityClassName"] == "medium"
