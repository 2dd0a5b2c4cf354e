"""runguard beside a service mesh and the GPU operator, through the real apiserver.

runguard serves the shipped policies (their ``sharedConfigMaps`` and device families) in
place of the session's runguard. A run as Istio's injector leaves it is stored with its
CA bundle and its sidecar's own resources, the profile on its main container; MIG slices
above the NVIDIA family's maximum are refused although no ``nvidia.com/gpu`` is asked
for, and the same run within it is stored untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from harness.meshes import CA_MOUNTS, CA_VOLUMES, ISTIO_RESOURCES, istio_injected

from .cluster import Cluster
from .devcluster import Runguard
from .runs import (
    REPO,
    Webhook,
    create,
    get,
    instead_of_the_session,
    rule_ids,
    run_pod,
    wait_for_policy_label,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def shipped(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    """The shipped policies' profiles by name, runguard serving those policies meanwhile."""
    base = tmp_path_factory.mktemp("neighbours")
    server = Runguard(base / "server", REPO / "policies")
    profiles = {
        doc["metadata"]["name"]: doc["spec"]
        for path in sorted((REPO / "policies").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "Profile"
    }
    with instead_of_the_session(webhook, cluster, server):
        wait_for_policy_label(cluster, "digitalhub", "runguard with the shipped policies called")
        yield profiles


def test_a_meshed_run_is_stored_with_its_ca_bundle_and_the_profile_on_its_main_container(
    cluster: Cluster, namespace: str, shipped: dict[str, Any]
) -> None:
    # (the account a cluster's ServiceAccount admission names; the sidecar's token needs one)
    meshed = istio_injected(run_pod("meshed", "1xa100", serviceAccountName="default"))
    done = create(cluster, namespace, meshed)
    assert done.returncode == 0, done.stderr
    spec = get(cluster, namespace, "pod", "meshed")["spec"]
    # the CA bundle and the CRL, mounted by the sidecar, are kept
    volumes = {v["name"]: v for v in spec["volumes"]}
    for volume in CA_VOLUMES:
        assert volumes[volume["name"]]["configMap"] == {**volume["configMap"], "defaultMode": 420}
    validation, proxy = spec["initContainers"]
    assert [m for m in proxy["volumeMounts"] if m in CA_MOUNTS] == CA_MOUNTS
    # the sidecar and its init container keep Istio's own resources
    assert proxy["resources"] == ISTIO_RESOURCES
    assert validation["resources"] == ISTIO_RESOURCES
    # the profile sizes the main container only (``gpu`` is the policy's nvidia.com/gpu)
    main = spec["containers"][0]["resources"]
    for part, asked in shipped["1xa100"]["resources"].items():
        named = {"nvidia.com/gpu" if k == "gpu" else k: str(v) for k, v in asked.items()}
        assert {k: main[part][k] for k in named} == named


def test_mig_slices_above_the_nvidia_family_are_refused_and_within_it_stored(
    cluster: Cluster, namespace: str, shipped: dict[str, Any]
) -> None:
    def sliced(name: str, slices: str) -> dict[str, Any]:
        ask = {"nvidia.com/mig-3g.40gb": slices}
        container = {
            "name": "main",
            "image": "python:3.11",
            "resources": {"requests": dict(ask), "limits": dict(ask)},
        }
        return run_pod(name, containers=[container])

    # 5 slices of 3 compute units: 15 > 14 (two GPUs' worth), though no nvidia.com/gpu
    done = create(cluster, namespace, sliced("over", "5"))
    assert done.returncode != 0
    assert rule_ids(done.stderr) == {"resources.exceeded"}
    assert "family:nvidia" in done.stderr
    assert cluster.kubectl("get", "pod", "-n", namespace, "over").returncode != 0

    done = create(cluster, namespace, sliced("within", "4"))
    assert done.returncode == 0, done.stderr
    resources = get(cluster, namespace, "pod", "within")["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/mig-3g.40gb"] == "4"
    assert resources["requests"]["nvidia.com/mig-3g.40gb"] == "4"
