"""``runguard audit``: judge objects already in the cluster against the policy.

Pure: takes objects (as listed from the API) and returns findings, and renders them as
rows, JSON, or ``wgpolicyk8s.io/v1alpha2`` PolicyReports (the format Kyverno and
Gatekeeper's reporters publish, read by Policy Reporter and similar tools).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from webhook.engine import Decision, validate
from webhook.policy.model import Policy

REPORT_API = "wgpolicyk8s.io/v1alpha2"


@dataclass(frozen=True)
class Finding:
    """One object's verdict under the policy."""

    decision: Decision
    api_version: str
    uid: str

    @property
    def result(self) -> str:
        if not self.decision.violations:
            return "pass"
        return "fail" if self.decision.enforcement == "Deny" else "warn"


def audit(objects: Iterable[Any], policy: Policy) -> list[Finding]:
    """Findings for every run (Pods and pod controllers) among ``objects``; others are skipped."""
    findings = []
    for obj in objects:
        decision = validate(obj, policy)
        if not decision.applies:
            continue
        meta = obj.get("metadata") or {}  # validate() applied: obj is a dict
        findings.append(Finding(decision, str(obj.get("apiVersion", "")), str(meta.get("uid", ""))))
    return findings


def to_rows(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [
        {
            "namespace": f.decision.namespace,
            "kind": f.decision.kind,
            "name": f.decision.name,
            "result": f.result,
            "profile": f.decision.profile,
            "violations": [v.to_dict() for v in f.decision.violations],
        }
        for f in findings
    ]


def to_table(findings: Iterable[Finding]) -> str:
    rows = [("NAMESPACE", "KIND", "NAME", "RESULT", "VIOLATIONS")]
    for f in findings:
        d = f.decision
        rules = ",".join(dict.fromkeys(v.rule for v in d.violations)) or "-"
        rows.append((d.namespace, d.kind, d.name, f.result, rules))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:4])) + "  " + r[4] for r in rows
    )


def to_policy_reports(findings: Iterable[Finding], policy: Policy) -> list[dict[str, Any]]:
    """A PolicyReport per namespace: a result per (object, rule), a pass per clean object."""
    by_namespace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in findings:
        d = f.decision
        resource = {
            "apiVersion": f.api_version,
            "kind": d.kind,
            "name": d.name,
            "namespace": d.namespace,
        }
        if f.uid:
            resource["uid"] = f.uid
        if not d.violations:
            by_namespace[d.namespace].append(
                {
                    "policy": policy.name,
                    "rule": "run",
                    "result": "pass",
                    "source": "runguard",
                    "resources": [resource],
                    "message": "compliant",
                }
            )
        for v in d.violations:
            by_namespace[d.namespace].append(
                {
                    "policy": policy.name,
                    "rule": v.rule,
                    "result": f.result,
                    "source": "runguard",
                    "resources": [resource],
                    "message": f"{v.path}: {v.message}",
                    "properties": {"path": v.path},
                }
            )
    reports = []
    for namespace, results in sorted(by_namespace.items()):
        summary = {
            key: sum(r["result"] == key for r in results)
            for key in ("pass", "fail", "warn", "error", "skip")
        }
        reports.append(
            {
                "apiVersion": REPORT_API,
                "kind": "PolicyReport",
                "metadata": {
                    "name": f"runguard-{policy.name}",
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/managed-by": "runguard"},
                },
                "summary": summary,
                "results": results,
            }
        )
    return reports
