"""Runs already in the cluster before runguard was registered: ``runguard audit``
reports them, and updating them (labels) is not blocked by what they already were."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .cluster import Cluster
from .devcluster import runguard_command
from .runs import (
    Webhook,
    apply,
    kubectl_warnings,
    messy_run_pod,
    pod,
    rule_ids,
    run_pod,
    wait_for_admission,
)

pytestmark = pytest.mark.e2e

# What a run created behind runguard's back still has (nothing mutated it).
# What the run created behind runguard's back breaks, as the checks see it (the Pod
# Security Standards' restricted level names each missing hardening field)...
LEGACY_RULES = {
    "security.root",
    "security.host-namespace",
    "volumes.forbidden-type",
    "security.privileged",
    "security.seccomp",
    "security.capabilities",
}
# ...and, judged as a creation (runguard audit), what mutation would still have done.
AUDIT_RULES = LEGACY_RULES | {"profile.applied", "scheduling.preemption-mode"}


@pytest.fixture(scope="module")
def legacy(cluster: Cluster, webhook: Webhook) -> Iterator[str]:
    """A namespace with a non-compliant run, a mutated run and a plain Pod, the first
    created while runguard was not registered."""
    namespace = f"t-legacy-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", namespace, check=True)
    webhook.unregister(cluster)
    try:
        wait_for_admission(cluster, active=False)
        legacy = run_pod(
            "legacy",
            "1xa100",
            hostNetwork=True,
            securityContext={"runAsUser": 0},
            volumes=[{"name": "host", "hostPath": {"path": "/var/run"}}],
        )
        done = apply(cluster, namespace, legacy)
        assert done.returncode == 0, done.stderr
        assert kubectl_warnings(done.stderr) == []
    finally:
        webhook.register(cluster)
        wait_for_admission(cluster, active=True)
    assert apply(cluster, namespace, messy_run_pod("mutated")).returncode == 0
    assert apply(cluster, namespace, pod("plain")).returncode == 0
    yield namespace


def runguard_audit(cluster: Cluster, webhook: Webhook, namespace: str, output: str) -> Any:
    done = subprocess.run(
        [runguard_command(), "audit", "-p", str(webhook.policy_dir),
         "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "-o", output],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # 1: violations found
    return done.stdout


def test_runguard_audit_lists_the_run_created_behind_its_back(
    cluster: Cluster, runguard: Webhook, legacy: str
) -> None:
    rows = json.loads(runguard_audit(cluster, runguard, legacy, "json"))
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == {"legacy", "mutated"}  # the plain Pod is not a run
    assert by_name["mutated"]["result"] == "pass"
    row = by_name["legacy"]
    assert (row["namespace"], row["kind"], row["result"]) == (legacy, "Pod", "fail")
    assert {v["rule"] for v in row["violations"]} == AUDIT_RULES

    table = runguard_audit(cluster, runguard, legacy, "table").splitlines()
    assert table[0].split()[:4] == ["NAMESPACE", "KIND", "NAME", "RESULT"]
    assert [line.split()[2:4] for line in table[1:]] == [["legacy", "fail"], ["mutated", "pass"]]


@pytest.mark.parametrize(
    "output, api_version, kind",
    [
        ("policyreport", "wgpolicyk8s.io/v1alpha2", "PolicyReport"),
        ("openreports", "openreports.io/v1alpha1", "Report"),
    ],
)
def test_runguard_audit_policy_report(
    cluster: Cluster, runguard: Webhook, legacy: str, output: str, api_version: str, kind: str
) -> None:
    cluster_report, *reports = yaml.safe_load_all(runguard_audit(cluster, runguard, legacy, output))
    assert (cluster_report["kind"], cluster_report["metadata"]["name"]) == (
        f"Cluster{kind}",
        "runguard-policy",
    )  # the policy objects: cluster-scoped
    assert [(r["apiVersion"], r["kind"], r["metadata"]["namespace"]) for r in reports] == [
        (api_version, kind, legacy)
    ]
    report = reports[0]
    assert report["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": legacy}
    for result in report["results"]:
        assert {"timestamp", "severity", "category", "source"} <= set(result)
    failed = [r for r in report["results"] if r["result"] == "fail"]
    assert (report["summary"]["fail"], report["summary"]["pass"]) == (len(failed), 1)
    assert {r["rule"] for r in failed} == AUDIT_RULES
    assert {r["resources"][0]["name"] for r in failed} == {"legacy"}
    live = json.loads(cluster.kubectl("get", "pod", "legacy", "-n", legacy, "-o", "json").stdout)
    assert failed[0]["resources"][0]["uid"] == live["metadata"]["uid"]


def test_labelling_a_run_admitted_before_runguard_is_allowed(
    cluster: Cluster, runguard: Webhook, legacy: str
) -> None:
    """UPDATE: violations the old object already had warn instead of denying."""
    done = cluster.kubectl("label", "pod", "legacy", "-n", legacy, "team=vision")
    assert done.returncode == 0, done.stderr
    warnings = kubectl_warnings(done.stderr)
    assert all(w.startswith("runguard: allowed on update, already present: [") for w in warnings)
    assert rule_ids(" ".join(warnings)) == LEGACY_RULES
    labels = json.loads(cluster.kubectl("get", "pod", "legacy", "-n", legacy, "-o", "json").stdout)
    assert labels["metadata"]["labels"]["team"] == "vision"
