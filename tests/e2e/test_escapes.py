"""Doors into a running run, tried through the real apiserver as a user with kubectl would
(issue 9): every Pod subresource that changes a spec is routed to runguard, a resize past
the maximums is refused (where the release has resizes), a run cannot relabel itself out
of runguard's sight, and a PodList is judged item by item as kubectl creates it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from webhook.install.manifests import POD_SPEC_SUBRESOURCES

from .build import kubernetes_version
from .cluster import Cluster
from .runs import Webhook, apply, get, rule_ids, run_pod

pytestmark = pytest.mark.e2e

# pods/resize is served from 1.33 on (in-place resize beta, on by default); before, a
# Pod's resources cannot change at all. The webhook rule naming it is accepted anyway.
RESIZE = kubernetes_version() >= (1, 33)

# Pod subresources that cannot change the spec: status, scheduling, eviction, streams.
NOT_SPEC = {
    "pods/status",
    "pods/binding",
    "pods/eviction",
    "pods/log",
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "pods/proxy",
}


def test_every_pod_subresource_that_changes_the_spec_is_routed_to_runguard(
    cluster: Cluster, runguard: Webhook
) -> None:
    """Read from the real apiserver's discovery: a subresource it gains fails this test
    until it is classified, so a new door is never open by default."""
    discovery = cluster.get_json("/api/v1")
    writable = {
        r["name"]
        for r in discovery["resources"]
        if r["name"].startswith("pods/") and {"update", "patch"} & set(r.get("verbs", []))
    }
    served = set(POD_SPEC_SUBRESOURCES) - (set() if RESIZE else {"pods/resize"})
    assert writable - NOT_SPEC == served
    installed = json.loads(
        cluster.kubectl(
            "get", "validatingwebhookconfiguration", "runguard", "-o", "json", check=True
        ).stdout
    )
    routed = {
        resource
        for hook in installed["webhooks"]
        for rule in hook["rules"]
        for resource in rule["resources"]
    }
    assert set(POD_SPEC_SUBRESOURCES) <= routed


def resize(
    cluster: Cluster, namespace: str, name: str, cpu: str
) -> subprocess.CompletedProcess[str]:
    patch = {
        "spec": {
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}
            ]
        }
    }
    result: subprocess.CompletedProcess[str] = cluster.kubectl(
        "patch", "-n", namespace, "pod", name, "--subresource", "resize", "-p", json.dumps(patch)
    )
    return result


def test_a_resize_past_the_maximums_is_refused(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    body = run_pod("train")
    body["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    assert apply(cluster, namespace, body).returncode == 0

    def cpu_limit() -> str:
        pod = get(cluster, namespace, "pod", "train")
        limit: str = pod["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        return limit

    if not RESIZE:
        # No resize to judge: the apiserver has no such subresource (and the release's
        # kubectl has no `patch --subresource resize`). The whole Pod PUT to it, as a
        # client of a later release would send it, is not found.
        pod = get(cluster, namespace, "pod", "train")
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "64"
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
        path = f"/api/v1/namespaces/{namespace}/pods/train/resize"
        sent = cluster.kubectl("replace", "--raw", path, "-f", "-", input=json.dumps(pod))
        assert sent.returncode != 0
        assert "the server could not find the requested resource" in sent.stderr, sent.stderr
        assert cpu_limit() == "1"
        return
    denied = resize(cluster, namespace, "train", "64")
    assert denied.returncode != 0
    assert "resources.exceeded" in rule_ids(denied.stderr), denied.stderr
    assert cpu_limit() == "1"
    # within the maximum, and the profile's (default: a cpu request of 1) kept
    patch = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}]}}
    within = cluster.kubectl(
        "patch", "-n", namespace, "pod", "train", "--subresource", "resize", "-p", json.dumps(patch)
    )
    assert within.returncode == 0, within.stderr


def test_a_resize_away_from_an_exact_profile_is_refused(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    """The attack review's chain: a run of an exact profile (1xa100: cpu 8) resized to
    more cores under the maximum (16) went through; the profile is now judged on a resize
    (``resources.grown``), and a resize the profile leaves free (the cpu limit) is not."""
    if not RESIZE:
        pytest.skip("no pods/resize in this release")
    assert apply(cluster, namespace, run_pod("train", "1xa100")).returncode == 0

    def sent(part: dict[str, dict[str, str]]) -> subprocess.CompletedProcess[str]:
        patch = {"spec": {"containers": [{"name": "main", "resources": part}]}}
        result: subprocess.CompletedProcess[str] = cluster.kubectl(
            "patch", "-n", namespace, "pod", "train", "--subresource", "resize",
            "-p", json.dumps(patch),
        )  # fmt: skip
        return result

    denied = sent({"requests": {"cpu": "12"}, "limits": {"cpu": "12"}})
    assert denied.returncode != 0
    assert "resources.grown" in rule_ids(denied.stderr), denied.stderr
    stored = get(cluster, namespace, "pod", "train")["spec"]["containers"][0]["resources"]
    assert stored["requests"]["cpu"] == "8"
    within = sent({"limits": {"cpu": "12"}})
    assert within.returncode == 0, within.stderr


def test_a_run_cannot_relabel_itself_out_of_sight(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    assert apply(cluster, namespace, run_pod("train")).returncode == 0
    for change in ("dhcore/run-", "dhcore/run=another-run", "app.kubernetes.io/managed-by-"):
        done = cluster.kubectl("label", "--overwrite", "-n", namespace, "pod", "train", change)
        assert done.returncode != 0, change
        assert "scope.labels" in rule_ids(done.stderr), done.stderr
    labels = get(cluster, namespace, "pod", "train")["metadata"]["labels"]
    assert labels["dhcore/run"] == run_pod("x")["metadata"]["labels"]["dhcore/run"]
    edited = cluster.kubectl("label", "-n", namespace, "pod", "train", "team=vision")
    assert edited.returncode == 0, edited.stderr


def test_a_pod_list_is_judged_item_by_item_online_and_offline(
    cluster: Cluster, runguard: Webhook, namespace: str, tmp_path: Path
) -> None:
    fixable = run_pod("fixable", securityContext={"runAsUser": 0})
    denied = run_pod("denied", hostPID=True)
    listing = {"apiVersion": "v1", "kind": "PodList", "items": [fixable, denied]}
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(listing))
    assert done.returncode != 0
    assert "security.host-namespace" in rule_ids(done.stderr), done.stderr
    created = get(cluster, namespace, "pod", "fixable")
    assert created["spec"]["securityContext"].get("runAsUser") != 0
    source = tmp_path / "list.json"
    source.write_text(json.dumps(listing))
    offline = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "apply",
            "-p",
            str(runguard.policy_file.parent),
            "-o",
            "json",
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    verdicts = [(e["name"], e["allowed"]) for e in json.loads(offline.stdout)]
    assert verdicts == [("fixable", True), ("denied", False)]
