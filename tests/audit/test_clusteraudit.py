"""runguard audit: judging, server-side selection, paging over raw JSON with a fake of the
one list request, and the outputs (the real apiserver is in tests/e2e/test_audit_scale.py)."""

from __future__ import annotations

import gc
import io
import json
import weakref
from pathlib import Path
from typing import Any

import pytest
from harness import REPO, TESTS
from harness.apiserver import FakeApiserver

from webhook.audit.clusteraudit import (
    LISTINGS,
    AuditError,
    JsonRowsWriter,
    TableWriter,
    audit,
    decode_page,
    judged_pages,
    label_selector,
    list_query,
    to_rows,
    to_table,
)
from webhook.audit.policyreport import to_policy_reports
from webhook.engine import mutate
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, build_run_policy

POLICIES = TESTS / "cases" / "_policies"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}


def pod(name: str, ns: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A pod as it runs: passed through runguard's mutation at creation (a no-op for pods
    outside the selector), then given ``spec`` (what a policy edit since would judge)."""
    created = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    running: dict[str, Any] = mutate(created, load_policy(POLICIES / "platform")).object
    running["spec"].update(spec)
    return running


OBJECTS = [
    pod("good", "ml", RUN, priorityClassName="low"),
    pod("host", "ml", RUN, hostNetwork=True, hostPID=True),
    pod("web", "ml", {"app": "web"}, hostNetwork=True),
    pod("kube", "kube-system", RUN, hostNetwork=True),
    pod("root", "team", RUN, securityContext={"runAsUser": 0}),
]


def test_only_runs_are_judged_and_existing_pods_are_not_mutated_first() -> None:
    findings = audit(OBJECTS, load_policy(POLICIES / "platform"))
    verdicts = {f.name: (f.result, [v.rule for v in f.violations]) for f in findings}
    assert verdicts == {
        "good": ("pass", []),
        "host": ("fail", ["security.host-namespace", "security.host-namespace"]),
        # an existing pod is judged as it is: root that mutation would strip is still
        # reported, and so is what its replaced securityContext no longer has (runAsNonRoot,
        # seccomp: the Pod Security Standards' restricted level)
        "root": ("fail", ["security.root", "security.root", "security.seccomp"]),
    }


def test_warn_enforcement_reports_warn() -> None:
    findings = audit(OBJECTS, load_policy(POLICIES / "warn"))
    assert {f.name: f.result for f in findings}["host"] == "warn"


def test_policy_reports_group_by_namespace_with_summaries() -> None:
    policy = load_policy(POLICIES / "platform")
    reports = to_policy_reports(audit(OBJECTS, policy))
    assert [r["metadata"]["namespace"] for r in reports] == ["ml", "team"]
    ml = reports[0]
    assert ml["apiVersion"] == "wgpolicyk8s.io/v1alpha2" and ml["kind"] == "PolicyReport"
    assert ml["summary"] == {"pass": 1, "fail": 2, "warn": 0, "error": 0, "skip": 0}
    failed = [r for r in ml["results"] if r["result"] == "fail"]
    assert {r["rule"] for r in failed} == {"security.host-namespace"}
    assert failed[0]["resources"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "host", "namespace": "ml", "uid": "uid-host"}
    ]
    assert failed[0]["properties"]["path"] in {"spec.hostNetwork", "spec.hostPID"}


def test_table_and_rows() -> None:
    findings = audit(OBJECTS, load_policy(POLICIES / "platform"))
    lines = to_table(findings).splitlines()
    assert lines[0].split() == ["NAMESPACE", "KIND", "NAME", "RESULT", "VIOLATIONS"]
    assert lines[2].split() == ["ml", "Pod", "host", "fail", "security.host-namespace"]
    rows = to_rows(findings)
    assert rows[0] == {
        "namespace": "ml",
        "kind": "Pod",
        "name": "good",
        "result": "pass",
        "policy": "platform",
        "profile": "default",
        "violations": [],
    }


# --- at cluster scale: selection, paging, raw JSON, flat memory -----------------------


def selector_policy(selector: dict[str, Any], exclude: list[str] | None = None) -> Policy:
    spec: dict[str, Any] = {"selector": selector}
    if exclude is not None:
        spec["excludeNamespaces"] = exclude
    return Policy.of(
        build_run_policy({"kind": "RunPolicy", "metadata": {"name": "p"}, "spec": spec}, [])
    )


def test_label_selector_is_the_policy_selector_in_the_api_syntax() -> None:
    policy = selector_policy(
        {
            "matchLabels": {"app.kubernetes.io/managed-by": "dhcore", "tier": "gpu"},
            "matchExpressions": [
                {"key": "dhcore/run", "operator": "Exists"},
                {"key": "stage", "operator": "In", "values": ["dev", "prod"]},
                {"key": "team", "operator": "NotIn", "values": ["x"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    assert label_selector(policy.first.selector) == (
        "app.kubernetes.io/managed-by=dhcore,tier=gpu,dhcore/run,"
        "stage in (dev,prod),team notin (x),!legacy"
    )
    assert label_selector(selector_policy({}).first.selector) == ""  # matches every Pod


def test_pods_are_selected_server_side_controllers_only_by_namespace() -> None:
    policy = selector_policy({"matchLabels": {"run": "yes"}}, exclude=["kube-system", "b-ns"])
    pods, jobs = LISTINGS[0], LISTINGS[1]
    namespaces = "metadata.namespace!=b-ns,metadata.namespace!=kube-system"
    assert list_query(pods, policy, 50) == {
        "limit": "50",
        "labelSelector": "run=yes",
        "fieldSelector": namespaces,
    }
    # The run labels of a controller are in its template: no server-side label selector.
    assert list_query(jobs, policy, 50) == {"limit": "50", "fieldSelector": namespaces}
    assert list_query(pods, selector_policy({}, exclude=[]), 7) == {"limit": "7"}


def runs(count: int, ns: str = "ml") -> list[dict[str, Any]]:
    return [pod(f"run-{i:03}", ns, RUN, priorityClassName="low") for i in range(count)]


def test_paging_judges_every_object_once_from_raw_json() -> None:
    policy = load_policy(POLICIES / "platform")
    job = {
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-job"},
        "spec": {"template": {"metadata": {"labels": RUN}, "spec": {"containers": []}}},
    }
    fetch = FakeApiserver({"Pod": runs(11) + runs(3, "team"), "Job": [job]})
    pages = list(judged_pages(fetch, policy, page_size=4))
    pod_pages = [p for p in pages if p.listing.kind == "Pod"]
    assert [p.listed for p in pod_pages] == [4, 4, 4, 2]
    assert [p.number for p in pod_pages] == [1, 2, 3, 4]
    names = [(f.namespace, f.name) for p in pod_pages for f in p.findings]
    assert len(names) == len(set(names)) == 14
    assert {f.result for p in pod_pages for f in p.findings} == {"pass"}
    (job_finding,) = [f for p in pages if p.listing.kind == "Job" for f in p.findings]
    # kind and apiVersion come from the listing: list items carry neither.
    assert (job_finding.kind, job_finding.api_version) == ("Job", "batch/v1")
    assert job_finding.uid == "uid-job"
    # One request per page, the continue token of the previous one, every kind listed.
    pod_queries = [q for kind, q in fetch.queries if kind == "Pod"]
    assert [q.get("continue") for q in pod_queries] == [None, "4", "8", "12"]
    assert {kind for kind, _ in fetch.queries} == {listing.kind for listing in LISTINGS}
    assert all(q["limit"] == "4" for _, q in fetch.queries)


def test_an_expired_continue_token_restarts_the_listing_skipping_what_was_judged() -> None:
    policy = load_policy(POLICIES / "platform")
    fetch = FakeApiserver({"Pod": runs(10)}, expire=frozenset({3}))  # the third request: page 3
    notices: list[str] = []
    pages = list(judged_pages(fetch, policy, page_size=3, notice=notices.append))
    names = [f.name for p in pages for f in p.findings]
    assert names == [f"run-{i:03}" for i in range(10)]  # each once, in order
    (notice,) = notices
    assert "pods expired after 2 pages (410 Gone" in notice
    assert "again from the start" in notice
    pod_queries = [q.get("continue") for kind, q in fetch.queries if kind == "Pod"]
    assert pod_queries == [None, "3", "6", None, "3", "6", "9"]


def test_a_listing_that_keeps_expiring_is_an_error() -> None:
    policy = load_policy(POLICIES / "platform")
    fetch = FakeApiserver({"Pod": runs(10)}, expire=frozenset(range(2, 100)))
    with pytest.raises(AuditError, match=r"expired 4 times in a row"):
        list(judged_pages(fetch, policy, page_size=3))


def test_a_page_that_is_not_a_list_is_an_error() -> None:
    pods = LISTINGS[0]
    with pytest.raises(AuditError, match="not JSON"):
        decode_page(pods, b"<html>")
    with pytest.raises(AuditError, match="not a PodList"):
        decode_page(pods, b'{"items": 3}')
    assert decode_page(pods, b'{"metadata": {}}') == ([], "")


def test_an_excluded_namespace_is_not_listed() -> None:
    fetch = FakeApiserver({})
    assert (
        list(judged_pages(fetch, load_policy(POLICIES / "platform"), namespace="kube-system")) == []
    )
    assert fetch.queries == []


def test_findings_keep_nothing_of_the_objects() -> None:
    class Pod(dict[str, Any]):
        """A dict that can be weakly referenced."""

    objects = [Pod(o) for o in OBJECTS]
    alive = [weakref.ref(o) for o in objects]
    findings = audit(objects, load_policy(POLICIES / "platform"))
    del objects
    gc.collect()
    assert findings and all(ref() is None for ref in alive)


def test_streamed_json_is_the_rows_as_one_document() -> None:
    findings = audit(OBJECTS, load_policy(POLICIES / "platform"))
    for chunks in ([findings], [findings[:1], [], findings[1:]], []):
        out = io.StringIO()
        writer = JsonRowsWriter(out)
        for chunk in chunks:
            writer.write(chunk)
        writer.close()
        rows = [row for chunk in chunks for row in to_rows(chunk)]
        assert out.getvalue() == json.dumps(rows, indent=2) + "\n"


def test_streamed_table_sets_widths_from_the_first_rows() -> None:
    findings = audit(OBJECTS, load_policy(POLICIES / "platform"))
    out = io.StringIO()
    table = TableWriter(out, buffer=1)  # the header and one row set the widths
    table.write(findings[:2])
    table.write(findings[2:])
    table.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["NAMESPACE", "KIND", "NAME", "RESULT"],
        ["ml", "Pod", "good", "pass"],
        ["ml", "Pod", "host", "fail"],
        ["team", "Pod", "root", "fail"],
    ]
    assert lines[1].index("pass") == lines[0].index("RESULT")
    assert to_table([]) == "NAMESPACE  KIND  NAME  RESULT  VIOLATIONS"


def test_policy_reports_split_into_parts() -> None:
    policy = load_policy(POLICIES / "platform")
    findings = audit(OBJECTS + runs(4), policy)
    whole = to_policy_reports(findings)
    parts = to_policy_reports(findings, per_report=2)
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in parts] == [
        ("ml", "runguard-platform"),
        ("ml", "runguard-platform-2"),
        ("ml", "runguard-platform-3"),
        ("ml", "runguard-platform-4"),
        ("team", "runguard-platform"),
        ("team", "runguard-platform-2"),
    ]
    assert all(len(r["results"]) <= 2 for r in parts)
    for namespace in ("ml", "team"):
        (report,) = [r for r in whole if r["metadata"]["namespace"] == namespace]
        split = [r for r in parts if r["metadata"]["namespace"] == namespace]
        assert [x for r in split for x in r["results"]] == report["results"]
        for key, total in report["summary"].items():
            assert sum(r["summary"][key] for r in split) == total


def two_run_policies(directory: Path) -> Policy:
    """'builds' (tried first, by name) for the platform's image builds, 'platform' for
    the other runs; each excludes a namespace of its own."""
    for name, labels, extra, excluded in (
        ("builds", {"managed-by": "dhcore", "framework": "build"}, [], "ci"),
        ("platform", {"managed-by": "dhcore"}, [{"key": "gpu", "operator": "DoesNotExist"}],
         "team"),
    ):  # fmt: skip
        expressions = [
            {"key": "run", "operator": "Exists"},
            {"key": "stage", "operator": "In", "values": ["a", "b"] if extra else ["b", "a"]},
            *extra,
        ]
        spec = {
            "selector": {"matchLabels": labels, "matchExpressions": expressions},
            "excludeNamespaces": ["kube-system", excluded],
        }
        document = {"apiVersion": "runguard.io/v1", "kind": "RunPolicy",
                    "metadata": {"name": name}, "spec": spec}  # fmt: skip
        (directory / f"{name}.yaml").write_text(json.dumps(document))
    return load_policy(directory)


def test_several_run_policies_are_selected_by_what_all_their_selectors_require(
    tmp_path: Path,
) -> None:
    policy = two_run_policies(tmp_path)
    assert [p.name for p in policy.run_policies] == ["builds", "platform"]
    # A Pod either selector matches meets these: the server sends a superset of the runs.
    assert list_query(LISTINGS[0], policy, 10) == {
        "limit": "10",
        "labelSelector": "managed-by=dhcore,run,stage in (b,a)",
        "fieldSelector": "metadata.namespace!=kube-system",  # excluded by both
    }
    assert list_query(LISTINGS[1], policy, 10) == {
        "limit": "10",
        "fieldSelector": "metadata.namespace!=kube-system",
    }
    fetch = FakeApiserver({})
    assert len(list(judged_pages(fetch, policy, namespace="ci"))) == len(LISTINGS)
    assert {kind for kind, _ in fetch.queries} == {listing.kind for listing in LISTINGS}
    assert not list(judged_pages(fetch, policy, namespace="kube-system"))  # no one governs it


def test_each_run_is_reported_under_the_run_policy_that_judged_it(tmp_path: Path) -> None:
    policy = two_run_policies(tmp_path)
    run = {"managed-by": "dhcore", "run": "r1", "stage": "a"}
    build = {**run, "framework": "build"}

    def obj(name: str, ns: str, labels: dict[str, str], kind: str = "Pod") -> dict[str, Any]:
        metadata = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
        spec = {"containers": [{"name": "main", "image": "x"}]}
        if kind == "Pod":
            return {"apiVersion": "v1", "kind": kind, "metadata": {**metadata, "labels": labels},
                    "spec": spec}  # fmt: skip
        template = {"metadata": {"labels": labels}, "spec": spec}
        if kind == "CronJob":
            template = {"spec": {"template": template}}
            return {"apiVersion": "batch/v1", "kind": kind, "metadata": metadata,
                    "spec": {"schedule": "@daily", "jobTemplate": template}}  # fmt: skip
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": metadata,
                "spec": {"template": template}}  # fmt: skip

    findings = audit(
        [
            obj("build", "ml", build),
            obj("train", "ml", run),
            obj("ci-build", "ci", build),  # 'builds' excludes ci: 'platform' judges it
            obj("team-train", "team", run),  # 'platform' excludes team, 'builds' does not match
            obj("gpu-build", "team", {**build, "gpu": "1"}),
            obj("nightly", "ml", build, "CronJob"),
            obj("finetune", "ml", run, "Job"),
        ],
        policy,
    )
    assert {(f.namespace, f.name): f.policy for f in findings} == {
        ("ml", "build"): "builds",
        ("ml", "train"): "platform",
        ("ci", "ci-build"): "platform",
        ("team", "gpu-build"): "builds",
        ("ml", "nightly"): "builds",
        ("ml", "finetune"): "platform",
    }
    reports = to_policy_reports(findings)
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in reports] == [
        ("ci", "runguard-platform"),
        ("ml", "runguard-builds"),
        ("ml", "runguard-platform"),
        ("team", "runguard-builds"),
    ]
    for report in reports:
        (name,) = {result["policy"] for result in report["results"]}
        assert report["metadata"]["name"] == f"runguard-{name}"
        assert report["metadata"]["labels"]["runguard.io/policy"] == name


# --- what Policy Reporter reads: every result's fields, the ClusterPolicyReport, drift --

SHIPPED = REPO / "policies"
T4_RUN = {**RUN, "dhcore/template": "1xt4"}


def edited_policies(tmp_path: Path) -> Path:
    """The shipped policies with profile 1xt4 edited (6 cores instead of 4)."""
    edited = tmp_path / "policies"
    edited.mkdir()
    for path in SHIPPED.glob("*.yaml"):
        text = path.read_text()
        if path.name == "profiles.yaml":
            before = 'requests: {cpu: "4", memory: 16Gi, gpu: "1"}'
            assert text.count(before) == 1
            text = text.replace(before, 'requests: {cpu: "6", memory: 16Gi, gpu: "1"}')
        (edited / path.name).write_text(text)
    return edited


def created(name: str, policy: Policy, labels: dict[str, str]) -> dict[str, Any]:
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": labels, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    return mutate(obj, policy).object


def test_a_run_admitted_before_a_profile_edit_is_drift_not_a_bypass(tmp_path: Path) -> None:
    before, after = load_policy(SHIPPED), load_policy(edited_policies(tmp_path))
    admitted = created("admitted", before, T4_RUN)
    assert admitted["metadata"]["labels"]["runguard.io/policy"] == "digitalhub"
    bypassed = {**admitted, "metadata": {**admitted["metadata"], "name": "bypassed"}}
    bypassed["metadata"]["labels"] = {
        k: v for k, v in admitted["metadata"]["labels"].items() if k != "runguard.io/policy"
    }
    findings = {f.name: f for f in audit([admitted, bypassed], after)}
    drift = findings["admitted"]
    assert drift.result == "warn" and [v.rule for v in drift.violations] == ["profile.applied"]
    (violation,) = drift.violations
    assert violation.drift and violation.message.startswith("policy drift: ")
    assert "bypassed" not in violation.message and "recreate it" in violation.message
    # Without runguard's record, nothing says runguard admitted it: a bypass, denied.
    assert findings["bypassed"].result == "fail"
    assert "was it bypassed?" in findings["bypassed"].violations[0].message
    (report,) = to_policy_reports([drift])
    (result,) = report["results"]
    assert (result["result"], result["category"], result["severity"]) == (
        "warn",
        "Policy drift",
        "low",
    )
    assert result["properties"]["drift"] == "true"
    # Under the policy it was admitted with, the same Pod passes.
    assert audit([admitted], before)[0].result == "pass"


def test_every_result_has_what_policy_reporter_sorts_by() -> None:
    policy = load_policy(POLICIES / "platform")
    reports = to_policy_reports(audit(OBJECTS, policy), now=1_700_000_000.25)
    results = [r for report in reports for r in report["results"]]
    assert {r["result"] for r in results} == {"pass", "fail"}
    for r in results:
        assert r["timestamp"] == {"seconds": 1_700_000_000, "nanos": 250_000_000}
        assert r["source"] == "runguard" and r["scored"] is True
        assert r["severity"] in {"high", "medium", "low"} and r["category"]
    host = next(r for r in results if r["rule"] == "security.host-namespace")
    assert (host["severity"], host["category"]) == ("high", "Pod security")
    assert [r["scope"] for r in reports] == [
        {"apiVersion": "v1", "kind": "Namespace", "name": "ml"},
        {"apiVersion": "v1", "kind": "Namespace", "name": "team"},
    ]


def test_the_cluster_policy_report_lists_the_policy_objects() -> None:
    from webhook.audit.policyreport import cluster_policy_report
    from webhook.policy.errors import PolicyIssue

    policy = load_policy(SHIPPED)
    warning = PolicyIssue("policies/profiles.yaml", 12, "spec.env", "shadows a default")
    report = cluster_policy_report(policy, [warning], now=5.0)
    assert report["kind"] == "ClusterPolicyReport" and "namespace" not in report["metadata"]
    assert report["metadata"]["name"] == "runguard-policy"
    loaded = [
        (r["resources"][0]["kind"], r["resources"][0]["name"])
        for r in report["results"]
        if r["result"] == "pass"
    ]
    assert loaded == [("RunPolicy", name) for name in policy.names()] + [
        ("Profile", name) for name in policy.profile_names()
    ]
    assert {r["rule"] for r in report["results"] if r["result"] == "pass"} == {"policy.loaded"}
    (warned,) = [r for r in report["results"] if r["result"] == "warn"]
    assert (warned["rule"], warned["category"], warned["severity"]) == (
        "policy.lint",
        "Policy",
        "medium",
    )
    assert warned["message"] == "spec.env: shadows a default"
    assert warned["properties"] == {"file": "policies/profiles.yaml:12", "key": "spec.env"}
    assert report["summary"]["pass"] == len(loaded) and report["summary"]["warn"] == 1
    assert {r["timestamp"]["seconds"] for r in report["results"]} == {5}


def test_audit_without_a_kubeconfig_says_where_to_put_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.cli import main

    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    assert main(["audit", "-p", str(SHIPPED)]) == 2
    err = capsys.readouterr().err
    assert "runguard audit: cannot list objects: no kubeconfig found" in err
    assert "set KUBECONFIG or pass --kubeconfig FILE" in err
    assert "Invalid kube-config file" not in err


def test_writing_reports_without_their_crd_says_how_to_install_it() -> None:
    from kubernetes.client.exceptions import ApiException

    from webhook.cli.cluster import failure_reason

    bare = ApiException(status=404, reason="Not Found")  # a group the apiserver lacks
    assert failure_reason(bare) == "Not Found"  # listing: nothing to do with reports
    said = failure_reason(bare, writing=True)
    assert said.startswith("404: the cluster serves no wgpolicyk8s.io/v1alpha2 PolicyReports")
    assert "kubectl apply -k manifests/policyreport-crd" in said and "without --write" in said
