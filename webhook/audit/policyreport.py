"""``runguard audit``'s findings as ``wgpolicyk8s.io/v1alpha2`` PolicyReports.

The format Kyverno and Gatekeeper's reporters publish, read by Policy Reporter and
similar tools: one PolicyReport per namespace and RunPolicy, split in parts of at most
``RESULTS_PER_REPORT`` results so that none nears etcd's 1.5 MiB object limit, whose
``scope`` is the Namespace; and one ClusterPolicyReport for what is cluster-scoped, the
policy objects themselves (each RunPolicy and Profile, and every lint warning). Every
result has a ``timestamp`` (when the audit ran), a ``severity`` and a ``category`` (the
rule's, as ``webhook.engine.registry`` declares it) and ``source: runguard``. A run's
policy drift is ``warn``, category ``Policy drift``, severity ``low``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from webhook.audit.clusteraudit import Finding
from webhook.engine import registry
from webhook.engine.rule import CONCERNS, Declarations
from webhook.keys import POLICY_LABEL
from webhook.policy.model import API_VERSION as POLICY_API
from webhook.policy.model import Policy

RULES = Declarations(__name__)
POLICY_LOADED = RULES.report("policy.loaded", "a RunPolicy or Profile object that loads (pass)")
POLICY_LINT = RULES.report("policy.lint", "a lint warning about a RunPolicy or Profile object")

REPORT_GROUP, REPORT_VERSION, REPORT_PLURAL = "wgpolicyk8s.io", "v1alpha2", "policyreports"
REPORT_API = f"{REPORT_GROUP}/{REPORT_VERSION}"
CLUSTER_REPORT_PLURAL = "clusterpolicyreports"
CLUSTER_REPORT_NAME = "runguard-policy"  # the ClusterPolicyReport about the policy objects
SOURCE = "runguard"  # every result's ``source``
REPORT_LABELS = {"app.kubernetes.io/managed-by": "runguard"}
RESULTS_PER_REPORT = 1000  # ~0.25 MB of JSON (more with long messages): under etcd's 1.5 MiB
RESULTS = ("pass", "fail", "warn", "error", "skip")  # a PolicyReport summary's keys

DRIFT_CATEGORY, DRIFT_SEVERITY = "Policy drift", "low"
PASS_CATEGORY, PASS_SEVERITY = "Runs", "low"
POLICY_CATEGORY = CONCERNS["policy"].category  # the ClusterPolicyReport's results


def timestamp(now: float) -> dict[str, int]:
    """A result's ``timestamp`` (protobuf's Timestamp, as the WG's schema has it)."""
    seconds = int(now)
    return {"seconds": seconds, "nanos": int(round((now - seconds) * 1e9)) % 1_000_000_000}


def rule_severity(rule: str) -> str:
    """A failure's severity: its rule's, as ``webhook.engine.registry`` declares it."""
    declared = registry.RULES.get(rule)
    return declared.severity if declared else "medium"


def rule_category(rule: str) -> str:
    declared = registry.RULES.get(rule)
    return declared.category if declared else PASS_CATEGORY


def report_name(policy: str, part: int) -> str:
    """PolicyReport names: ``runguard-<RunPolicy>``, then ``-2``, ``-3``... for more parts."""
    return f"runguard-{policy}" + (f"-{part}" if part > 1 else "")


def _summary(results: list[dict[str, Any]]) -> dict[str, int]:
    summary = dict.fromkeys(RESULTS, 0)
    for r in results:
        summary[r["result"]] += 1
    return summary


def policy_report(
    policy: str, namespace: str, part: int, results: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": REPORT_API,
        "kind": "PolicyReport",
        "metadata": {
            "name": report_name(policy, part),
            "namespace": namespace,
            "labels": {**REPORT_LABELS, POLICY_LABEL: policy},
        },
        "scope": {"apiVersion": "v1", "kind": "Namespace", "name": namespace},
        "summary": _summary(results),
        "results": results,
    }


def _results(f: Finding, when: dict[str, int]) -> Iterator[dict[str, Any]]:
    """A result per (object, rule), or one pass for a clean object."""
    resource = {"apiVersion": f.api_version, "kind": f.kind, "name": f.name}
    resource["namespace"] = f.namespace
    if f.uid:
        resource["uid"] = f.uid
    if not f.violations:
        yield {
            "policy": f.policy,
            "rule": "run",
            "result": "pass",
            "category": PASS_CATEGORY,
            "severity": PASS_SEVERITY,
            "source": SOURCE,
            "timestamp": dict(when),
            "scored": True,
            "resources": [resource],
            "message": "compliant",
        }
    for v in f.violations:
        yield {
            "policy": f.policy,
            "rule": v.rule,
            "result": "warn" if v.drift else f.result,
            "category": DRIFT_CATEGORY if v.drift else rule_category(v.rule),
            "severity": DRIFT_SEVERITY if v.drift else rule_severity(v.rule),
            "source": SOURCE,
            "timestamp": dict(when),  # not shared: YAML would write anchors
            "scored": True,
            "resources": [dict(resource)],
            "message": f"{v.path}: {v.message}",
            "properties": {"path": v.path, **({"drift": "true"} if v.drift else {})},
        }


def cluster_policy_report(
    policy: Policy, warnings: Iterable[Any] = (), *, now: float = 0.0
) -> dict[str, Any]:
    """The ClusterPolicyReport of what is cluster-scoped: the policy objects. A pass per
    RunPolicy and Profile (cluster-scoped objects in the CRD form), a warn per lint
    warning (``PolicyIssue``: file, line, key, message)."""
    when = timestamp(now)
    results: list[dict[str, Any]] = []

    def result(kind: str, name: str, outcome: str, message: str, **extra: Any) -> None:
        results.append(
            {
                "policy": name if kind == "RunPolicy" else policy.name,
                "rule": POLICY_LOADED if outcome == "pass" else POLICY_LINT,
                "result": outcome,
                "category": POLICY_CATEGORY,
                "severity": "low" if outcome == "pass" else "medium",
                "source": SOURCE,
                "timestamp": dict(when),
                "scored": True,
                "resources": [{"apiVersion": POLICY_API, "kind": kind, "name": name}],
                "message": message,
                **extra,
            }
        )

    for run_policy in policy.run_policies():
        result("RunPolicy", run_policy.name, "pass", f"loaded (digest {policy.digest})")
    for name in policy.profile_names():
        result("Profile", name, "pass", "loaded")
    for issue in warnings:
        where = issue.file if issue.line is None else f"{issue.file}:{issue.line}"
        key = f"{issue.key}: " if issue.key else ""
        result(
            "RunPolicy",
            policy.name,
            "warn",
            f"{key}{issue.message}",
            properties={"file": where, **({"key": issue.key} if issue.key else {})},
        )
        results[-1].pop("resources")  # about a file, whichever document it is in
    return {
        "apiVersion": REPORT_API,
        "kind": "ClusterPolicyReport",
        "metadata": {"name": CLUSTER_REPORT_NAME, "labels": dict(REPORT_LABELS)},
        "summary": _summary(results),
        "results": results,
    }


class ReportBook:
    """Findings by namespace and RunPolicy, for PolicyReports: they list every run, passes
    too (a resource without a result reads as "not audited"), so passes are kept here, as
    findings (a few hundred bytes each), never as objects."""

    def __init__(self, now: float = 0.0) -> None:
        self.findings: dict[tuple[str, str], list[Finding]] = defaultdict(list)
        self.timestamp = timestamp(now)  # every result's: when the audit ran

    def add(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.findings[f.namespace, f.policy].append(f)

    def reports(self, per_report: int = RESULTS_PER_REPORT) -> Iterator[dict[str, Any]]:
        """A PolicyReport per namespace and RunPolicy (in parts of at most ``per_report``
        results), each built only when asked for."""
        for namespace, policy in sorted(self.findings):
            part, results = 1, list[dict[str, Any]]()
            for f in self.findings[namespace, policy]:
                for result in _results(f, self.timestamp):
                    if len(results) == per_report:
                        yield policy_report(policy, namespace, part, results)
                        part, results = part + 1, list[dict[str, Any]]()
                    results.append(result)
            yield policy_report(policy, namespace, part, results)


def to_policy_reports(
    findings: Iterable[Finding], per_report: int = RESULTS_PER_REPORT, *, now: float = 0.0
) -> list[dict[str, Any]]:
    """The PolicyReports of ``findings``: one per namespace and RunPolicy (and part)."""
    book = ReportBook(now)
    book.add(findings)
    return list(book.reports(per_report))
