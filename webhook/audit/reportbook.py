"""What ``runguard audit``'s two report formats share: the results, and how they are split.

wgpolicyk8s.io's PolicyReports (``webhook.audit.policyreport``) and OpenReports'
Reports (``webhook.audit.openreports``) carry the same results: a result per (run, rule),
or one pass for a compliant run, each with ``policy`` (the RunPolicy), ``rule``,
``result``, ``severity`` and ``category`` (the rule's, as ``webhook.engine.registry``
declares it), ``source: runguard``, ``timestamp`` (when the audit ran), ``scored``,
``resources`` (the run), ``message`` and ``properties`` (the RunPolicy and the profile,
the path of a violation, ``drift`` for policy drift). They differ only in the object
around them, which ``ReportFormat`` describes; ``runguard audit --rbac``'s reports
(``webhook.audit.rbacreport``) are put in the same objects by ``ReportFormat.wrap``.

The number of objects is bounded by namespaces x RunPolicies, whatever the number of
runs: one namespaced report per namespace and RunPolicy, split in parts of at most
``RESULTS_PER_REPORT`` results so that none nears etcd's 1.5 MiB object limit, and one
cluster-scoped report about the policy objects (a pass per RunPolicy and Profile, a warn
per lint warning).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from webhook.audit.clusteraudit import Finding
from webhook.engine import registry
from webhook.engine.rule import CONCERNS, Declarations
from webhook.keys import POLICY_LABEL
from webhook.policy.model import API_VERSION as POLICY_API
from webhook.policy.model import Policy

RULES = Declarations(__name__)
POLICY_LOADED = RULES.report("policy.loaded", "a RunPolicy or Profile object that loads (pass)")
POLICY_LINT = RULES.report("policy.lint", "a lint warning about a RunPolicy or Profile object")

CLUSTER_REPORT_NAME = "runguard-policy"  # the cluster-scoped report about the policy objects
SOURCE = "runguard"  # every result's ``source``
REPORT_LABELS = {"app.kubernetes.io/managed-by": "runguard"}
RESULTS_PER_REPORT = 1000  # ~0.3 MB of JSON (more with long messages): under etcd's 1.5 MiB
RESULTS = ("pass", "fail", "warn", "error", "skip")  # a report summary's keys

DRIFT_CATEGORY, DRIFT_SEVERITY = "Policy drift", "low"
PASS_CATEGORY, PASS_SEVERITY = "Runs", "low"
POLICY_CATEGORY = CONCERNS["policy"].category  # the cluster-scoped report's results


def timestamp(now: float) -> dict[str, int]:
    """A result's ``timestamp`` (protobuf's Timestamp, as both schemas have it)."""
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
    """Report names: ``runguard-<RunPolicy>``, then ``-2``, ``-3``... for more parts."""
    return f"runguard-{policy}" + (f"-{part}" if part > 1 else "")


def summary(results: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(RESULTS, 0)
    for r in results:
        counts[r["result"]] += 1
    return counts


@dataclass(frozen=True)
class ReportFormat:
    """One report API: its kinds, and the fields it has around the results."""

    name: str  # what ``-o`` and ``--reports`` call it
    group: str
    version: str
    kind: str  # namespaced, one per namespace and RunPolicy (and part)
    cluster_kind: str  # the one about the policy objects
    extra: Mapping[str, Any] = field(default_factory=dict)  # top-level fields of both kinds

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def plural(self) -> str:
        return self.kind.lower() + "s"

    @property
    def cluster_plural(self) -> str:
        return self.cluster_kind.lower() + "s"

    def wrap(self, metadata: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
        """A report of ``results`` named by ``metadata``: of the namespaced kind, its
        ``scope`` the Namespace, when ``metadata`` has a namespace; else of the
        cluster-scoped kind. ``runguard audit --rbac``'s reports are made with it too."""
        namespace = metadata.get("namespace")
        scope = {"apiVersion": "v1", "kind": "Namespace", "name": namespace}
        return {
            "apiVersion": self.api_version,
            "kind": self.kind if namespace else self.cluster_kind,
            "metadata": metadata,
            **self.extra,
            **({"scope": scope} if namespace else {}),
            "summary": summary(results),
            "results": results,
        }

    def report(
        self, policy: str, namespace: str, part: int, results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The report of one namespace and RunPolicy (one part of it)."""
        metadata = {
            "name": report_name(policy, part),
            "namespace": namespace,
            "labels": {**REPORT_LABELS, POLICY_LABEL: policy},
        }
        return self.wrap(metadata, results)

    def cluster_report(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The cluster-scoped report: ``results`` are ``policy_results``'."""
        return self.wrap({"name": CLUSTER_REPORT_NAME, "labels": dict(REPORT_LABELS)}, results)


def run_results(f: Finding, when: dict[str, int]) -> Iterator[dict[str, Any]]:
    """A result per (run, rule), or one pass for a compliant run."""
    resource = {"apiVersion": f.api_version, "kind": f.kind, "name": f.name}
    resource["namespace"] = f.namespace
    if f.uid:
        resource["uid"] = f.uid
    about = {"runPolicy": f.policy, **({"profile": f.profile} if f.profile else {})}
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
            "properties": about,
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
            "properties": {**about, "path": v.path, **({"drift": "true"} if v.drift else {})},
        }


def policy_results(
    policy: Policy, warnings: Iterable[Any] = (), *, now: float = 0.0
) -> list[dict[str, Any]]:
    """The results about the policy objects: a pass per RunPolicy and Profile
    (cluster-scoped objects in the CRD form), a warn per lint warning (``PolicyIssue``:
    file, line, key, message)."""
    when = timestamp(now)
    results: list[dict[str, Any]] = []

    def result(kind: str, name: str, outcome: str, message: str, **extra: Any) -> None:
        results.append(
            {
                "policy": name if kind == "RunPolicy" else policy.first.name,
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

    for run_policy in policy.run_policies:
        result("RunPolicy", run_policy.name, "pass", f"loaded (digest {policy.digest})")
    for name in policy.profile_names():
        result("Profile", name, "pass", "loaded")
    for issue in warnings:
        where = issue.file if issue.line is None else f"{issue.file}:{issue.line}"
        key = f"{issue.key}: " if issue.key else ""
        result(
            "RunPolicy",
            policy.first.name,
            "warn",
            f"{key}{issue.message}",
            properties={"file": where, **({"key": issue.key} if issue.key else {})},
        )
        results[-1].pop("resources")  # about a file, whichever document it is in
    return results


class Part(NamedTuple):
    """One namespaced report's content: its namespace, RunPolicy, part and results."""

    namespace: str
    policy: str
    number: int
    results: list[dict[str, Any]]


class ReportBook:
    """Findings by namespace and RunPolicy, for reports: they list every run, passes too
    (a resource without a result reads as "not audited"), so passes are kept here, as
    findings (a few hundred bytes each), never as objects."""

    def __init__(self, now: float = 0.0) -> None:
        self.findings: dict[tuple[str, str], list[Finding]] = defaultdict(list)
        self.timestamp = timestamp(now)  # every result's: when the audit ran

    def add(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.findings[f.namespace, f.policy].append(f)

    def parts(self, per_report: int = RESULTS_PER_REPORT) -> Iterator[Part]:
        """The results per namespace and RunPolicy, in parts of at most ``per_report``,
        each built only when asked for."""
        for namespace, policy in sorted(self.findings):
            number, results = 1, list[dict[str, Any]]()
            for f in self.findings[namespace, policy]:
                for result in run_results(f, self.timestamp):
                    if len(results) == per_report:
                        yield Part(namespace, policy, number, results)
                        number, results = number + 1, list[dict[str, Any]]()
                    results.append(result)
            yield Part(namespace, policy, number, results)

    def reports(
        self, form: ReportFormat, per_report: int = RESULTS_PER_REPORT
    ) -> Iterator[dict[str, Any]]:
        """A report of ``form`` per namespace and RunPolicy (and part)."""
        for part in self.parts(per_report):
            yield form.report(part.policy, part.namespace, part.number, part.results)


def to_reports(
    form: ReportFormat,
    findings: Iterable[Finding],
    per_report: int = RESULTS_PER_REPORT,
    *,
    now: float = 0.0,
) -> list[dict[str, Any]]:
    """The reports of ``findings`` in ``form``: one per namespace and RunPolicy (and part)."""
    book = ReportBook(now)
    book.add(findings)
    return list(book.reports(form, per_report))
