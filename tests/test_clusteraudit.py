"""runguard audit's report building (the cluster listing itself is exercised in tests/e2e)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webhook.clusteraudit import audit, to_policy_reports, to_rows, to_table
from webhook.engine import mutate
from webhook.policy.loader import load_policy

POLICIES = Path(__file__).parent / "cases" / "_policies"
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
    verdicts = {
        f.decision.name: (f.result, [v.rule for v in f.decision.violations]) for f in findings
    }
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
    assert {f.decision.name: f.result for f in findings}["host"] == "warn"


def test_policy_reports_group_by_namespace_with_summaries() -> None:
    policy = load_policy(POLICIES / "platform")
    reports = to_policy_reports(audit(OBJECTS, policy), policy)
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
        "profile": "default",
        "violations": [],
    }
