"""``runguard audit``'s findings as OpenReports (openreports.io/v1alpha1 Report and
ClusterReport): what Policy Reporter reads, valid under the published CRDs' schemas
(``tests/openreports/``: reports-api v0.2.1's ``config/crd``, verbatim; the e2e tests
install the same files from the Go module cache and check they are these), the same
results as the PolicyReports, and as many objects as namespaces x RunPolicies."""

from __future__ import annotations

import argparse
import math
from typing import Any

import jsonschema
import pytest
from harness import REPO
from harness.openreports import crd, schema

from webhook.audit.clusteraudit import Finding, audit
from webhook.audit.openreports import OPEN_REPORTS, cluster_report, to_open_reports
from webhook.audit.policyreport import to_policy_reports
from webhook.audit.reportbook import RESULTS, ReportBook
from webhook.cli import audit_write
from webhook.engine import Violation, mutate
from webhook.policy.errors import PolicyIssue
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, build_run_policy

SHIPPED = REPO / "policies"
RUN_POLICY = {
    "apiVersion": "runguard.io/v1",
    "kind": "RunPolicy",
    "metadata": {"name": "platform"},
    "spec": {"selector": {"matchLabels": {"app.kubernetes.io/managed-by": "dhcore"}}},
}
RUN_LABELS = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r"}


def run(name: str, namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "labels": RUN_LABELS},
        "spec": {"containers": [{"name": "main", "image": "x"}], **spec},
    }  # fmt: skip


def findings() -> list[Finding]:
    """A pass, a fail, a warn (enforcement Warn) and a drift."""
    policy = Policy.of(build_run_policy(RUN_POLICY, []))
    warn = Policy.of(
        build_run_policy({**RUN_POLICY, "spec": {**RUN_POLICY["spec"], "enforcement": "Warn"}}, [])
    )
    found = audit([mutate(run("ok"), policy).object, run("host", hostNetwork=True)], policy)
    found += audit([run("warned", hostNetwork=True)], warn)
    drift = Violation("profile.applied", "spec", "policy drift: recreate it", drift=True)
    found.append(
        Finding("Pod", "ml", "drifted", "v1", "uid-d", "platform", "1xt4", "warn", (drift,))
    )
    return found


def test_the_crds_are_the_kinds_runguard_writes() -> None:
    reports, clusterreports = crd("reports"), crd("clusterreports")
    assert reports["metadata"]["name"] == f"{OPEN_REPORTS.plural}.{OPEN_REPORTS.group}"
    assert (reports["spec"]["names"]["kind"], reports["spec"]["scope"]) == ("Report", "Namespaced")
    assert clusterreports["metadata"]["name"] == (
        f"{OPEN_REPORTS.cluster_plural}.{OPEN_REPORTS.group}"
    )
    assert (clusterreports["spec"]["names"]["kind"], clusterreports["spec"]["scope"]) == (
        "ClusterReport",
        "Cluster",
    )


def test_reports_validate_against_the_published_schemas() -> None:
    (report,) = to_open_reports(findings(), now=1_700_000_000.5)
    assert (report["apiVersion"], report["kind"]) == ("openreports.io/v1alpha1", "Report")
    assert {r["result"] for r in report["results"]} == {"pass", "fail", "warn"}
    jsonschema.validate(report, schema(crd("reports")))
    policy = load_policy(SHIPPED)
    warning = PolicyIssue("policies/profiles.yaml", 12, "spec.env", "shadows a default")
    cluster = cluster_report(policy, [warning], now=1_700_000_000.5)
    assert (cluster["kind"], cluster["metadata"]["name"]) == ("ClusterReport", "runguard-policy")
    jsonschema.validate(cluster, schema(crd("clusterreports")))
    # The schema checks what it types: a severity outside its enum is refused.
    bad = {**report, "results": [{**report["results"][0], "severity": "urgent"}]}
    with pytest.raises(jsonschema.ValidationError, match="urgent"):
        jsonschema.validate(bad, schema(crd("reports")))


def test_every_result_carries_what_policy_reporter_reads() -> None:
    (report,) = to_open_reports(findings(), now=1_700_000_000.5)
    assert report["source"] == "runguard"  # Policy Reporter groups reports by it
    assert report["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": "ml"}
    outcomes = [r["result"] for r in report["results"]]
    assert report["summary"] == {k: outcomes.count(k) for k in RESULTS}
    assert report["summary"]["pass"] == 1 and report["summary"]["fail"] > 0
    typed = schema(crd("reports"))["properties"]["results"]["items"]["properties"]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for result in report["results"]:
        wanted = {"policy", "rule", "result", "severity", "category", "source", "timestamp"}
        assert wanted | {"message", "resources", "properties", "scored"} <= set(result)
        assert set(result) <= set(typed)  # nothing the apiserver would prune
        assert result["timestamp"] == {"seconds": 1_700_000_000, "nanos": 500_000_000}
        (resource,) = result["resources"]
        by_name.setdefault(resource["name"], []).append(result)
    (passed,) = by_name["ok"]
    assert passed["properties"]["runPolicy"] == "platform" and passed["result"] == "pass"
    assert ("fail", "security.host-namespace", "high") in {
        (r["result"], r["rule"], r["severity"]) for r in by_name["host"]
    }
    assert {r["result"] for r in by_name["warned"]} == {"warn"}  # enforcement: Warn
    (drifted,) = by_name["drifted"]
    assert drifted["properties"] == {
        "runPolicy": "platform",
        "profile": "1xt4",
        "path": "spec",
        "drift": "true",
    }
    assert (drifted["result"], drifted["category"]) == ("warn", "Policy drift")


def test_both_formats_carry_the_same_results() -> None:
    found = findings()
    open_reports = to_open_reports(found, per_report=2, now=7.0)
    policy_reports = to_policy_reports(found, per_report=2, now=7.0)
    assert [r["results"] for r in open_reports] == [r["results"] for r in policy_reports]
    assert [r["metadata"] for r in open_reports] == [r["metadata"] for r in policy_reports]
    assert {r["kind"] for r in policy_reports} == {"PolicyReport"}
    assert all("source" not in r for r in policy_reports)  # not in wgpolicyk8s' format


def test_objects_are_bounded_by_namespaces_and_policies_not_runs() -> None:
    """2,500 runs in each of 3 namespaces: 3 reports of 3 parts each (1,000 results per
    part), whatever the runs; a namespace's parts grow with its runs / 1,000 only."""
    book = ReportBook()
    for namespace in ("a", "b", "c"):
        book.add(
            Finding("Pod", namespace, f"r{i}", "v1", "", "platform", None, "pass", ())
            for i in range(2_500)
        )
    reports = list(book.reports(OPEN_REPORTS))
    assert len(reports) == 3 * math.ceil(2_500 / 1_000)
    assert [r["metadata"]["name"] for r in reports[:3]] == [
        "runguard-platform",
        "runguard-platform-2",
        "runguard-platform-3",
    ]
    assert sum(len(r["results"]) for r in reports) == 7_500


def test_reports_flag_names_formats() -> None:
    assert audit_write.report_formats("openreports") == (OPEN_REPORTS,)
    assert [f.name for f in audit_write.report_formats("policyreport, openreports")] == [
        "policyreport",
        "openreports",
    ]
    with pytest.raises(argparse.ArgumentTypeError, match="expected policyreport or openreports"):
        audit_write.report_formats("polr")


def test_write_uses_the_formats_the_cluster_serves(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.audit.clusteraudit import AuditError

    missing = {"policyreport": [], "openreports": ["Report", "ClusterReport"]}
    monkeypatch.setattr(audit_write, "missing_kinds", lambda _client, form: missing[form.name])
    # By default: whichever is served, the other said.
    assert [f.name for f in audit_write.served_formats(None, None)] == ["policyreport"]
    said = capsys.readouterr().err
    assert "serves no openreports.io/v1alpha1 Report or ClusterReport" in said
    assert "github.com/openreports/reports-api" in said and "openreports not written" in said
    # Asked for by name: an error that says what to install.
    with pytest.raises(AuditError, match="without --reports openreports"):
        audit_write.served_formats(None, audit_write.report_formats("openreports"))
    # None served: an error, not an empty write.
    missing["policyreport"] = ["ClusterPolicyReport"]
    with pytest.raises(AuditError, match="no report format to write"):
        audit_write.served_formats(None, None)


def test_reports_goes_with_write(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli import main

    assert main(["audit", "-p", str(SHIPPED), "--reports", "openreports"]) == 2
    assert "--reports goes with --write" in capsys.readouterr().err


def test_a_crd_gone_since_discovery_is_said_as_missing() -> None:
    from kubernetes.client.exceptions import ApiException

    from webhook.audit.clusteraudit import AuditError

    with pytest.raises(AuditError, match=r"^404: the cluster serves no openreports.io/v1alpha1"):
        with audit_write.crds_checked(OPEN_REPORTS):
            raise ApiException(status=404, reason="Not Found")
    with pytest.raises(ApiException):  # any other answer is the apiserver's to say
        with audit_write.crds_checked(OPEN_REPORTS):
            raise ApiException(status=403, reason="Forbidden")
