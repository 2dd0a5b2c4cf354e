"""The floor through the real apiserver (``webhook/install/floor.py``): in the available
mode, with runguard stopped, a run asking for root, privilege, a hostPath or more GPUs
than the maximum is refused by the floor's ValidatingAdmissionPolicy, a compliant run is
admitted (unmutated); with runguard up, every decision is the engine's.

On 1.37 (manifest-based admission), a cluster of this module's own loads the static
manifests of ``runguard manifests --static``: deleting or editing runguard's webhook
configurations, floor, CRDs, or scaling its Deployment to zero, is refused to a
cluster-admin and allowed to the break-glass identity.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from webhook.engine import evaluate
from webhook.install.floor import FLOOR_LABELS, FLOOR_PREFIX
from webhook.install.static import PROTECT_NAME
from webhook.policy.loader import load_policy

from .build import build_binaries, kubernetes_version
from .cluster import Cluster
from .devcluster import runguard_command
from .runs import RUN_LABELS, Webhook, apply, get, run_pod, wait_for_admission

pytestmark = pytest.mark.e2e

REPO = Path(__file__).parent.parent.parent
FLOOR_SELECTOR = ",".join(f"{k}={v}" for k, v in FLOOR_LABELS.items())
BREAK_GLASS = "breakglass-admin"
FLOOR = f"{FLOOR_PREFIX}platform"  # the session policy's RunPolicy


def _wait(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _floor_refuses(cluster: Cluster) -> bool:
    """A server-side dry run of a root run Pod is refused by the floor (runguard up would
    have stripped root: only the floor, with runguard down, refuses it)."""
    probe = run_pod("floor-probe", securityContext={"runAsUser": 0})
    done = cluster.kubectl(
        "create", "-n", "default", "--dry-run=server", "-f", "-", input=json.dumps(probe)
    )
    return done.returncode != 0 and FLOOR in done.stderr


@pytest.fixture(scope="module")
def available(cluster: Cluster, webhook: Webhook) -> Iterator[Webhook]:
    """The session's runguard in the available mode, with the floor; afterwards fail
    closed again and without the floor, as the other modules expect it."""
    manifests = webhook.manifests_with("--available", floor=True)
    cluster.kubectl("apply", "-f", "-", input=manifests, check=True)
    try:
        yield webhook
    finally:
        if not webhook.running:
            webhook.start()
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "-l", FLOOR_SELECTOR, "--ignore-not-found", "--wait", check=True,
        )  # fmt: skip
        webhook.register(cluster)
        wait_for_admission(cluster, active=True)


def _gpus(count: str) -> dict[str, Any]:
    return {"requests": {"nvidia.com/gpu": count}, "limits": {"nvidia.com/gpu": count}}


def _main(**extra: Any) -> list[dict[str, Any]]:
    return [{"name": "main", "image": "python:3.11", **extra}]


BEYOND = {  # rule -> a run asking for what the floor refuses
    "security.root": run_pod("root", securityContext={"runAsUser": 0}),
    "security.privileged": run_pod(
        "privileged", containers=_main(securityContext={"privileged": True})
    ),
    "volumes.forbidden-type": run_pod(
        "host-path", volumes=[{"name": "host", "hostPath": {"path": "/"}}]
    ),
    "resources.exceeded": run_pod("gpus", containers=_main(resources=_gpus("4"))),
}
COMPLIANT = run_pod(
    "compliant",
    securityContext={"runAsNonRoot": True, "runAsUser": 1000},
    containers=_main(resources=_gpus("1"), securityContext={"allowPrivilegeEscalation": False}),
)


def test_with_runguard_down_the_floor_refuses_runs_beyond_it(
    cluster: Cluster, available: Webhook, namespace: str
) -> None:
    available.stop()
    try:
        _wait(lambda: _floor_refuses(cluster), "the floor to refuse with runguard down")
        for rule, pod in BEYOND.items():
            done = apply(cluster, namespace, pod)
            assert done.returncode != 0, (rule, done.stdout)
            assert f"ValidatingAdmissionPolicy '{FLOOR}'" in done.stderr, done.stderr
            assert f"[{rule}]" in done.stderr, done.stderr
        done = apply(cluster, namespace, COMPLIANT)
        assert done.returncode == 0, done.stderr
        # admitted unmutated: runguard did not see it
        stored = get(cluster, namespace, "pod", "compliant")
        assert stored["metadata"]["labels"] == RUN_LABELS
        assert "runguard.io/requested-by" not in stored["metadata"].get("annotations", {})
    finally:
        available.start()


def test_with_runguard_up_decisions_are_the_engines(
    cluster: Cluster, available: Webhook, namespace: str
) -> None:
    available.wait_ready()
    policy = load_policy(available.policy_dir)
    hostile = run_pod("host-network", hostNetwork=True)
    for pod in [*BEYOND.values(), hostile, COMPLIANT]:
        name = pod["metadata"]["name"]
        expected = evaluate(pod, policy, namespace=namespace)
        done = apply(cluster, namespace, pod)
        assert (done.returncode == 0) == expected.allowed, (name, done.stderr)
        if expected.allowed:  # mutated by runguard
            stored = get(cluster, namespace, "pod", name)
            assert stored["metadata"]["labels"]["runguard.io/policy"] == "platform"
            assert stored["spec"].get("securityContext", {}).get("runAsUser") != 0


# --- 1.37: the static manifests -----------------------------------------------------------


def _runguard(*args: str) -> None:
    subprocess.run([runguard_command(), *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def protected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of this module's own, its apiserver loading runguard's static manifests,
    with runguard's admission objects, CRDs and Deployment (nothing runs them)."""
    if kubernetes_version()[:2] < (1, 37):
        pytest.skip("manifest-based admission configuration is beta from Kubernetes 1.37")
    base = tmp_path_factory.mktemp("static")
    static = base / "static"
    _runguard("manifests", "-p", str(REPO / "policies"), "--static", str(static),
              "--break-glass", BREAK_GLASS)  # fmt: skip
    with Cluster(
        base / "cluster", build_binaries(), static_policies=static / "validating-admission-policy"
    ) as cluster:
        cluster.kubectl("create", "namespace", "runguard", check=True)
        objects = [
            REPO / "manifests" / n for n in ("webhooks.yaml", "floor.yaml", "deployment.yaml")
        ]
        for path in (
            *objects,
            *sorted((REPO / "manifests" / "policy-objects").glob("runguard.io_*")),
        ):
            cluster.kubectl("apply", "-n", "runguard", "-f", str(path), check=True)
        yield cluster


def test_static_manifests_refuse_cluster_admins_and_let_break_glass(protected: Cluster) -> None:
    cluster = protected
    breakglass = cluster.user(BREAK_GLASS, cluster_role="cluster-admin")
    targets = [
        ("validatingwebhookconfiguration", "runguard"),
        ("mutatingwebhookconfiguration", "runguard"),
        ("validatingadmissionpolicy", f"{FLOOR_PREFIX}digitalhub"),
        ("validatingadmissionpolicybinding", f"{FLOOR_PREFIX}digitalhub"),
        ("customresourcedefinition", "runpolicies.runguard.io"),
    ]
    _wait(
        lambda: (
            PROTECT_NAME in cluster.kubectl("label", *targets[0], "probe=1", "--overwrite").stderr
        ),
        "the static policy to be loaded",
    )
    for kind, name in targets:
        edited = cluster.kubectl("label", kind, name, "edited=yes", "--overwrite")
        assert edited.returncode != 0 and PROTECT_NAME in edited.stderr, (kind, edited.stderr)
        deleted = cluster.kubectl("delete", kind, name, "--wait=false")
        assert deleted.returncode != 0 and PROTECT_NAME in deleted.stderr, (kind, deleted.stderr)
        assert cluster.kubectl("get", kind, name).returncode == 0
    scaled = cluster.kubectl("scale", "deployment", "runguard", "-n", "runguard", "--replicas=0")
    assert scaled.returncode != 0 and PROTECT_NAME in scaled.stderr, scaled.stderr
    assert cluster.kubectl("scale", "deployment", "runguard", "-n", "runguard",
                           "--replicas=3").returncode == 0  # fmt: skip
    # An API object cannot take a static name.
    named = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": PROTECT_NAME},
        "spec": {"policyName": PROTECT_NAME, "validationActions": ["Warn"]},
    }
    assert cluster.kubectl("create", "-f", "-", input=json.dumps(named)).returncode != 0

    # The break-glass identity may.
    for kind, name in targets:
        edited = breakglass.kubectl("label", kind, name, "edited=yes", "--overwrite")
        assert edited.returncode == 0, (kind, edited.stderr)
    scaled = breakglass.kubectl("scale", "deployment", "runguard", "-n", "runguard", "--replicas=0")
    assert scaled.returncode == 0, scaled.stderr
    for kind, name in targets:
        deleted = breakglass.kubectl("delete", kind, name)
        assert deleted.returncode == 0, (kind, deleted.stderr)
