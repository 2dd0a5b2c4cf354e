"""Which namespaces may use a profile, and ranges in a profile, through the real apiserver.

runguard serves the shipped policies with its cluster-state watch, the A100 profile kept
to team A's namespaces (``namespaceSelector`` over the Namespace's labels, which the
watch reads) and one profile of ranges, registered in place of the session's runguard:
team A's run gets the A100 profile, the same run in team B is refused naming the
profiles team B may use, and a run's values are kept, defaulted and clamped by the
ranges.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

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

TEAM = "example.com/team"
RANGED = {
    "apiVersion": "runguard.io/v1",
    "kind": "Profile",
    "metadata": {"name": "ranged"},
    "spec": {
        "description": "1 to 4 cores, 8Gi to 64Gi",
        "resources": {
            "requests": {
                "cpu": {"min": "1", "default": "2", "max": "4"},
                "memory": {"min": "8Gi", "default": "16Gi", "max": "64Gi"},
            },
            "limits": {"memory": {"min": "8Gi", "default": "16Gi", "max": "64Gi"}},
        },
    },
}


@pytest.fixture(scope="module")
def teams(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[tuple[str, str]]:
    """(team A's namespace, team B's), runguard serving the edited policies meanwhile."""
    base = tmp_path_factory.mktemp("profiles")
    policies = base / "policies"
    policies.mkdir()
    for path in (REPO / "policies").glob("*.yaml"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            if doc["kind"] == "Profile" and doc["metadata"]["name"] == "1xa100":
                doc["spec"]["namespaceSelector"] = {"matchLabels": {TEAM: "team-a"}}
        if path.name == "profiles.yaml":
            docs.append(RANGED)
        (policies / path.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    suffix = os.urandom(3).hex()
    team_a, team_b = f"t-team-a-{suffix}", f"t-team-b-{suffix}"
    for name in (team_a, team_b):
        cluster.kubectl("create", "namespace", name, check=True)
    cluster.kubectl("label", "namespace", team_a, f"{TEAM}=team-a", check=True)
    server = Runguard(
        base / "server", policies, serve_args=("--cluster-state", str(cluster.kubeconfig))
    )
    try:
        with instead_of_the_session(webhook, cluster, server):
            wait_for_policy_label(cluster, "digitalhub", "runguard with the kept profile called")
            yield team_a, team_b
    finally:
        cluster.kubectl("delete", "namespace", team_a, team_b, "--wait=false")


def test_a_kept_profile_serves_its_team_and_refuses_another(
    cluster: Cluster, teams: tuple[str, str]
) -> None:
    team_a, team_b = teams
    done = create(cluster, team_a, run_pod("a100", "1xa100"))
    assert done.returncode == 0, done.stderr
    spec = get(cluster, team_a, "pod", "a100")["spec"]
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"

    done = create(cluster, team_b, run_pod("a100", "1xa100"))
    assert done.returncode != 0
    assert rule_ids(done.stderr) == {"profile.not-allowed"}
    assert (
        f"profile '1xa100' is not for namespace '{team_b}' "
        "(it may use: 1xt4, 2xa100, cpu-large, ranged)"
    ) in done.stderr
    assert cluster.kubectl("get", "pod", "-n", team_b, "a100").returncode != 0


def test_ranges_keep_default_and_clamp(cluster: Cluster, teams: tuple[str, str]) -> None:
    _, team_b = teams
    asked = {"name": "main", "image": "python:3.11"}
    kept = {**asked, "resources": {"requests": {"cpu": "3", "memory": "96Gi"}}}
    done = create(cluster, team_b, run_pod("picked", "ranged", containers=[kept]))
    assert done.returncode == 0, done.stderr
    assert "memory request 96Gi -> 64Gi" in done.stderr  # kubectl prints the warning
    resources = get(cluster, team_b, "pod", "picked")["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "3", "memory": "64Gi"}
    assert resources["limits"] == {"memory": "64Gi"}

    done = create(cluster, team_b, run_pod("defaulted", "ranged", containers=[asked]))
    assert done.returncode == 0, done.stderr
    resources = get(cluster, team_b, "pod", "defaulted")["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "2", "memory": "16Gi"}, "limits": {"memory": "16Gi"}}
