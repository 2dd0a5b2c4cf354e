"""``runguard audit``'s findings as ``wgpolicyk8s.io/v1alpha2`` PolicyReports.

The format Kyverno and Gatekeeper's reporters publish, read by Policy Reporter and
similar tools: one PolicyReport per namespace and RunPolicy, split in parts, whose
``scope`` is the Namespace, and one ClusterPolicyReport about the policy objects. The
results and their split are ``webhook.audit.reportbook``'s, shared with OpenReports
(``webhook.audit.openreports``). A run's policy drift is ``warn``, category ``Policy
drift``, severity ``low``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.audit.clusteraudit import Finding
from webhook.audit.reportbook import (
    CLUSTER_REPORT_NAME,
    REPORT_LABELS,
    RESULTS,
    RESULTS_PER_REPORT,
    SOURCE,
    ReportBook,
    ReportFormat,
    policy_results,
    report_name,
    timestamp,
    to_reports,
)
from webhook.policy.model import Policy

__all__ = [
    "CLUSTER_REPORT_NAME",
    "CLUSTER_REPORT_PLURAL",
    "POLICY_REPORTS",
    "REPORT_API",
    "REPORT_GROUP",
    "REPORT_LABELS",
    "REPORT_PLURAL",
    "REPORT_VERSION",
    "RESULTS",
    "RESULTS_PER_REPORT",
    "SOURCE",
    "ReportBook",
    "cluster_policy_report",
    "policy_report",
    "report_name",
    "timestamp",
    "to_policy_reports",
]

POLICY_REPORTS = ReportFormat(
    "policyreport", "wgpolicyk8s.io", "v1alpha2", "PolicyReport", "ClusterPolicyReport"
)
REPORT_GROUP, REPORT_VERSION = POLICY_REPORTS.group, POLICY_REPORTS.version
REPORT_API, REPORT_PLURAL = POLICY_REPORTS.api_version, POLICY_REPORTS.plural
CLUSTER_REPORT_PLURAL = POLICY_REPORTS.cluster_plural


def policy_report(
    policy: str, namespace: str, part: int, results: list[dict[str, Any]]
) -> dict[str, Any]:
    return POLICY_REPORTS.report(policy, namespace, part, results)


def cluster_policy_report(
    policy: Policy, warnings: Iterable[Any] = (), *, now: float = 0.0
) -> dict[str, Any]:
    """The ClusterPolicyReport of what is cluster-scoped: the policy objects."""
    return POLICY_REPORTS.cluster_report(policy_results(policy, warnings, now=now))


def to_policy_reports(
    findings: Iterable[Finding], per_report: int = RESULTS_PER_REPORT, *, now: float = 0.0
) -> list[dict[str, Any]]:
    """The PolicyReports of ``findings``: one per namespace and RunPolicy (and part)."""
    return to_reports(POLICY_REPORTS, findings, per_report, now=now)
