"""``runguard audit``: judge the objects already in the cluster against the policy.

No I/O of its own. ``judged_pages`` pages through each listing with a ``fetch``
function given by the caller (one list request: the raw JSON body of one page), judges
every page as it arrives and keeps findings, never objects: memory stays flat however
many objects the cluster holds. Pods are selected server-side by the policy's selector
(the LabelSelector the webhook's ``objectSelector`` is rendered from; with several
RunPolicies, the requirements all their selectors share); pod
controllers carry the run labels in their template only, so every one is listed and the
engine picks the runs. Excluded namespaces are left out server-side for every kind.

Findings render as table rows, JSON rows (both written as they come) or
``wgpolicyk8s.io/v1alpha2`` PolicyReports (the format Kyverno and Gatekeeper's reporters
publish, read by Policy Reporter and similar tools): one per namespace and RunPolicy,
split in parts of at most ``RESULTS_PER_REPORT`` results so that none nears etcd's
1.5 MiB object limit, whose ``scope`` is the Namespace; and one ClusterPolicyReport for
what is cluster-scoped, the policy objects themselves (each RunPolicy and Profile, and
every lint warning). Every result has a ``timestamp`` (when the audit ran), a
``severity`` and a ``category`` (by the rule's concern) and ``source: runguard``.

A run that runguard admitted (it carries runguard's RunPolicy label) but that the
current policy would still change is policy drift (the policy was edited since): its
results are ``warn``, category ``Policy drift``, severity ``low``, never a bypass.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TextIO

import orjson

from webhook.engine import Decision, Violation, registry, validate
from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.rule import CONCERNS, Declarations
from webhook.keys import POLICY_LABEL
from webhook.policy.kube import LabelSelector
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
PAGE_SIZE = 500  # kubectl's default --chunk-size
MAX_RESTARTS = 3  # expired continue tokens in a row before a listing gives up
MAX_PAGES = 200_000  # per pass of one listing: a bound far above any real cluster


class Listing(NamedTuple):
    """One kind ``runguard audit`` lists, and the ``kubernetes`` client calls that list it."""

    kind: str
    api_version: str
    api_class: str
    list_all: str
    list_namespaced: str

    @property
    def resource(self) -> str:
        return self.kind.lower() + "s"


LISTINGS = (
    Listing("Pod", "v1", "CoreV1Api", "list_pod_for_all_namespaces", "list_namespaced_pod"),
    Listing("Job", "batch/v1", "BatchV1Api", "list_job_for_all_namespaces", "list_namespaced_job"),
    Listing(
        "CronJob",
        "batch/v1",
        "BatchV1Api",
        "list_cron_job_for_all_namespaces",
        "list_namespaced_cron_job",
    ),
    Listing(
        "Deployment",
        "apps/v1",
        "AppsV1Api",
        "list_deployment_for_all_namespaces",
        "list_namespaced_deployment",
    ),
    Listing(
        "StatefulSet",
        "apps/v1",
        "AppsV1Api",
        "list_stateful_set_for_all_namespaces",
        "list_namespaced_stateful_set",
    ),
    Listing(
        "DaemonSet",
        "apps/v1",
        "AppsV1Api",
        "list_daemon_set_for_all_namespaces",
        "list_namespaced_daemon_set",
    ),
)

# One list request: (listing, namespace or None for all, query) -> the response body.
# Query keys are the API's: limit, continue, labelSelector, fieldSelector.
Fetch = Callable[[Listing, str | None, Mapping[str, str]], bytes]


class AuditError(Exception):
    """The cluster's objects could not be listed completely; the message says why."""


class ContinueExpired(Exception):
    """The apiserver answered 410 Gone to a continue token (the snapshot it points to
    was compacted away): the listing must start again."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One run's verdict under the policy: what reports need, not the object."""

    kind: str
    namespace: str
    name: str
    api_version: str
    uid: str
    policy: str  # the RunPolicy that judged it (the first by name whose selector matches)
    profile: str | None
    result: str  # pass | fail | warn
    violations: tuple[Violation, ...]


def finding(obj: Any, decision: Decision, policy: Policy) -> Finding:
    obj = obj if isinstance(obj, dict) else {}
    meta = _mapping(obj.get("metadata"))
    violations = tuple(decision.violations)
    denied = decision.enforcement == "Deny" and any(not v.drift for v in violations)
    result = "pass" if not violations else "fail" if denied else "warn"
    chosen = policy.choose(pod_labels(obj), decision.namespace) if policy.alternatives else None
    # Interned: thousands of findings share a handful of these strings.
    return Finding(
        kind=sys.intern(decision.kind),
        namespace=sys.intern(decision.namespace),
        name=decision.name,
        api_version=sys.intern(str(obj.get("apiVersion", ""))),
        uid=str(meta.get("uid", "")),
        policy=sys.intern((chosen or policy).name),
        profile=sys.intern(decision.profile) if decision.profile else None,
        result=result,
        violations=violations,
    )


# Where each listed kind keeps the pod metadata its run labels are in.
POD_METADATA = {
    "Pod": ("metadata",),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "metadata"),
}


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    node: Any = obj
    for key in POD_METADATA.get(str(obj.get("kind")), ("spec", "template", "metadata")):
        node = _mapping(node).get(key)
    labels = _mapping(_mapping(node).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(v, str)}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def judge(
    objects: Iterable[Any], policy: Policy, context: Context = NO_CONTEXT
) -> Iterator[Finding]:
    """Findings for the runs (Pods and pod controllers) among ``objects``; others are
    skipped. ``context.state``: the cluster view read beside them (the Namespaces a
    profile's ``namespaceSelector`` reads, the classes a profile names)."""
    for obj in objects:
        decision = validate(obj, policy, admitted=True, context=context)
        if decision.applies:
            yield finding(obj, decision, policy)


def audit(objects: Iterable[Any], policy: Policy) -> list[Finding]:
    """Every finding at once, for objects already in memory (``runguard audit`` pages)."""
    return list(judge(objects, policy))


# --- listing: server-side selection and paging ---------------------------------------


def label_selector(selector: LabelSelector) -> str:
    """``selector`` in the API's ``labelSelector`` syntax (what kubectl ``-l`` takes);
    empty for the empty selector, which matches everything, as for ``objectSelector``."""
    terms = [f"{key}={value}" for key, value in selector.match_labels.items()]
    for expr in selector.match_expressions:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[op]
        )
    return ",".join(terms)


def shared_selector(policy: Policy) -> LabelSelector:
    """The requirements every RunPolicy's selector makes: a Pod any of them matches
    matches this one too (one ``labelSelector`` cannot say "this or that"), so the server
    can select on it and the engine picks the RunPolicy. With one RunPolicy, its selector."""
    first, *others = (p.selector for p in policy.run_policies())
    labels = {
        key: value
        for key, value in first.match_labels.items()
        if all(other.match_labels.get(key) == value for other in others)
    }
    expressions = [
        expr
        for expr in first.match_expressions
        if all(_requirement(expr) in map(_requirement, o.match_expressions) for o in others)
    ]
    return first.model_copy(update={"match_labels": labels, "match_expressions": expressions})


def _requirement(expr: Mapping[str, Any]) -> tuple[str, str, frozenset[str]]:
    return expr["key"], expr["operator"], frozenset(expr.get("values") or ())


def list_query(listing: Listing, policy: Policy, page_size: int) -> dict[str, str]:
    """The query of every page of ``listing``: what the server can select for the policy
    (Pods by labels; every kind by namespace, leaving out those every RunPolicy excludes)."""
    query = {"limit": str(page_size)}
    if listing.kind == "Pod" and (labels := label_selector(shared_selector(policy))):
        query["labelSelector"] = labels
    excluded = frozenset.intersection(*(p.exclude_namespaces for p in policy.run_policies()))
    if excluded:
        query["fieldSelector"] = ",".join(f"metadata.namespace!={ns}" for ns in sorted(excluded))
    return query


@dataclass(frozen=True)
class Page:
    """One page of a listing, judged: how many objects it held and the runs among them."""

    listing: Listing
    number: int  # pages of this listing so far, restarts included
    listed: int
    findings: list[Finding]


def _key(obj: Any) -> str:
    """Where the apiserver keeps ``obj`` (namespace/name): lists and their continue
    tokens follow this order."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def decode_page(listing: Listing, body: bytes) -> tuple[list[Any], str]:
    """The items of a raw list response (with their kind and apiVersion, which the API
    leaves out of list items) and its continue token."""
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise AuditError(f"the list of {listing.resource} is not JSON: {exc}") from None
    if not isinstance(page, dict) or not isinstance(page.get("items") or [], list):
        raise AuditError(f"the list of {listing.resource} is not a {listing.kind}List")
    items: list[Any] = page.get("items") or []
    for item in items:
        if isinstance(item, dict):
            item["kind"], item["apiVersion"] = listing.kind, listing.api_version
    token = (page.get("metadata") or {}).get("continue") or ""
    return items, str(token)


def judged_pages(
    fetch: Fetch,
    policy: Policy,
    *,
    namespace: str | None = None,
    page_size: int = PAGE_SIZE,
    listings: Iterable[Listing] = LISTINGS,
    notice: Callable[[str], None] = lambda message: None,
    context: Context = NO_CONTEXT,
) -> Iterator[Page]:
    """Every listing, page by page, each page judged as it arrives (``listed_pages``)."""
    for listing, number, items in listed_pages(
        fetch, policy, namespace=namespace, page_size=page_size, listings=listings, notice=notice
    ):
        yield Page(listing, number, len(items), list(judge(items, policy, context)))


def listed_pages(
    fetch: Fetch,
    policy: Policy,
    *,
    namespace: str | None = None,
    page_size: int = PAGE_SIZE,
    listings: Iterable[Listing] = LISTINGS,
    notice: Callable[[str], None] = lambda message: None,
) -> Iterator[tuple[Listing, int, list[Any]]]:
    """Every listing, page by page: (listing, pages so far, the objects not seen before).

    A continue token that expires (410 Gone: the listing outlived the apiserver's
    compaction window) restarts that listing from the start. Lists come in key order
    (namespace/name: the order continue tokens resume in), so the objects already seen
    are the ones up to the last key seen, and the new pass skips them: each object is
    given once.
    """
    if namespace is not None and all(
        namespace in p.exclude_namespaces for p in policy.run_policies()
    ):
        return
    for listing in listings:
        query = list_query(listing, policy, page_size)
        judged: str | None = None  # after a restart: every key up to this one was given
        number = 0
        for attempt in range(MAX_RESTARTS + 1):
            last, ordered = "", True
            try:
                for items in _pass(fetch, listing, namespace, query):
                    number += 1
                    fresh = []
                    for item in items:
                        key = _key(item)
                        ordered, last = ordered and key > last, max(last, key)
                        if judged is None or key > judged:
                            fresh.append(item)
                    yield listing, number, fresh
                break
            except ContinueExpired:
                if not ordered:
                    raise AuditError(
                        f"the list of {listing.resource} expired (410 Gone) and cannot be "
                        "resumed: the apiserver did not list it in key order"
                    ) from None
                if attempt == MAX_RESTARTS:
                    raise AuditError(
                        f"the list of {listing.resource} expired {attempt + 1} times in a "
                        "row (410 Gone): the apiserver compacts its history faster than "
                        "this listing can be read"
                    ) from None
                judged = last if judged is None else max(judged, last)
                notice(
                    f"the list of {listing.resource} expired after {number} page"
                    f"{'s' if number != 1 else ''} (410 Gone: "
                    f"its continue token is too old); listing {listing.resource} again from "
                    "the start, skipping what was already judged"
                )


def _pass(
    fetch: Fetch, listing: Listing, namespace: str | None, query: dict[str, str]
) -> Iterator[list[Any]]:
    """One pass through a listing: each page's items."""
    token = ""
    for _ in range(MAX_PAGES):
        items, token = decode_page(
            listing, fetch(listing, namespace, {**query, "continue": token} if token else query)
        )
        yield items
        if not token:
            return
    raise AuditError(f"the list of {listing.resource} has more than {MAX_PAGES} pages")


# --- rendering -------------------------------------------------------------------------


def to_rows(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    return [_row(f) for f in findings]


def _row(f: Finding) -> dict[str, Any]:
    return {
        "namespace": f.namespace,
        "kind": f.kind,
        "name": f.name,
        "result": f.result,
        "policy": f.policy,
        "profile": f.profile,
        "violations": [v.to_dict() for v in f.violations],
    }


class JsonRowsWriter:
    """A JSON array of rows written as findings come (the text ``json.dump(rows,
    indent=2)`` would write), so no row is held."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.rows = out, 0

    def write(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            row = json.dumps(_row(f), indent=2).replace("\n", "\n  ")
            self.out.write(("[\n  " if not self.rows else ",\n  ") + row)
            self.rows += 1

    def close(self) -> None:
        self.out.write("[]\n" if not self.rows else "\n]\n")


TABLE_HEADER = ("NAMESPACE", "KIND", "NAME", "RESULT", "VIOLATIONS")


class TableWriter:
    """The table, written as findings come: column widths are set by the first
    ``buffer`` rows (a later, longer cell pushes its own row out), so no more than that
    many rows are ever held."""

    def __init__(self, out: TextIO, buffer: int = 1000) -> None:
        self.out, self.buffer = out, buffer
        self.pending: list[tuple[str, ...]] | None = [TABLE_HEADER]
        self.widths: list[int] = []

    def write(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            rules = ",".join(dict.fromkeys(v.rule for v in f.violations)) or "-"
            row = (f.namespace, f.kind, f.name, f.result, rules)
            if self.pending is None:
                self._emit(row)
            else:
                self.pending.append(row)
                if len(self.pending) > self.buffer:
                    self._flush()

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self.pending is None:
            return
        rows, self.pending = self.pending, None
        self.widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for row in rows:
            self._emit(row)

    def _emit(self, row: tuple[str, ...]) -> None:
        cells = "  ".join(cell.ljust(self.widths[i]) for i, cell in enumerate(row[:4]))
        self.out.write(f"{cells}  {row[4]}\n")


def to_table(findings: Iterable[Finding]) -> str:
    import io

    out = io.StringIO()
    table = TableWriter(out, buffer=sys.maxsize)
    table.write(findings)
    table.close()
    return out.getvalue().rstrip("\n")


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
