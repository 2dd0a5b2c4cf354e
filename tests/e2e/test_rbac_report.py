"""``runguard audit --rbac`` against the real kube-apiserver: its bootstrap ClusterRoles
(``edit``, aggregated from ``system:aggregate-to-edit`` and ``view``), RoleBindings made
with kubectl, and the shipped ``runguard-run-user`` ClusterRole, which the apiserver's
own authorizer confirms grants none of the doors; ``--write`` storing PolicyReports and,
where the published openreports.io CRDs are installed, OpenReports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from .cluster import Cluster
from .devcluster import runguard_command
from .runs import poll
from .test_openreports import CRDS as OPEN_REPORT_CRDS
from .test_openreports import discovered, fetched_crds

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ROLE_FILE = REPO / "manifests" / "run-user-role.yaml"
# What `edit` holds in a run namespace that no admission request is made for.
EDIT_DOORS = {
    "rbac.read-secrets",
    "rbac.read-config-maps",
    "rbac.platform-data",
    "rbac.connect",
    "rbac.token",
    "rbac.impersonate",
    "rbac.expose",
}
# One (verb, resource, subresource) per door, for `kubectl auth can-i`.
DOOR_CHECKS = [
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("get", "configmaps", ""),
    ("list", "configmaps", ""),
    ("watch", "configmaps", ""),
    ("update", "configmaps", ""),
    ("patch", "secrets", ""),
    ("create", "pods", "exec"),
    ("create", "pods", "attach"),
    ("create", "pods", "portforward"),
    ("get", "pods", "proxy"),
    ("get", "services", "proxy"),
    ("create", "serviceaccounts", "token"),
    ("impersonate", "serviceaccounts", ""),
    ("create", "services", ""),
    ("update", "services", ""),
    ("create", "ingresses.networking.k8s.io", ""),
    ("create", "networkpolicies.networking.k8s.io", ""),
]


def audit_rbac(cluster: Cluster, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [runguard_command(), "audit", "--rbac", "-p", str(REPO / "policies"),
         "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def can_i(cluster: Cluster, namespace: str, user: str, verb: str, resource: str, sub: str) -> bool:
    extra = [f"--subresource={sub}"] if sub else []
    done = cluster.kubectl("auth", "can-i", verb, resource, *extra, "-n", namespace, "--as", user)
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


def test_edit_shows_up_with_its_doors_and_the_shipped_role_does_not(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("apply", "-f", str(ROLE_FILE), check=True)
    editor, user = f"editor@{namespace}", f"user@{namespace}"
    cluster.kubectl("create", "rolebinding", "editors", "-n", namespace,
                    "--clusterrole=edit", f"--user={editor}", check=True)  # fmt: skip
    cluster.kubectl("create", "rolebinding", "users", "-n", namespace,
                    "--clusterrole=runguard-run-user", f"--user={user}", check=True)  # fmt: skip

    done = audit_rbac(cluster, namespace, "--shells", "off", "-o", "json")
    assert done.returncode == 1, done.stderr  # 1: findings
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    mine = [r for r in rows if r["namespace"] == namespace]
    assert {r["subject"]["name"] for r in mine} == {editor}
    assert {r["door"] for r in mine} == EDIT_DOORS
    by_door = {r["door"]: r for r in mine}
    assert by_door["rbac.read-secrets"]["grants"] == ["get,list,watch secrets"]
    assert by_door["rbac.read-secrets"]["via"] == ["RoleBinding/editors -> ClusterRole/edit"]
    assert by_door["rbac.read-config-maps"]["grants"] == ["get,list,watch configmaps"]
    connect = by_door["rbac.connect"]
    assert "shells webhook is off" in connect["note"]
    assert {"pods/exec", "pods/attach", "pods/portforward", "pods/proxy", "services/proxy"} <= {
        resource for grant in connect["grants"] for resource in grant.split()[1].split(",")
    }
    assert not [r for r in rows if r["subject"]["name"] == user]

    # The apiserver's authorizer agrees: the shipped role grants none of the doors' verbs
    # and what the runs need.
    for verb, resource, sub in DOOR_CHECKS:
        assert not can_i(cluster, namespace, user, verb, resource, sub), (verb, resource, sub)
    for verb, resource in [("create", "pods"), ("create", "jobs.batch"),
                           ("patch", "deployments.apps"), ("create", "cronjobs.batch"),
                           ("create", "configmaps"), ("get", "pods/log")]:  # fmt: skip
        base, _, sub = resource.partition("/")
        assert can_i(cluster, namespace, user, verb, base, sub), (verb, resource)

    # The table and the namespace's PolicyReport say the same.
    table = audit_rbac(cluster, namespace, "--shells", "off")
    assert table.returncode == 1
    lines = [line for line in table.stdout.splitlines() if line.startswith(namespace)]
    assert {line.split()[3] for line in lines} == EDIT_DOORS  # User NAME DOOR
    reports = list(yaml.safe_load_all(audit_rbac(cluster, namespace, "-o", "policyreport",
                                                 "--shells", "on").stdout))  # fmt: skip
    (report,) = [r for r in reports if r["kind"] == "PolicyReport"]
    assert report["metadata"]["namespace"] == namespace
    assert {r["rule"] for r in report["results"]} == EDIT_DOORS - {"rbac.connect"}
    assert {r["properties"]["subject"] for r in report["results"]} == {f"User {editor}"}


def install_policy_report_crds(cluster: Cluster) -> None:
    """The CRDs of manifests/policyreport-crd, established."""
    crds = REPO / "manifests" / "policyreport-crd" / "wgpolicyk8s.io_"
    cluster.kubectl("apply", "-f", f"{crds}policyreports.yaml",
                    "-f", f"{crds}clusterpolicyreports.yaml", check=True)  # fmt: skip
    for crd in ("policyreports", "clusterpolicyreports"):
        cluster.kubectl("wait", "--for=condition=Established",
                        f"crd/{crd}.wgpolicyk8s.io", check=True)  # fmt: skip


def stored(cluster: Cluster, resource: str, *where: str) -> Any:
    done = cluster.kubectl("get", resource, *where, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_write_stores_the_namespace_report_and_replaces_it(
    cluster: Cluster, namespace: str
) -> None:
    """``--write``: the PolicyReport runguard-rbac of each run namespace server-side
    applied (the CRDs of manifests/policyreport-crd), then replaced whole once the
    binding is gone."""
    install_policy_report_crds(cluster)
    cluster.kubectl("create", "rolebinding", "readers", "-n", namespace, "--clusterrole=edit",
                    f"--user=reader@{namespace}", check=True)  # fmt: skip

    def stored() -> dict[str, Any]:
        done = cluster.kubectl("get", "policyreport", "runguard-rbac", "-n", namespace,
                               "-o", "json", check=True)  # fmt: skip
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    done = audit_rbac(cluster, namespace, "--write", "--shells", "on")
    assert done.returncode == 0, done.stderr  # 0: every report stored
    report = stored()
    assert report["metadata"]["labels"]["runguard.io/report"] == "rbac"
    assert {r["rule"] for r in report["results"]} == EDIT_DOORS - {"rbac.connect"}
    assert report["summary"]["fail"] == len(EDIT_DOORS) - 1
    cluster.kubectl("delete", "rolebinding", "readers", "-n", namespace, check=True)
    assert audit_rbac(cluster, namespace, "--write", "--shells", "on").returncode == 0
    assert stored().get("results") in (None, []) and stored()["summary"]["fail"] == 0


def test_write_stores_open_reports_where_their_crds_are_served(
    cluster: Cluster, namespace: str
) -> None:
    """``--write``'s formats, as ``runguard audit --write``'s: without the openreports.io
    CRDs, the PolicyReports written and the OpenReports said missing (an error when
    ``--reports`` names them); with the published CRDs (reports-api's ``config/crd``)
    installed, the namespace's Report ``runguard-rbac`` stored as written, the same
    results as its PolicyReport, held to its schema by the apiserver, then replaced
    whole once the binding is gone."""
    install_policy_report_crds(cluster)
    cluster.kubectl("create", "rolebinding", "readers", "-n", namespace, "--clusterrole=edit",
                    f"--user=reader@{namespace}", check=True)  # fmt: skip
    cluster.kubectl("delete", "crd", *OPEN_REPORT_CRDS, "--ignore-not-found", "--wait",
                    check=True)  # fmt: skip
    poll("the openreports.io kinds out of discovery", lambda: not discovered(cluster))
    done = audit_rbac(cluster, namespace, "--write", "--reports", "openreports", "--shells", "on")
    assert done.returncode == 2, done.stderr
    assert "serves no openreports.io/v1alpha1 Report or ClusterReport" in done.stderr
    assert "github.com/openreports/reports-api" in done.stderr
    assert "Traceback" not in done.stderr
    done = audit_rbac(cluster, namespace, "--write", "--shells", "on")
    assert done.returncode == 0, done.stderr  # by default: what is served, the rest said
    assert "openreports not written" in done.stderr
    assert "RBAC PolicyReports written (one ClusterPolicyReport)" in done.stderr

    crds = fetched_crds()
    files = [arg for path in sorted(crds.iterdir()) for arg in ("-f", str(path))]
    cluster.kubectl("apply", "--server-side", *files, check=True)
    try:
        for name in OPEN_REPORT_CRDS:
            cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", check=True)
        poll("the openreports.io kinds in discovery", lambda: discovered(cluster))
        done = audit_rbac(cluster, namespace, "--write", "--shells", "on")
        assert done.returncode == 0, done.stderr
        assert "RBAC PolicyReports written (one ClusterPolicyReport)" in done.stderr
        assert "RBAC Reports written (one ClusterReport)" in done.stderr
        report = stored(cluster, "reports.openreports.io", "runguard-rbac", "-n", namespace)
        assert report["source"] == "runguard"
        assert report["metadata"]["labels"]["runguard.io/report"] == "rbac"
        assert report["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": namespace}
        assert {r["rule"] for r in report["results"]} == EDIT_DOORS - {"rbac.connect"}
        assert report["summary"]["fail"] == len(EDIT_DOORS) - 1
        policy_report = stored(cluster, "policyreport", "runguard-rbac", "-n", namespace)
        assert report["results"] == policy_report["results"]  # one run, both formats
        schemas = {}
        for name in OPEN_REPORT_CRDS:
            crd = stored(cluster, "crd", name)
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
            schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
        jsonschema.validate(report, schemas["Report"])
        cluster_report = stored(cluster, "clusterreports.openreports.io", "runguard-rbac")
        assert cluster_report["metadata"]["labels"]["runguard.io/report"] == "rbac"
        jsonschema.validate(cluster_report, schemas["ClusterReport"])

        cluster.kubectl("delete", "rolebinding", "readers", "-n", namespace, check=True)
        done = audit_rbac(cluster, namespace, "--write", "--reports", "openreports",
                          "--shells", "on")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "PolicyReports written" not in done.stderr
        report = stored(cluster, "reports.openreports.io", "runguard-rbac", "-n", namespace)
        assert report.get("results") in (None, []) and report["summary"]["fail"] == 0
    finally:
        cluster.kubectl("delete", "crd", *OPEN_REPORT_CRDS, "--ignore-not-found")
