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

from .build import build_binaries
from .cluster import Cluster
from .devcluster import (
    REAL_NODES,
    install,
    install_overlay,
    mutating_calls,
    prepare_cluster,
    run_labels,
    wait_ready_replicas,
)
from .nodes import SIMULATED_NODES
from .realnode import (
    CNI_RESULTS,
    KERNEL_TUNABLES,
    KUBELET_FIXED_PATHS,
    REAL_NODE,
    REAL_NODE_TAINT,
    REAL_NODE_TOLERATION,
    TUNABLES_RECORD,
    Netns,
    RealNode,
    build_image,
    ensure_tools,
    pod_subnet,
)
from .runs import poll, until
from .test_install import APPLY_NOISE, applied

pytestmark = pytest.mark.e2e


class RealCluster:
    def __init__(
        self, cluster: Cluster, nodes: list[RealNode], netns: Netns, overlay: Path
    ) -> None:
        self.cluster, self.nodes, self.netns, self.overlay = cluster, nodes, netns, overlay

    def pod_log(self, pod: dict[str, Any]) -> str:
        (node,) = [n for n in self.nodes if n.name == pod["spec"]["nodeName"]]
        return node.pod_log("runguard", pod["metadata"]["name"], "runguard")


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
    netns = Netns.create(directory)
    cluster = Cluster(directory, bin_dir, address=netns.address, netns=netns.name)
    # Two, as the shipped Deployment wants its 2 replicas on two nodes (and a drain of one
    # can then complete).
    nodes = [RealNode(cluster, directory / f"node-{i}", index=i) for i in range(2)]
    try:
        cluster.start()
        cluster.start_whole_path(SIMULATED_NODES)
        for node in nodes:
            node.directory.mkdir()
            node.start(images=[(image, image.rpartition(":")[0])])
        prepare_cluster(cluster)
        overlay = install_overlay(directory / "install", image, REAL_NODES, [REAL_NODE_TOLERATION])
        install(cluster, overlay)
        yield RealCluster(cluster, nodes, netns, overlay)
    finally:
        for node in nodes:
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
    assert not [p for n in nodes for p in CNI_RESULTS.glob(f"{n.network}-*")]
    if alone:  # what the kubelet changed outside its folders is the machine's again
        assert {k: (Path("/proc/sys") / k).read_text() for k in KERNEL_TUNABLES} == tunables
        assert [p.exists() for p in KUBELET_FIXED_PATHS] == existed


def test_nothing_in_the_cluster_has_a_route_out(real: RealCluster) -> None:
    routes = real.netns.routes()
    assert not [r for r in routes if r.startswith("default")], routes
    assert sorted(r.split()[0] for r in routes) == sorted(
        [f"198.18.{real.netns.slot}.0/30", pod_subnet(0), pod_subnet(1)]
    ), routes
    assert real.cluster.server == f"https://{real.netns.address}:{real.cluster.port}"


def test_the_shipped_deployment_runs_ready_on_the_real_node(real: RealCluster) -> None:
    pods = wait_ready_replicas(real.cluster, timeout=60)
    assert len(pods) == 2
    assert sorted(pod["spec"]["nodeName"] for pod in pods) == [n.name for n in real.nodes]
    for pod in pods:
        assert pod["spec"]["securityContext"]["fsGroup"] == 10001
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0 and "running" in status["state"], status
        assert status["image"].startswith("localhost/runguard:")
        # Really running: the kubelet wrote its log, and it is runguard's.
        log = real.pod_log(pod)
        assert "Permission denied" not in log
        assert "listening" in log.lower() or "booting" in log.lower(), log[-2000:]
    node = real.cluster.get_json(f"/api/v1/nodes/{REAL_NODE}")
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})


def test_only_what_tolerates_the_taint_lands_on_the_real_nodes(real: RealCluster) -> None:
    """Nothing is pulled on a real node: a Pod the scheduler put there by chance would sit
    in ImagePullBackOff. Both are registered tainted; runguard's replicas (the overlay's
    toleration) and a test's probe tolerate it, and nothing else lands there."""
    cluster = real.cluster
    for node in real.nodes:
        taints = cluster.get_json(f"/api/v1/nodes/{node.name}")["spec"].get("taints", [])
        assert REAL_NODE_TAINT in taints, (node.name, taints)
    for pod in wait_ready_replicas(cluster, timeout=60):
        assert REAL_NODE_TOLERATION in pod["spec"]["tolerations"], pod["spec"]["tolerations"]
    cluster.kubectl("create", "namespace", "plain", check=True)
    try:
        _lands_on_untainted_kwok_nodes_only(cluster)
        pinned = _pause_pod("pinned", nodeSelector=REAL_NODES)
        probe = _pause_pod("probe", nodeSelector=REAL_NODES, tolerations=[REAL_NODE_TOLERATION])
        for pod in (pinned, probe):
            cluster.kubectl("apply", "-n", "plain", "-f", "-", input=json.dumps(pod), check=True)
        # Without the toleration even a Pod selecting the real nodes stays unbound.
        condition = until("the scheduler's verdict on pinned", lambda: _unschedulable(
            cluster.get_json("/api/v1/namespaces/plain/pods/pinned")), timeout=60)  # fmt: skip
        assert "untolerated taint" in condition["message"], condition
        # With it, the probe really runs there: its container started from the local image.
        running = until("the probe running", lambda: _running(
            cluster.get_json("/api/v1/namespaces/plain/pods/probe")), timeout=60)  # fmt: skip
        assert running["spec"]["nodeName"] in {n.name for n in real.nodes}
        (status,) = running["status"]["containerStatuses"]
        assert "running" in status["state"] and status["restartCount"] == 0, status
        assert not cluster.get_json("/api/v1/namespaces/plain/pods/pinned")["spec"].get("nodeName")
    finally:
        cluster.kubectl("delete", "namespace", "plain", "--wait", "--timeout=120s", timeout=150)


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The Pod's PodScheduled condition if the scheduler found no node for it."""
    return next(
        (c for c in pod["status"].get("conditions", [])
         if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"),
        None,
    )  # fmt: skip


def _running(pod: dict[str, Any]) -> dict[str, Any] | None:
    return pod if pod["status"].get("phase") == "Running" else None


def _pause_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A plain Pod (no run labels: runguard never sees it) of the local pause image."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", **spec, "containers": [
            {"name": "main", "image": "localhost/pause:3.10", "imagePullPolicy": "Never"}]},
    }  # fmt: skip


def _lands_on_untainted_kwok_nodes_only(cluster: Cluster) -> None:
    """A plain Deployment's six replicas, spread by the scheduler: on the untainted kwok
    nodes, none on a real node (untainted, the real nodes were two of the four)."""
    template = _pause_pod("spread")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "spread"},
        "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "spread"}},
                 "template": {"metadata": {"labels": {"app": "spread"}},
                              "spec": template["spec"] | {"restartPolicy": "Always"}}},
    }  # fmt: skip
    cluster.kubectl("apply", "-n", "plain", "-f", "-", input=json.dumps(deployment), check=True)

    def bound() -> list[str] | None:
        pods = cluster.get_json("/api/v1/namespaces/plain/pods?labelSelector=app%3Dspread")
        nodes = [p["spec"].get("nodeName") for p in pods["items"]]
        return nodes if len(nodes) == 6 and all(nodes) else None

    untainted = {n["metadata"]["name"] for n in SIMULATED_NODES if not n["spec"].get("taints")}
    assert untainted and not untainted & {"real-0", "real-1"}
    assert set(until("the six replicas bound", bound, timeout=60)) <= untainted


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
    logs = "".join(real.pod_log(pod) for pod in wait_ready_replicas(cluster, timeout=60))
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
    # The Secret and both webhook configurations (caBundle copied from the Secret) too:
    # only kubectl's PDB noise is left (test_install.py).
    assert {name for name, verb in verbs.items() if verb != "unchanged"} == APPLY_NOISE
    assert {
        "secret/runguard-tls",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/runguard",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/runguard",
    } <= set(verbs)
    assert versions() == before
    assert cluster.kubectl("diff", "-k", str(overlay)).returncode == 0


class AdmissionLoop:
    """Creates run Pods (server-side dry runs: every webhook is called, nothing piles up)
    back to back in a thread, and keeps every answer: (time, HTTP status, message)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        import threading

        self.cluster = cluster
        self.url = f"{cluster.server}/api/v1/namespaces/{namespace}/pods?dryRun=All"
        labels = run_labels(cluster)
        self.body = json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "loop-", "labels": labels},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "localhost/pause:3.10"}]},
        }).encode()  # fmt: skip
        self.answers: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import ssl
        import time
        import urllib.error
        import urllib.request

        context: ssl.SSLContext = self.cluster._admin_context()
        while not self._stop.is_set():
            request = urllib.request.Request(
                self.url, data=self.body, method="POST",
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, context=context, timeout=30) as response:
                    self.answers.append((time.monotonic(), response.status, ""))
            except urllib.error.HTTPError as error:
                message = json.loads(error.read() or b"{}").get("message", "")
                self.answers.append((time.monotonic(), error.code, message))
            except OSError as error:
                self.answers.append((time.monotonic(), 0, str(error)))

    def __enter__(self) -> AdmissionLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def between(self, start: float, end: float) -> list[tuple[float, int, str]]:
        return [a for a in self.answers if start <= a[0] <= end]


def test_rollout_restart_and_drain_while_runs_are_created(real: RealCluster) -> None:
    """Operations on runguard itself (issue 20): `kubectl rollout restart` (maxSurge 1,
    maxUnavailable 0) and `kubectl drain` of a node holding a replica (the PDB lets one
    go at a time), while run Pods are admitted in a loop. No admission may fail."""
    import time

    cluster = real.cluster
    cluster.kubectl("create", "namespace", "loop", check=True)
    figures: dict[str, Any] = {}
    with AdmissionLoop(cluster, "loop") as loop:
        time.sleep(3)
        assert loop.answers and all(a[1] == 201 for a in loop.answers), (
            f"the loop's run Pod is not admitted by policies/ as shipped: {loop.answers[-1:]}"
        )
        start = time.monotonic()
        cluster.kubectl("-n", "runguard", "rollout", "restart", "deployment/runguard",
                        check=True)  # fmt: skip
        cluster.kubectl("-n", "runguard", "rollout", "status", "deployment/runguard",
                        "--timeout=180s", check=True, timeout=210)  # fmt: skip
        wait_ready_replicas(cluster, timeout=120)
        figures["rollout_s"] = round(time.monotonic() - start, 1)
        time.sleep(3)
        rollout_end = time.monotonic()

        (victim,) = [
            p["spec"]["nodeName"] for p in wait_ready_replicas(cluster, timeout=60)
            if p["spec"]["nodeName"] == real.nodes[1].name
        ] or [real.nodes[1].name]  # fmt: skip
        drained = time.monotonic()
        done = cluster.kubectl("drain", victim, "--ignore-daemonsets", "--delete-emptydir-data",
                               "--timeout=180s", timeout=210)  # fmt: skip
        assert done.returncode == 0, done.stderr
        figures["drain_s"] = round(time.monotonic() - drained, 1)
        pods = wait_ready_replicas(cluster, timeout=120)
        figures["drain_ready_s"] = round(time.monotonic() - drained, 1)
        assert {p["spec"]["nodeName"] for p in pods} == {real.nodes[0].name}
        time.sleep(3)
        end = time.monotonic()
    cluster.kubectl("uncordon", victim, check=True)

    phases = {
        "rollout": loop.between(start - 3, rollout_end),
        "drain": loop.between(rollout_end, end),
    }
    for phase, answers in phases.items():
        failed = [a for a in answers if a[1] != 201]
        figures[f"{phase}_admissions"] = len(answers)
        figures[f"{phase}_failed"] = len(failed)
        figures[f"{phase}_failures"] = sorted({a[2][:200] for a in failed})[:5]
    print("rollout/drain:", json.dumps(figures))
    (cluster.directory / "rollout-drain.json").write_text(json.dumps(figures, indent=2))
    assert loop.answers and all(answers for answers in phases.values())
    assert figures["rollout_failed"] == 0 and figures["drain_failed"] == 0, figures


def test_a_namespace_whose_cluster_was_killed_is_swept(tmp_path: Path) -> None:
    """What a killed test leaves (its namespace, a process in it, its record) goes at the
    next ``Netns.create`` once old enough; a fresh one stays."""
    import time

    from .realnode import NETNS_RECORDS

    old, fresh = Netns.create(tmp_path / "old"), Netns.create(tmp_path / "fresh")
    sleeper = subprocess.Popen(["nsenter", f"--net=/run/netns/{old.name}", "--", "sleep", "600"])
    try:
        # nsenter joins the namespace a moment after it starts: sweep once it is in there.
        inside = os.stat(f"/run/netns/{old.name}").st_ino
        poll(
            "the sleeper in the old namespace",
            lambda: os.stat(f"/proc/{sleeper.pid}/ns/net").st_ino == inside,
            timeout=10,
        )
        past = time.time() - 3600
        os.utime(NETNS_RECORDS / old.name, (past, past))
        removed = Netns.sweep_abandoned(min_age=900)
        assert old.name in removed and fresh.name not in removed
        assert sleeper.wait(timeout=10) == -9  # killed
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout  # fmt: skip
        assert old.name not in listed.split() and fresh.name in listed.split()
        assert not (NETNS_RECORDS / old.name).exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(timeout=10)
        fresh.delete()
        old.delete()
