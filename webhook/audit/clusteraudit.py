"""``runguard audit``: judge the objects already in the cluster against the policy.

No I/O of its own. ``judged_pages`` pages through each listing with a ``fetch``
function given by the caller (one list request: the raw JSON body of one page), judges
every page as it arrives and keeps findings, never objects: memory stays flat however
many objects the cluster holds. Pods are selected server-side by the policy's selector
(the LabelSelector the webhook's ``objectSelector`` is rendered from; with several
RunPolicies, the requirements all their selectors share); pod
controllers carry the run labels in their template only, so every one is listed and the
engine picks the runs. Excluded namespaces are left out server-side for every kind.

Findings render as table rows or JSON rows (both written as they come), and as
PolicyReports (``webhook.audit.policyreport``).

A run that runguard admitted (it carries runguard's RunPolicy label) but that the
current policy would still change is policy drift (the policy was edited since): its
results are ``warn``, category ``Policy drift``, severity ``low``, never a bypass.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TextIO

import orjson

from webhook.engine import Decision, Violation, scope, validate
from webhook.engine.context import NO_CONTEXT, Context
from webhook.engine.rule import Declarations
from webhook.policy.kube import LabelSelector
from webhook.policy.model import Policy

RULES = Declarations(__name__)

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
    chosen = (
        scope.choose(policy, pod_labels(obj), decision.namespace)
        if len(policy.run_policies) > 1
        else None
    )
    # Interned: thousands of findings share a handful of these strings.
    return Finding(
        kind=sys.intern(decision.kind),
        namespace=sys.intern(decision.namespace),
        name=decision.name,
        api_version=sys.intern(str(obj.get("apiVersion", ""))),
        uid=str(meta.get("uid", "")),
        policy=sys.intern((chosen or policy.first).name),
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
    first, *others = (p.selector for p in policy.run_policies)
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
    excluded = frozenset.intersection(*(p.exclude_namespaces for p in policy.run_policies))
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
        namespace in p.exclude_namespaces for p in policy.run_policies
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
