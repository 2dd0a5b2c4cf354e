"""``runguard audit``: judge the Pods and pod controllers already in the cluster.

The shell around ``webhook.audit.clusteraudit``: the cluster read one list request per
page (``webhook.cli.cluster``), progress on stderr when it is a terminal, and
``--write``: the PolicyReports server-side applied, one per namespace and RunPolicy (and
part), and the ClusterPolicyReport about the policy objects. ``--rbac`` is
``webhook.cli.audit_rbac``'s, ``--outage`` ``webhook.cli.audit_outage``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any, TextIO

from webhook.audit.clusteraudit import (
    LISTINGS,
    PAGE_SIZE,
    AuditError,
    JsonRowsWriter,
    Page,
    TableWriter,
    judged_pages,
)
from webhook.audit.liveview import WHATIF_KINDS, group_resource, read_view
from webhook.audit.policyreport import (
    CLUSTER_REPORT_PLURAL,
    REPORT_GROUP,
    REPORT_PLURAL,
    REPORT_VERSION,
    RESULTS_PER_REPORT,
    ReportBook,
    cluster_policy_report,
    policy_report,
    report_name,
)
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.cli.audit_rbac import run_rbac
from webhook.cli.cluster import (
    REQUEST_TIMEOUT,
    SERVER_SIDE_APPLY,
    Progress,
    config_reason,
    connect,
    dump_reports,
    failure_reason,
    kube_fetch,
    policy_from_objects,
    release,
    say,
)
from webhook.engine.context import Context
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy

LISTS = LISTINGS  # (kind, apiVersion, ...) per kind listed: the audit ClusterRole grants these
# What is read beside the runs (``read_view``): (group, resource), listed too.
VIEW_LISTS = tuple(group_resource(kind) for kind in WHATIF_KINDS)
# What --write does to policyreports (server-side apply: create or patch; get to find
# parts no longer needed): exactly what the audit CronJob's ClusterRole grants.
REPORT_VERBS = ("get", "create", "patch")
CLUSTER_REPORT_VERBS = ("create", "patch")  # one ClusterPolicyReport, applied whole
MAX_PARTS = 10_000  # PolicyReport parts probed per namespace when emptying stale ones


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "audit",
        help="report what already in the cluster violates the policy",
        description="Page through Pods (selected server-side by the policy's selector), "
        "Jobs, CronJobs, Deployments, StatefulSets and DaemonSets and judge the runs among "
        "them (controllers by their pod template after mutation). Exit 0 all compliant, "
        "1 violations found, 2 error; with --write, 0 once every report is stored.",
    )
    p.add_argument("-p", "--policy", default="policies", help="policy directory")
    p.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "policyreport", "summary"),
        default="table",
        help="a row per run (table, json), the PolicyReports, or counts per namespace",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help="server-side apply the PolicyReports and the ClusterPolicyReport "
        "(wgpolicyk8s.io/v1alpha2) to the cluster",
    )
    p.add_argument(
        "--page-size",
        type=_positive,
        default=PAGE_SIZE,
        metavar="N",
        help=f"objects per list request (default {PAGE_SIZE})",
    )
    p.add_argument(
        "--results-per-report",
        type=_positive,
        default=RESULTS_PER_REPORT,
        metavar="N",
        help=f"results per PolicyReport before another part starts (default {RESULTS_PER_REPORT})",
    )
    p.add_argument(
        "--policy-objects",
        action="store_true",
        help="judge with the cluster's RunPolicy, Platform and Profile objects (what runguard "
        "serves with --policy-objects) instead of the files of -p",
    )
    p.add_argument(
        "--outage",
        action="store_true",
        help="say what holds while runguard is unreachable: whether runs fail closed or "
        "start unmutated (the available mode, and what it gives up), whether the floor is "
        "the policy's, the rules it carries and those only runguard judges (the cluster's "
        "admission objects, or --cluster-state files); exit 1 for the available mode "
        "without the policy's floor",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    rbac = p.add_argument_group(
        "--rbac",
        "Who holds, in the run namespaces, verbs that reach the platform's objects without "
        "any admission request (reading Secrets, changing platform-named ConfigMaps and "
        "Secrets, nodes/proxy, tokens, impersonation, exposing Services; connections into "
        "Pods when the shells webhook is off), through Roles, ClusterRoles and their "
        "bindings. Exit 0 none, 1 some, 2 error.",
    )
    rbac.add_argument(
        "--rbac", action="store_true", help="report RBAC's doors instead of judging runs"
    )
    rbac.add_argument(
        "--cluster-state",
        action="append",
        metavar="FILE",
        help="read the namespaces, roles and bindings from this file (kubectl get "
        "namespaces,roles,rolebindings,clusterroles,clusterrolebindings -A -o yaml; "
        "repeatable) instead of the cluster",
    )
    rbac.add_argument(
        "--shells",
        choices=("on", "off"),
        help="whether runguard's shells webhook judges connections into Pods (default: "
        "whether its ValidatingWebhookConfiguration is in the cluster, or in the files)",
    )
    rbac.add_argument(
        "--include-expected",
        action="store_true",
        help="also list cluster admins, Kubernetes' components and the platform's identities",
    )
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be 1 or more")
    return value


def run(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from webhook.policy.lint import lint

    if args.rbac:
        return run_rbac(args)
    if args.outage:
        from webhook.cli.audit_outage import run_outage

        return run_outage(args)
    if args.cluster_state or args.shells or args.include_expected:
        print("runguard audit: --cluster-state, --shells and --include-expected go with "
              "--rbac", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    policy = None if args.policy_objects else load_policy_or_report(args.policy)
    if policy is None and not args.policy_objects:
        return EXIT_BAD_INPUT
    doing = "list objects"
    now = time.time()
    try:
        with connect(args) as api_client, tempfile.TemporaryDirectory() as scratch:
            directory = args.policy
            if args.policy_objects:
                doing, directory = "read the policy objects", scratch
                policy = policy_from_objects(api_client, scratch)
                if policy is None:
                    return EXIT_BAD_INPUT
                doing = "list objects"
            assert policy is not None
            outcome = _audit(api_client, policy, args, now)
            cluster_report = cluster_policy_report(policy, lint(directory).warnings, now=now)
            if args.write:
                doing = "write PolicyReports"
                _write_reports(api_client, outcome.book, args.results_per_report)
                doing = "write the ClusterPolicyReport"
                _write_cluster_report(api_client, cluster_report)
        if args.output == "policyreport":
            reports = outcome.book.reports(args.results_per_report)
            dump_reports([cluster_report, *reports], sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except ConfigException as exc:
        print(f"runguard audit: cannot {doing}: {config_reason(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ApiException, AuditError, HTTPError, OSError) as exc:
        reason = failure_reason(exc, writing=doing != "list objects")
        print(f"runguard audit: cannot {doing}: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.write:
        return EXIT_OK
    return EXIT_DENIED if outcome.counts["fail"] + outcome.counts["warn"] else EXIT_OK


# --- listing ---------------------------------------------------------------------------


class Outcome:
    """What the listing leaves: counts per result and per namespace, and the findings
    PolicyReports need (only when they are asked for)."""

    def __init__(self, keep_findings: bool, now: float = 0.0) -> None:
        self.counts: Counter[str] = Counter()
        self.by_namespace: dict[str, Counter[str]] = {}
        self.book = ReportBook(now)
        self.keep_findings = keep_findings
        self.pages = self.listed = 0

    def add(self, page: Page) -> None:
        self.pages += 1
        self.listed += page.listed
        for f in page.findings:
            self.counts[f.result] += 1
            self.by_namespace.setdefault(f.namespace, Counter())[f.result] += 1
        if self.keep_findings:
            self.book.add(page.findings)

    def describe(self) -> str:
        counts = self.counts
        return (
            f"{counts.total():,} runs ({counts['pass']:,} pass, {counts['fail']:,} fail, "
            f"{counts['warn']:,} warn) among {self.listed:,} objects listed in "
            f"{self.pages:,} pages"
        )


def _audit(api_client: Any, policy: Policy, args: argparse.Namespace, now: float) -> Outcome:
    out = sys.stdout
    writer: TableWriter | JsonRowsWriter | None = None
    if args.output == "table":
        writer = TableWriter(out)
    elif args.output == "json":
        writer = JsonRowsWriter(out)
    outcome = Outcome(keep_findings=args.write or args.output == "policyreport", now=now)
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    started = time.monotonic()
    state, left_out = read_view(api_client, WHATIF_KINDS)  # what profiles are judged by
    for line in left_out:
        say(progress, f"not read ({line}): the decisions that need it fail closed")
    pages = judged_pages(
        kube_fetch(api_client),
        policy,
        namespace=args.namespace,
        page_size=args.page_size,
        notice=lambda message: say(progress, message),
        context=Context(state=state),
    )
    try:
        for page in pages:
            outcome.add(page)
            if writer is not None:
                writer.write(page.findings)
            if progress is not None:
                progress.show(
                    f"{page.listing.resource} page {page.number}: {outcome.listed:,} listed, "
                    f"{outcome.counts.total():,} runs ({outcome.counts['fail']:,} fail, "
                    f"{outcome.counts['warn']:,} warn)"
                )
    finally:
        if progress is not None:
            progress.clear()
    if writer is not None:
        writer.close()
    elif args.output == "summary":
        _summary(outcome, out)
    say(None, f"{outcome.describe()}, {time.monotonic() - started:.1f}s")
    return outcome


def _summary(outcome: Outcome, out: TextIO) -> None:
    rows: list[tuple[str, ...]] = [("NAMESPACE", "PASS", "FAIL", "WARN")]
    for namespace, counts in sorted(outcome.by_namespace.items()):
        rows.append((namespace, *(str(counts[r]) for r in ("pass", "fail", "warn"))))
    rows.append(("TOTAL", *(str(outcome.counts[r]) for r in ("pass", "fail", "warn"))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


# --- PolicyReports ---------------------------------------------------------------------


def _write_reports(api_client: Any, book: ReportBook, per_report: int) -> None:
    """Server-side apply each report (created, or replaced whole: ``results`` is an
    atomic list), then empty the parts a namespace no longer needs. Needs ``create``,
    ``patch`` and ``get`` on policyreports, nothing else (no list: a namespace left
    without runs keeps its last report; see docs/audit.md)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    parts: Counter[tuple[str, str]] = Counter()  # by namespace and RunPolicy

    def apply(report: dict[str, Any]) -> None:
        meta = report["metadata"]
        response: Any = api.patch_namespaced_custom_object(
            REPORT_GROUP, REPORT_VERSION, meta["namespace"], REPORT_PLURAL, meta["name"], report,
            **SERVER_SIDE_APPLY,
        )  # fmt: skip
        release(response)

    def exists(namespace: str, name: str) -> bool:
        try:
            response: Any = api.get_namespaced_custom_object(
                REPORT_GROUP,
                REPORT_VERSION,
                namespace,
                REPORT_PLURAL,
                name,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        release(response)
        return True

    emptied = 0
    try:
        for report in book.reports(per_report):
            apply(report)
            meta = report["metadata"]
            parts[meta["namespace"], meta["labels"][POLICY_LABEL]] += 1
            if progress is not None:
                progress.show(f"PolicyReports written: {parts.total():,}")
        for (namespace, policy), count in parts.items():
            for part in range(count + 1, count + 1 + MAX_PARTS):
                if not exists(namespace, report_name(policy, part)):
                    break
                apply(policy_report(policy, namespace, part, []))
                emptied += 1
    finally:
        if progress is not None:
            progress.clear()
    say(
        None,
        f"{parts.total():,} PolicyReports written in {len({ns for ns, _ in parts}):,} "
        "namespaces" + (f", {emptied:,} parts no longer needed emptied" if emptied else ""),
    )


def _write_cluster_report(api_client: Any, report: dict[str, Any]) -> None:
    """Server-side apply the ClusterPolicyReport (one object, replaced whole)."""
    from kubernetes import client

    response: Any = client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        REPORT_GROUP, REPORT_VERSION, CLUSTER_REPORT_PLURAL, report["metadata"]["name"], report,
        **SERVER_SIDE_APPLY,
    )  # fmt: skip
    release(response)
    say(None, f"ClusterPolicyReport {report['metadata']['name']} written")
