"""``runguard audit`` against the real apiserver at (small) scale: a few hundred runs read
in small pages, each judged exactly once, Pods selected server-side; ``--write`` stores
the PolicyReports in the cluster (CRD from ``manifests/policyreport-crd``) as the audit
CronJob's ServiceAccount, bound to the roles of ``manifests/`` and nothing else.

The runs carry a label of their own, which no selector of the session's runguard
matches: creating them never reaches a webhook, whatever else the session registered.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.audit.clusteraudit import judged_pages
from webhook.cli.cluster import kube_fetch
from webhook.engine import mutate
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

from .cluster import Cluster
from .devcluster import runguard_command
from .runs import REPO

pytestmark = pytest.mark.e2e

LABEL = "runguard-e2e/audit-scale"
RUNS, VIOLATORS, OTHERS, JOBS = 320, 32, 40, 6  # every 10th run violates; OTHERS: no LABEL
POLICY = {
    "apiVersion": "runguard.io/v1",
    "kind": "RunPolicy",
    "metadata": {"name": "scale"},
    "spec": {"selector": {"matchLabels": {LABEL: "run"}}},
}
CRD = REPO / "manifests" / "policyreport-crd" / "wgpolicyk8s.io_policyreports.yaml"
CLUSTER_CRD = CRD.with_name("wgpolicyk8s.io_clusterpolicyreports.yaml")
AUDIT_ACCOUNT = ("rg-audit-e2e", "runguard-audit")  # namespace, name (as the CronJob's)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("audit-policy")
    (directory / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    return directory


@pytest.fixture(scope="module")
def policy(policy_dir: Path) -> Policy:
    return load_policy(policy_dir)


def run(name: str, policy: Policy, *, label: str = LABEL, **spec: Any) -> dict[str, Any]:
    """A run (``label: run``) as runguard would have admitted it, then given ``spec``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {label: "run"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }
    admitted: dict[str, Any] = mutate(pod, policy).object
    admitted["spec"].update(spec)
    return admitted


def job(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1.36"}],
                    **spec,
                },
            }
        },
    }


@pytest.fixture(scope="module")
def runs(cluster: Cluster, policy: Policy) -> Iterator[str]:
    """A namespace with RUNS runs (VIOLATORS of them on the host network), OTHERS Pods
    outside the selector, and JOBS Jobs: half of them runs, one of those a violator."""
    namespace = f"t-audit-scale-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", namespace, check=True)
    pods = [
        run(f"run-{i:04}", policy, **({"hostNetwork": True} if i % 10 == 0 else {}))
        for i in range(RUNS)
    ]
    other = run("x", policy)
    pods += [{**other, "metadata": {"name": f"other-{i:03}"}} for i in range(OTHERS)]
    jobs = [
        job(
            f"job-{i}",
            {LABEL: "run"} if i % 2 else {"app": "other"},
            **({"hostPID": True} if i == 1 else {}),
        )
        for i in range(JOBS)
    ]
    listed = {"apiVersion": "v1", "kind": "List", "items": pods + jobs}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(listed), check=True)
    yield namespace


def test_small_pages_see_every_run_exactly_once(api_client: Any, policy: Policy, runs: str) -> None:
    page_size = 25
    for namespace in (runs, None):  # one namespace, then the whole cluster
        pages = list(
            judged_pages(kube_fetch(api_client), policy, namespace=namespace, page_size=page_size)
        )
        pod_pages = [p for p in pages if p.listing.kind == "Pod"]
        # Selected server-side: the Pods outside the selector never came over the wire.
        assert [p.listed for p in pod_pages] == [page_size] * (RUNS // page_size) + (
            [RUNS % page_size] if RUNS % page_size else []
        )
        assert len(pod_pages) == math.ceil(RUNS / page_size)
        pods = [f for p in pod_pages for f in p.findings]
        assert sorted(f.name for f in pods) == [f"run-{i:04}" for i in range(RUNS)]
        failed = sorted(f.name for f in pods if f.result == "fail")
        assert failed == [f"run-{i:04}" for i in range(0, RUNS, 10)] and len(failed) == VIOLATORS
        assert {v.rule for f in pods for v in f.violations} == {"security.host-namespace"}
        assert {f.namespace for f in pods} == {runs}
        # Controllers are listed whole (their run labels are in the template) and judged
        # here: every Job of the namespace listed, the runs among them found.
        jobs = [p for p in pages if p.listing.kind == "Job"]
        ours = [f for p in jobs for f in p.findings if f.namespace == runs]
        assert sorted((f.name, f.result) for f in ours) == [
            ("job-1", "fail"),
            ("job-3", "pass"),
            ("job-5", "pass"),
        ]
        if namespace is not None:
            assert sum(p.listed for p in jobs) == JOBS


@pytest.fixture(scope="module")
def audit_account(cluster: Cluster) -> Path:
    """The CRDs installed, and the audit CronJob's ServiceAccount bound as
    ``manifests/audit-cronjob`` binds it: its kubeconfig."""
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(CLUSTER_CRD), check=True)
    for crd in ("policyreports", "clusterpolicyreports"):
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd}.wgpolicyk8s.io", check=True
        )
    namespace, name = AUDIT_ACCOUNT
    objects = list(yaml.safe_load_all((REPO / "manifests" / "rbac.yaml").read_text()))
    objects += yaml.safe_load_all((REPO / "manifests/audit-cronjob/rbac.yaml").read_text())
    for obj in objects:
        if obj["kind"] == "ServiceAccount":
            obj["metadata"]["namespace"] = namespace
        for subject in obj.get("subjects", []):
            subject["namespace"] = namespace  # what kustomize sets from the base
    cluster.kubectl("create", "namespace", namespace)
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
    return cluster.service_account(namespace, name, cluster_role=None).kubeconfig


def audit_cli(kubeconfig: Path, policy_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [runguard_command(), "audit", "-p", str(policy_dir), "--kubeconfig", str(kubeconfig),
         *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def stored_reports(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    done = cluster.kubectl("get", "policyreports.wgpolicyk8s.io", "-n", namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    return {r["metadata"]["name"]: r for r in json.loads(done.stdout)["items"]}


def test_write_stores_policy_reports_with_the_cronjobs_rights_only(
    cluster: Cluster, audit_account: Path, policy_dir: Path, runs: str
) -> None:
    results = (RUNS - VIOLATORS) + VIOLATORS + 3  # a result per pass and per violation
    done = audit_cli(audit_account, policy_dir, "--write", "-o", "summary", "--page-size", "50",
                     "--results-per-report", "100")  # fmt: skip
    assert done.returncode == 0, done.stderr  # 0: stored, violations and all
    counts = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
    assert counts[runs] == [str(RUNS - VIOLATORS + 2), str(VIOLATORS + 1), "0"]
    reports = stored_reports(cluster, runs)
    parts = math.ceil(results / 100)
    assert sorted(reports) == sorted(
        ["runguard-scale"] + [f"runguard-scale-{i}" for i in range(2, parts + 1)]
    )
    stored = [r for report in reports.values() for r in report["results"]]
    assert len(stored) == results
    assert sum(report["summary"]["fail"] for report in reports.values()) == VIOLATORS + 1
    failed = {r["resources"][0]["name"] for r in stored if r["result"] == "fail"}
    assert failed == {f"run-{i:04}" for i in range(0, RUNS, 10)} | {"job-1"}
    names = [r["resources"][0]["name"] for r in stored]
    assert len(names) == len(set(names)) == RUNS + 3  # each run once: none has two rules
    # What Policy Reporter sorts by was stored as written (the CRD's schema kept it).
    for result in stored:
        assert {"timestamp", "severity", "category", "source", "scored"} <= set(result)
        assert set(result["timestamp"]) == {"seconds", "nanos"}
    assert all(r["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": runs}
               for r in reports.values())  # fmt: skip
    done = cluster.kubectl("get", "clusterpolicyreport", "runguard-policy", "-o", "json")
    assert done.returncode == 0, done.stderr
    policy_report = json.loads(done.stdout)
    assert policy_report["summary"]["pass"] == len(policy_report["results"]) > 0
    assert {r["resources"][0]["kind"] for r in policy_report["results"]} <= {
        "RunPolicy",
        "Profile",
    }
    # Written again, in one part: the parts no longer needed are emptied, not left stale.
    done = audit_cli(audit_account, policy_dir, "--write", "-n", runs, "-o", "summary")
    assert done.returncode == 0, done.stderr
    assert f"{parts - 1} parts no longer needed emptied" in done.stderr
    reports = stored_reports(cluster, runs)
    assert len(reports["runguard-scale"]["results"]) == results
    assert all(not reports[name].get("results") for name in reports if name != "runguard-scale")


def test_the_audit_account_can_do_nothing_else(cluster: Cluster, audit_account: Path) -> None:
    allowed = {
        ("list", "pods"): "yes",
        ("list", "cronjobs.batch"): "yes",
        ("patch", "policyreports.wgpolicyk8s.io"): "yes",
        ("patch", "clusterpolicyreports.wgpolicyk8s.io"): "yes",
        ("delete", "clusterpolicyreports.wgpolicyk8s.io"): "no",
        ("watch", "pods"): "no",
        ("get", "pods"): "no",
        ("list", "secrets"): "no",
        ("delete", "policyreports.wgpolicyk8s.io"): "no",
        ("list", "policyreports.wgpolicyk8s.io"): "no",
        ("update", "policyreports.wgpolicyk8s.io"): "no",
        ("create", "pods"): "no",
    }
    assert_audit_account_may(cluster, allowed)


def assert_audit_account_may(cluster: Cluster, allowed: Mapping[tuple[str, str], str]) -> None:
    """``kubectl auth can-i`` as the audit account answers ``allowed``'s (verb, resource)."""
    who = "system:serviceaccount:{}:{}".format(*AUDIT_ACCOUNT)
    for (verb, resource), expected in allowed.items():
        done = cluster.kubectl("auth", "can-i", verb, resource, "-A", f"--as={who}")
        assert done.stdout.strip() == expected, (verb, resource, done.stderr)


def aged(token: str) -> str:
    """``token`` as it reads once the snapshot it points to is compacted away: the same
    place in the list at resourceVersion 2 (a continue token is base64url JSON)."""
    state = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    state["rv"] = 2
    return base64.urlsafe_b64encode(json.dumps(state).encode()).decode().rstrip("=")


def compact_etcd(cluster: Cluster) -> None:
    """Compact etcd's history up to now (what the apiserver does every 5 minutes), through
    etcd's JSON gateway at the address the apiserver was started with."""
    argv = Path(f"/proc/{cluster.pids['kube-apiserver']}/cmdline").read_bytes().split(b"\0")
    (etcd,) = [a.decode().split("=", 1)[1] for a in argv if a.startswith(b"--etcd-servers=")]

    def post(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(f"{etcd}/v3/kv/{path}", json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    revision = post("range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"]
    post("compaction", {"revision": revision, "physical": True})


def test_an_expired_continue_token_restarts_the_listing(
    cluster: Cluster, api_client: Any, policy: Policy, runs: str
) -> None:
    """A 410 from the real apiserver, for a continue token whose snapshot etcd no longer
    has: the listing starts again, and each run is still judged once."""
    compact_etcd(cluster)
    real = kube_fetch(api_client)
    aged_once: list[str] = []

    def fetch(listing: Any, namespace: str | None, query: Mapping[str, str]) -> bytes:
        if "continue" in query and not aged_once and listing.kind == "Pod":
            aged_once.append(query["continue"])
            query = {**query, "continue": aged(query["continue"])}
        return real(listing, namespace, query)

    notices: list[str] = []
    pages = list(judged_pages(fetch, policy, namespace=runs, page_size=40, notice=notices.append))
    assert aged_once and len(notices) == 1 and "pods expired after 1 page (410 Gone" in notices[0]
    names = [f.name for p in pages if p.listing.kind == "Pod" for f in p.findings]
    assert names == [f"run-{i:04}" for i in range(RUNS)]


def test_the_components_pass_server_dry_run_as_restricted_pods(
    cluster: Cluster, audit_account: Path, tmp_path: Path
) -> None:
    """The base with both optional components: every object accepted by the apiserver,
    the CronJob's Pods within the restricted Pod Security Standard of runguard's
    namespace."""
    base = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", base, ignore=shutil.ignore_patterns("certs"))
    subprocess.run(
        [runguard_command(), "certs", "--out", str(base / "certs")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    with (base / "kustomization.yaml").open("a") as kustomization:
        kustomization.write("components:\n  - audit-cronjob\n  - policyreport-crd\n")
    # A dry run creates no namespace: create it, warning on what restricted forbids.
    cluster.kubectl("create", "namespace", "runguard")
    cluster.kubectl("label", "namespace", "runguard", "--overwrite",
                    "pod-security.kubernetes.io/warn=restricted", check=True)  # fmt: skip
    done = cluster.kubectl("apply", "-k", str(base), "--dry-run=server", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert "PodSecurity" not in done.stderr, done.stderr
    names = {(item["kind"], item["metadata"]["name"]) for item in json.loads(done.stdout)["items"]}
    assert {
        ("CronJob", "runguard-audit"),
        ("ServiceAccount", "runguard-audit"),
        ("ClusterRole", "runguard-audit-reports"),
        ("ClusterRoleBinding", "runguard-audit"),
        ("ClusterRoleBinding", "runguard-audit-reports"),
        ("CustomResourceDefinition", "policyreports.wgpolicyk8s.io"),
    } <= names
