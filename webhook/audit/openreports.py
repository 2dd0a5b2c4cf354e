"""``runguard audit``'s findings as OpenReports: ``openreports.io/v1alpha1`` Reports.

The Policy WG's successor of wgpolicyk8s.io's PolicyReports, which Kyverno writes (its
``--openreportsEnabled``) and Policy Reporter 3 reads: a Report per namespace and
RunPolicy, split in parts, whose ``scope`` is the Namespace, and a ClusterReport about
the policy objects. The results are the PolicyReports' (``webhook.audit.reportbook``);
OpenReports adds the report's own ``source``, by which Policy Reporter groups them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.audit.clusteraudit import Finding
from webhook.audit.reportbook import (
    RESULTS_PER_REPORT,
    SOURCE,
    ReportFormat,
    policy_results,
    to_reports,
)
from webhook.policy.model import Policy

OPEN_REPORTS = ReportFormat(
    "openreports",
    "openreports.io",
    "v1alpha1",
    "Report",
    "ClusterReport",
    extra={"source": SOURCE},
)


def cluster_report(
    policy: Policy, warnings: Iterable[Any] = (), *, now: float = 0.0
) -> dict[str, Any]:
    """The ClusterReport of what is cluster-scoped: the policy objects."""
    return OPEN_REPORTS.cluster_report(policy_results(policy, warnings, now=now))


def to_open_reports(
    findings: Iterable[Finding], per_report: int = RESULTS_PER_REPORT, *, now: float = 0.0
) -> list[dict[str, Any]]:
    """The Reports of ``findings``: one per namespace and RunPolicy (and part)."""
    return to_reports(OPEN_REPORTS, findings, per_report, now=now)
