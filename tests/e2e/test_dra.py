"""Devices by dynamic resource allocation through the real apiserver (resource.k8s.io/v1,
Kubernetes 1.34 and later): kwok nodes publishing ResourceSlices of a fake GPU driver
under NVIDIA's DeviceClass names, the scheduler allocating claims.

runguard serves the shipped policies (gpu maximum 2 per run; ``resources.deviceClasses``
gpu.nvidia.com and mig.nvidia.com) with its cluster-state watch (which reads the
ResourceClaimTemplates with their spec, and run Pods), in place of the session's. Then:

* a run with a 1-GPU claim template is scheduled and its claim allocated;
* a run with an 8-GPU claim template is refused, naming the maximum;
* a run created before its 8-GPU template exists is admitted, and the claim the
  resource-claim controller makes from the template is refused: the run never gets
  more than its maximum, and stays pending;
* on 1.37, a run of the shipped ``1xa100`` profile (``nvidia.com/gpu: 1``) lands on a
  DRA pool of A100s when the DeviceClass maps ``nvidia.com/gpu``
  (``spec.extendedResourceName``, GA and on in 1.37: no feature gate), the device-plugin
  A100 node cordoned: the scheduler's claim for it is admitted by runguard (counted as
  the Pod's GPU, not twice) and allocated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from .build import kubernetes_version
from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .nodes import A100_PRODUCT, GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TAINT, simulated_node
from .runs import (
    REPO,
    Webhook,
    apply,
    create,
    get,
    instead_of_the_session,
    run_pod,
    until,
    wait_for_policy_label,
)

pytestmark = pytest.mark.e2e

DRIVER = "gpu.nvidia.com"  # the fake driver takes the name of NVIDIA's
NODE = "kwok-dra-0"


def device_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def resource_slice(node: str, gpus: int) -> dict[str, Any]:
    """The fake driver's devices on ``node``: ``gpus`` whole GPUs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(gpus)
            ],
        },
    }


def template(name: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": count}}
                    ]
                }
            }
        },
    }


def claiming_run(name: str, claim_template: str) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11", "resources": {"claims": [{"name": "g"}]}}
    return run_pod(
        name,
        containers=[container],
        resourceClaims=[{"name": "g", "resourceClaimTemplateName": claim_template}],
        nodeSelector={"kubernetes.io/hostname": NODE},
    )


@pytest.fixture(scope="module")
def dra(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[str]:
    served = cluster.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name")
    if (
        "resourceslices.resource.k8s.io" not in served.stdout
        or cluster.kubectl("get", "--raw", "/apis/resource.k8s.io/v1").returncode
    ):
        pytest.skip("this release does not serve resource.k8s.io/v1 (Kubernetes 1.34 and later)")
    namespace = f"t-dra-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", namespace, check=True)
    node = simulated_node(NODE, cpu="32", memory="128Gi")
    objects = [node, device_class(DRIVER), device_class("mig.nvidia.com"), resource_slice(NODE, 8)]
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
    server = Runguard(
        tmp_path_factory.mktemp("dra"),
        REPO / "policies",
        serve_args=("--cluster-state", str(cluster.kubeconfig)),
    )
    prepare_cluster(cluster)
    with instead_of_the_session(webhook, cluster, server):
        wait_for_policy_label(cluster, "digitalhub", "runguard with DRA counted called")
        cluster.start_whole_path()
        try:
            yield namespace
        finally:
            cluster.stop_whole_path()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_a_one_gpu_template_run_is_scheduled_and_its_claim_allocated(
    cluster: Cluster, dra: str
) -> None:
    assert create(cluster, dra, template("one-gpu", 1)).returncode == 0
    until(
        "the template in runguard's cache",
        lambda: (
            apply(cluster, dra, claiming_run("probe", "one-gpu"), "--dry-run=server").returncode
            == 0
        ),
        30,
    )
    done = apply(cluster, dra, claiming_run("one", "one-gpu"))
    assert done.returncode == 0, done.stderr
    until(
        "the run scheduled",
        lambda: get(cluster, dra, "pod", "one")["spec"].get("nodeName") == NODE,
        60,
    )
    statuses = get(cluster, dra, "pod", "one")["status"].get("resourceClaimStatuses") or []
    (claim,) = [s["resourceClaimName"] for s in statuses]
    allocated = get(cluster, dra, "resourceclaim", claim)["status"]["allocation"]
    assert len(allocated["devices"]["results"]) == 1


def test_an_eight_gpu_template_run_is_refused_naming_the_maximum(
    cluster: Cluster, dra: str
) -> None:
    assert create(cluster, dra, template("eight-gpus", 8)).returncode == 0
    refused = until(
        "the template counted",
        lambda: (
            (done := apply(cluster, dra, claiming_run("eight", "eight-gpus"))).returncode and done
        ),
        30,
    )
    assert "resources.exceeded" in refused.stderr
    assert "8 gpu (8 by template eight-gpus), above the maximum 2 for one run" in refused.stderr


def test_a_template_created_after_its_pod_gets_the_run_no_more_than_its_maximum(
    cluster: Cluster, dra: str
) -> None:
    done = apply(cluster, dra, claiming_run("early", "later-gpus"))
    assert done.returncode == 0, done.stderr  # nothing to count yet
    assert create(cluster, dra, template("later-gpus", 8)).returncode == 0
    # The resource-claim controller retries and says each refusal as an event of the Pod
    # (the e2e audit policy does not log resourceclaims).
    refusals = until(
        "the controller's claim refused",
        lambda: [
            e["message"]
            for e in json.loads(
                cluster.kubectl(
                    "get", "events", "-n", dra, "-o", "json",
                    "--field-selector",
                    "involvedObject.name=early,reason=FailedResourceClaimCreation",
                    check=True,
                ).stdout
            )["items"]
            if "runguard denied ResourceClaim" in e["message"]
        ],
        60,
    )  # fmt: skip
    assert "above the maximum 2 for one run" in refusals[0]
    claims = cluster.kubectl("get", "resourceclaims", "-n", dra, "-o", "json", check=True)
    owners = [
        ref["name"]
        for item in json.loads(claims.stdout)["items"]
        for ref in item["metadata"].get("ownerReferences", ())
    ]
    assert "early" not in owners
    assert not get(cluster, dra, "pod", "early")["spec"].get("nodeName")


DRA_A100 = "kwok-dra-a100-0"
PLUGIN_A100 = "kwok-gpu-a100-0"  # the whole path's device-plugin A100 node


@pytest.fixture
def dra_a100_pool(cluster: Cluster, dra: str) -> Iterator[None]:
    """A kwok node labelled and tainted as the device-plugin A100 node, its 8 GPUs
    published as a ResourceSlice (no ``nvidia.com/gpu`` in its allocatable), the
    DeviceClass mapping ``nvidia.com/gpu``, and the device-plugin A100 node cordoned;
    all undone after."""
    if kubernetes_version()[:2] < (1, 37):
        pytest.skip("a DeviceClass's extendedResourceName is on from Kubernetes 1.37")
    mapped = device_class(DRIVER)
    mapped["spec"]["extendedResourceName"] = GPU_RESOURCE
    node = simulated_node(
        DRA_A100,
        cpu="64",
        memory="512Gi",
        labels={GPU_PRODUCT_LABEL: A100_PRODUCT},
        taints=[GPU_TAINT],
    )
    objects = [mapped, node, resource_slice(DRA_A100, 8)]
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
    cluster.kubectl("cordon", PLUGIN_A100, check=True)
    try:
        yield
    finally:
        cluster.kubectl("uncordon", PLUGIN_A100)
        plain = json.dumps(device_class(DRIVER))
        cluster.kubectl("apply", "-f", "-", input=plain)
        cluster.kubectl("delete", "resourceslice", f"{DRA_A100}-{DRIVER}", "--wait=false")
        cluster.kubectl("delete", "node", DRA_A100, "--wait=false")


def test_a_profile_given_through_dra_lands_on_the_dra_pool(
    cluster: Cluster, dra: str, dra_a100_pool: None
) -> None:
    done = apply(cluster, dra, run_pod("a100-by-dra", "1xa100"))
    assert done.returncode == 0, done.stderr
    until(
        "the run scheduled on the DRA pool",
        lambda: get(cluster, dra, "pod", "a100-by-dra")["spec"].get("nodeName") == DRA_A100,
        60,
    )
    status = until(
        "the scheduler's claim recorded",
        lambda: get(cluster, dra, "pod", "a100-by-dra")["status"].get(
            "extendedResourceClaimStatus"
        ),
        30,
    )
    claim = get(cluster, dra, "resourceclaim", status["resourceClaimName"])
    annotations = claim["metadata"].get("annotations") or {}
    assert annotations.get("resource.kubernetes.io/extended-resource-claim") == "true"
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == DRIVER
    assert request["exactly"].get("count", 1) == 1
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [r["pool"] for r in results] == [DRA_A100]
