"""runguard installed from the shipped ``manifests/`` on a real node, as an admin installs
it: the image ``make image`` builds, run by a kubelet with containerd and runc, Ready by
its own probes, and called by the apiserver through the Service reference the shipped
webhook configurations name.

The cluster of this module is its own (``realnode.py``): everything in a network
namespace with no route out, beside kwok's simulated nodes. kwok alone cannot test an
install: it reports any Deployment rolled out, even of an image that does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import SIMULATED_NODES, Cluster, build_binaries
from .devcluster import (
    install,
    install_overlay,
    mutating_calls,
    prepare_cluster,
    run_labels,
    wait_ready_replicas,
)
from .realnode import (
    CNI_RESULTS,
    KERNEL_TUNABLES,
    KUBELET_FIXED_PATHS,
    POD_SUBNET,
    REAL_NODE,
    TUNABLES_RECORD,
    Netns,
    RealNode,
    build_image,
    ensure_tools,
)
from .test_install import APPLY_NOISE, applied

pytestmark = pytest.mark.e2e

# kustomize folds the caBundle it copies from the Secret, as the Secret's own data.
WEBHOOK_NOISE = {
    "mutatingwebhookconfiguration.admissionregistration.k8s.io/runguard",
    "validatingwebhookconfiguration.admissionregistration.k8s.io/runguard",
}


class RealCluster:
    def __init__(self, cluster: Cluster, node: RealNode, netns: Netns, overlay: Path) -> None:
        self.cluster, self.node, self.netns, self.overlay = cluster, node, netns, overlay


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    if os.environ.get("RUNGUARD_E2E") == "0":
        pytest.skip("RUNGUARD_E2E=0: end-to-end tests disabled")
    ensure_tools()
    image = build_image()
    bin_dir = build_binaries()
    directory = tmp_path_factory.mktemp("realnode")
    alone = not TUNABLES_RECORD.exists()  # no other kubelet of ours has changed them
    tunables = {k: (Path("/proc/sys") / k).read_text() for k in KERNEL_TUNABLES}
    existed = [p.exists() for p in KUBELET_FIXED_PATHS]
    netns = Netns.create()
    cluster = Cluster(directory, bin_dir, address=netns.address, netns=netns.name)
    node = RealNode(cluster, directory / "node")
    try:
        cluster.start()
        cluster.start_whole_path(SIMULATED_NODES)
        (directory / "node").mkdir()
        node.start(images=[(image, image.rpartition(":")[0])])
        prepare_cluster(cluster)
        overlay = install_overlay(directory / "install", image, REAL_NODE)
        install(cluster, overlay)
        yield RealCluster(cluster, node, netns, overlay)
    finally:
        node.stop()
        cluster.stop()
        netns.delete()
    # Everything is gone: the namespace, its link, every mount of the node.
    assert (
        netns.name
        not in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert f" {netns.host_link}@" not in links.stdout
    assert str(directory) not in Path("/proc/self/mountinfo").read_text()
    assert not list(CNI_RESULTS.glob(f"{node.network}-*"))
    if alone:  # what the kubelet changed outside its folders is the machine's again
        assert {k: (Path("/proc/sys") / k).read_text() for k in KERNEL_TUNABLES} == tunables
        assert [p.exists() for p in KUBELET_FIXED_PATHS] == existed


def test_nothing_in_the_cluster_has_a_route_out(real: RealCluster) -> None:
    routes = real.netns.routes()
    assert not [r for r in routes if r.startswith("default")], routes
    assert sorted(r.split()[0] for r in routes) == sorted(
        [f"198.18.{real.netns.slot}.0/30", POD_SUBNET]
    ), routes
    assert real.cluster.server == f"https://{real.netns.address}:{real.cluster.port}"


def test_the_shipped_deployment_runs_ready_on_the_real_node(real: RealCluster) -> None:
    pods = wait_ready_replicas(real.cluster, timeout=60)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == REAL_NODE
        assert pod["spec"]["securityContext"]["fsGroup"] == 10001
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0 and "running" in status["state"], status
        assert status["image"].startswith("localhost/runguard:")
        # Really running: the kubelet wrote its log, and it is runguard's.
        log = real.node.pod_log("runguard", pod["metadata"]["name"], "runguard")
        assert "Permission denied" not in log
        assert "listening" in log.lower() or "booting" in log.lower(), log[-2000:]
    node = real.cluster.get_json(f"/api/v1/nodes/{REAL_NODE}")
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})


def test_a_run_pod_created_with_kubectl_is_mutated_through_the_service(
    real: RealCluster,
) -> None:
    cluster = real.cluster
    cluster.kubectl("create", "namespace", "ml-real", check=True)
    labels = ",".join(f"{k}={v}" for k, v in run_labels(cluster).items())
    done = cluster.kubectl(
        "-n", "ml-real", "run", "probe", "--image=localhost/pause:3.10",
        "--image-pull-policy=Never", "--restart=Never", "-l", labels, "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    created: dict[str, Any] = json.loads(done.stdout)
    assert created["metadata"]["uid"]
    calls = mutating_calls(cluster, "ml-real", "probe")
    assert {"configuration": "runguard", "webhook": "mutate.runguard.io", "mutated": True} in [
        {k: c.get(k) for k in ("configuration", "webhook", "mutated")} for c in calls
    ], calls
    # Served by a replica on the real node: its decision log names the request.
    logs = "".join(
        real.node.pod_log("runguard", pod["metadata"]["name"], "runguard")
        for pod in wait_ready_replicas(cluster, timeout=60)
    )
    mutated = [
        json.loads(line.split(" ", 3)[3])
        for line in logs.splitlines()
        if '"endpoint":"mutate"' in line and '"name":"probe"' in line
    ]
    assert [m["uid"] for m in mutated if m["namespace"] == "ml-real"], logs[-3000:]


def test_a_second_apply_of_the_whole_base_changes_nothing(real: RealCluster) -> None:
    cluster, overlay = real.cluster, real.overlay
    first = applied(cluster.kubectl("apply", "-k", str(overlay), check=True).stdout)

    def versions() -> dict[str, str]:
        return {
            name: cluster.kubectl(
                "get", name, "-n", "runguard", "-o", "jsonpath={.metadata.resourceVersion}",
                check=True,
            ).stdout
            for name in first
        }  # fmt: skip

    before = versions()
    verbs = applied(cluster.kubectl("apply", "-k", str(overlay), check=True).stdout)
    assert set(verbs) == set(first)
    assert {name for name, verb in verbs.items() if verb != "unchanged"} == (
        APPLY_NOISE | WEBHOOK_NOISE
    )
    assert versions() == before
    assert cluster.kubectl("diff", "-k", str(overlay)).returncode == 0
