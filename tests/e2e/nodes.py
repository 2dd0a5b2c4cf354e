"""The simulated nodes kwok runs for the whole path (``Cluster.start_whole_path``):
on-demand CPU nodes, GPU nodes (A100 and T4, tainted) and spot nodes, labelled as
runguard's profiles and preemption modes steer runs to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "A100_PRODUCT",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "GPU_TAINT",
    "KWOK_NODE_ANNOTATION",
    "MLRUN_SPOT_LABELS",
    "PLATFORM_SPOT_LABELS",
    "SIMULATED_NODES",
    "node_schedulable",
    "simulated_node",
]

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages the Nodes carrying it
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
A100_PRODUCT = "NVIDIA-A100-SXM4-80GB"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
# Spot nodes as policies/examples/mlrun/runpolicy.yaml's preemption section names them,
# and as the e2e platform policy (tests/cases/_policies/platform) does.
MLRUN_SPOT_LABELS = {"app.iguazio.com/lifecycle": "preemptible"}
PLATFORM_SPOT_LABELS = {"node-lifecycle": "spot"}


def simulated_node(
    name: str,
    *,
    cpu: str,
    memory: str,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    taints: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """A Node for kwok to run: capacity and allocatable as given, Ready once kwok sees it."""
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def _spot(labels: dict[str, str]) -> dict[str, Any]:
    """A spot node's labels, and a NoSchedule taint for each."""
    taints = [{"key": k, "value": v, "effect": "NoSchedule"} for k, v in labels.items()]
    return {"labels": labels, "taints": taints}


# The nodes start_whole_path() creates: what runguard's profiles and preemption modes
# steer runs to. The profiles name these labels (policies/profiles.yaml).
CPU_LARGE = {"labels": {"node.kubernetes.io/instance-type": "cpu-large"}}
SIMULATED_NODES: list[dict[str, Any]] = [
    simulated_node(name, cpu=cpu, memory=memory, **extra)
    for name, cpu, memory, extra in (
        ("kwok-cpu-0", "32", "128Gi", CPU_LARGE),
        ("kwok-cpu-1", "32", "128Gi", CPU_LARGE),
        ("kwok-gpu-a100-0", "64", "512Gi", {"gpus": 8, "taints": [GPU_TAINT],
                                            "labels": {GPU_PRODUCT_LABEL: A100_PRODUCT}}),
        ("kwok-gpu-t4-0", "32", "128Gi", {"gpus": 4, "taints": [GPU_TAINT],
                                          "labels": {GPU_PRODUCT_LABEL: "Tesla-T4"}}),
        ("kwok-spot-0", "32", "128Gi", _spot(MLRUN_SPOT_LABELS)),
        ("kwok-spot-1", "32", "128Gi", _spot(PLATFORM_SPOT_LABELS)),
    )
]  # fmt: skip


def node_schedulable(node: dict[str, Any]) -> bool:
    """Ready, and without the not-ready or unreachable taint: the scheduler may use it."""
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )
    taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
    return ready and not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
