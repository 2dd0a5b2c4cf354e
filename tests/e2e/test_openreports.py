"""``runguard audit --write`` and OpenReports against the real apiserver: with the
openreports.io CRDs absent, a clear message (and the PolicyReports still written by
default); installed from their published definitions (reports-api's ``config/crd``,
fetched by ``tests/e2e/fetch-openreports.sh``), Reports and a ClusterReport stored as
written, their schemas enforced by the apiserver; a run that goes away or becomes
compliant leaves no result on the next run. Written as the audit CronJob's
ServiceAccount, bound to the roles of ``manifests/`` and nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from webhook.policy.model import Policy

from .cluster import Cluster
from .runs import REPO, poll
from .test_audit_scale import assert_audit_account_may, audit_account, audit_cli, policy, run

__all__ = ["audit_account", "policy"]  # test_audit_scale.py's fixtures (policy: of POLICY)

pytestmark = pytest.mark.e2e

# A label of its own (no selector of the session's runguard, nor test_audit_scale.py's
# listing of the whole cluster, matches it).
LABEL = "runguard-e2e/openreports"
POLICY = {
    "apiVersion": "runguard.io/v1",
    "kind": "RunPolicy",
    "metadata": {"name": "reports"},
    "spec": {"selector": {"matchLabels": {LABEL: "run"}}},
}
CRDS = ("reports.openreports.io", "clusterreports.openreports.io")
GROUP_VERSION = "/apis/openreports.io/v1alpha1"  # discovery, which --write reads


def discovered(cluster: Cluster) -> bool:
    """Whether discovery lists both kinds (it follows a CRD's changes a moment later)."""
    done = cluster.kubectl("get", "--raw", GROUP_VERSION)
    if done.returncode != 0:
        return False
    served = {r["name"] for r in json.loads(done.stdout)["resources"]}
    return {"reports", "clusterreports"} <= served


def fetched_crds() -> Path:
    done = subprocess.run(
        ["bash", str(REPO / "tests/e2e/fetch-openreports.sh")],
        stdout=subprocess.PIPE, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, "tests/e2e/fetch-openreports.sh failed"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("openreports-policy")
    (directory / "policy.yaml").write_text(json.dumps(POLICY))
    return directory


@pytest.fixture(scope="module")
def runs(cluster: Cluster, policy: Policy) -> Iterator[str]:
    """A namespace with three runs: a compliant Pod, a Pod on the host network, and a
    Deployment (no replicas) whose template is on the host network."""
    namespace = f"t-openreports-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", namespace, check=True)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {LABEL: "run"}},
            "template": {
                "metadata": {"labels": {LABEL: "run"}},
                "spec": {
                    "hostNetwork": True,
                    "containers": [{"name": "main", "image": "busybox:1.36"}],
                },
            },
        },
    }
    items = [
        run("ok", policy, label=LABEL),
        run("host", policy, label=LABEL, hostNetwork=True),
        deployment,
    ]
    listed = {"apiVersion": "v1", "kind": "List", "items": items}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(listed), check=True)
    yield namespace
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def stored(cluster: Cluster, resource: str, *where: str) -> Any:
    done = cluster.kubectl("get", resource, *where, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_without_the_crds_the_message_says_what_to_install(
    cluster: Cluster, audit_account: Path, policy_dir: Path, runs: str
) -> None:
    cluster.kubectl("delete", "crd", *CRDS, "--ignore-not-found", "--wait", check=True)
    poll("the openreports.io kinds out of discovery", lambda: not discovered(cluster))
    done = audit_cli(audit_account, policy_dir, "--write", "--reports", "openreports",
                     "-n", runs, "-o", "summary")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "serves no openreports.io/v1alpha1 Report or ClusterReport" in done.stderr
    assert "github.com/openreports/reports-api" in done.stderr
    assert "Traceback" not in done.stderr
    # By default, what the cluster serves is written and the rest said.
    done = audit_cli(audit_account, policy_dir, "--write", "-n", runs, "-o", "summary")
    assert done.returncode == 0, done.stderr
    assert "openreports not written" in done.stderr
    assert "1 PolicyReports written in 1 namespaces" in done.stderr
    assert stored(cluster, "policyreports.wgpolicyk8s.io", "-n", runs)["items"]


@pytest.fixture(scope="module")
def openreports(cluster: Cluster) -> Iterator[dict[str, dict[str, Any]]]:
    """The published CRDs installed (and removed after): each one's v1alpha1 schema."""
    crds = fetched_crds()
    for path in sorted(crds.iterdir()):  # the unit tests' copies are these files
        assert path.read_bytes() == (REPO / "tests/openreports" / path.name).read_bytes()
    files = [arg for path in sorted(crds.iterdir()) for arg in ("-f", str(path))]
    cluster.kubectl("apply", "--server-side", *files, check=True)
    for name in CRDS:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", check=True)
    poll("the openreports.io kinds in discovery", lambda: discovered(cluster))
    schemas = {}
    for name in CRDS:
        crd = stored(cluster, "crd", name)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    yield schemas
    cluster.kubectl("delete", "crd", *CRDS, "--ignore-not-found")


def results_by_run(report: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    found: dict[str, set[tuple[str, str]]] = {}
    for r in report.get("results") or ():
        found.setdefault(r["resources"][0]["name"], set()).add((r["result"], r["rule"]))
    return found


def test_write_stores_reports_and_a_fix_removes_the_result(
    cluster: Cluster,
    audit_account: Path,
    policy_dir: Path,
    runs: str,
    openreports: dict[str, dict[str, Any]],
) -> None:
    done = audit_cli(audit_account, policy_dir, "--write", "-n", runs, "-o", "summary")
    assert done.returncode == 0, done.stderr
    assert "1 Reports written in 1 namespaces" in done.stderr
    assert "ClusterReport runguard-policy written" in done.stderr
    (report,) = stored(cluster, "reports.openreports.io", "-n", runs)["items"]
    assert report["metadata"]["name"] == "runguard-reports" and report["source"] == "runguard"
    assert report["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": runs}
    assert results_by_run(report) == {
        "ok": {("pass", "run")},
        "host": {("fail", "security.host-namespace")},
        "web": {("fail", "security.host-namespace")},
    }
    assert report["summary"] == {"pass": 1, "fail": 2, "warn": 0, "error": 0, "skip": 0}
    # Stored as written: what Policy Reporter reads survived the schema (nothing pruned).
    for result in report["results"]:
        assert {"policy", "rule", "result", "severity", "category", "source", "timestamp",
                "scored", "resources", "message", "properties"} <= set(result)  # fmt: skip
        assert result["properties"]["runPolicy"] == "reports"
    jsonschema.validate(report, openreports["Report"])
    cluster_report = stored(cluster, "clusterreports.openreports.io", "runguard-policy")
    assert cluster_report["summary"]["pass"] == len(cluster_report["results"]) > 0
    jsonschema.validate(cluster_report, openreports["ClusterReport"])
    # The apiserver holds them to the schema: a severity outside its enum is refused.
    bad = {
        "apiVersion": report["apiVersion"],
        "kind": report["kind"],
        "metadata": {"name": "runguard-bad", "namespace": runs},
        "results": [{**report["results"][0], "severity": "urgent"}],
    }
    refused = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(bad))
    assert refused.returncode != 0 and "severity" in refused.stderr, refused.stderr

    # Fixed: one run goes away, the other becomes compliant; the next run says so.
    cluster.kubectl("delete", "pod", "host", "-n", runs, "--wait=false", check=True)
    patch = {"spec": {"template": {"spec": {"hostNetwork": False}}}}
    cluster.kubectl("patch", "deployment", "web", "-n", runs, "--type=merge", "-p",
                    json.dumps(patch), check=True)  # fmt: skip
    done = audit_cli(audit_account, policy_dir, "--write", "--reports", "openreports",
                     "-n", runs, "-o", "summary")  # fmt: skip
    assert done.returncode == 0, done.stderr
    (report,) = stored(cluster, "reports.openreports.io", "-n", runs)["items"]
    assert results_by_run(report) == {"ok": {("pass", "run")}, "web": {("pass", "run")}}
    assert report["summary"]["fail"] == 0


def test_the_audit_account_may_only_write_reports(
    cluster: Cluster, audit_account: Path, openreports: dict[str, Any]
) -> None:
    allowed = {
        ("patch", "reports.openreports.io"): "yes",
        ("get", "reports.openreports.io"): "yes",
        ("patch", "clusterreports.openreports.io"): "yes",
        ("list", "reports.openreports.io"): "no",
        ("delete", "reports.openreports.io"): "no",
        ("update", "reports.openreports.io"): "no",
        ("get", "clusterreports.openreports.io"): "no",
        ("delete", "clusterreports.openreports.io"): "no",
    }
    assert_audit_account_may(cluster, allowed)
