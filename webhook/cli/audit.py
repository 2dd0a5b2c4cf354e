"""``runguard audit``: judge the Pods and pod controllers already in the cluster.

The shell around ``webhook.audit.clusteraudit``: the cluster read one list request per
page (``webhook.cli.cluster``), progress on stderr when it is a terminal, and
``--write``: the reports server-side applied (``webhook.cli.audit_write``), one per
namespace and RunPolicy (and part), and one about the policy objects, as wgpolicyk8s.io
PolicyReports, OpenReports or both. ``--rbac`` is ``webhook.cli.audit_rbac``'s (its
reports in the same formats, chosen by the same ``--reports``), ``--outage``
``webhook.cli.audit_outage``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from typing import Any, TextIO

from webhook.audit.clusteraudit import (
    LISTINGS,
    PAGE_SIZE,
    JsonRowsWriter,
    Page,
    TableWriter,
    judged_pages,
)
from webhook.audit.liveview import WHATIF_KINDS, group_resource, read_view
from webhook.audit.reportbook import RESULTS_PER_REPORT, ReportBook, policy_results
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.cli.audit_rbac import run_rbac
from webhook.cli.audit_write import (
    FORMATS,
    crds_checked,
    report_formats,
    served_formats,
    write_cluster_report,
    write_reports,
)
from webhook.cli.cluster import (
    Progress,
    Session,
    dump_reports,
    kube_fetch,
    on_cluster,
    say,
)
from webhook.engine.context import Context
from webhook.policy.model import Policy

LISTS = LISTINGS  # (kind, apiVersion, ...) per kind listed: the audit ClusterRole grants these
# What is read beside the runs (``read_view``): (group, resource), listed too.
VIEW_LISTS = tuple(group_resource(kind) for kind in WHATIF_KINDS)


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
        choices=("table", "json", *FORMATS, "summary"),
        default="table",
        help="a row per run (table, json), the reports (policyreport: wgpolicyk8s.io's "
        "PolicyReports, openreports: OpenReports' Reports), or counts per namespace; with "
        "--rbac, a row per finding (table, json) or its reports (policyreport, openreports)",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help="server-side apply the reports (a namespaced one per namespace and RunPolicy, "
        "a cluster-scoped one about the policy objects; with --rbac, runguard-rbac: one per "
        "run namespace and a cluster-scoped one) to the cluster",
    )
    p.add_argument(
        "--reports",
        type=report_formats,
        metavar="FORMATS",
        help="what --write writes, with or without --rbac: policyreport "
        "(wgpolicyk8s.io/v1alpha2), openreports (openreports.io/v1alpha1) or both, "
        "separated by a comma (default: each the cluster serves the CRDs of)",
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
        help=f"results per report before another part starts (default {RESULTS_PER_REPORT})",
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
        "bindings. Exit 0 none, 1 some, 2 error; with --write, 0 once every report is "
        "stored.",
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
    from webhook.policy.lint import lint

    if args.reports and not args.write:
        print("runguard audit: --reports goes with --write", file=sys.stderr)
        return EXIT_BAD_INPUT
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
    now = time.time()

    def work(session: Session) -> tuple[Outcome, list[dict[str, Any]]]:
        api_client = session.api_client
        outcome = _audit(api_client, session.policy, args, now)
        about_policy = policy_results(session.policy, lint(session.directory).warnings, now=now)
        if args.write:
            session.doing = "read which report CRDs the cluster serves"
            for form in served_formats(api_client, args.reports):
                session.doing = f"write {form.kind}s"
                with crds_checked(form):
                    write_reports(api_client, form, outcome.book, args.results_per_report)
                    session.doing = f"write the {form.cluster_kind}"
                    write_cluster_report(api_client, form, form.cluster_report(about_policy))
        return outcome, about_policy

    try:
        done = on_cluster(args, "audit", work, policy=policy, doing="list objects")
        if done is None:
            return EXIT_BAD_INPUT
        outcome, about_policy = done
        if args.output in FORMATS:
            form = FORMATS[args.output]
            reports = outcome.book.reports(form, args.results_per_report)
            dump_reports([form.cluster_report(about_policy), *reports], sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    if args.write:
        return EXIT_OK
    return EXIT_DENIED if outcome.counts["fail"] + outcome.counts["warn"] else EXIT_OK


# --- listing ---------------------------------------------------------------------------


class Outcome:
    """What the listing leaves: counts per result and per namespace, and the findings
    reports need (only when they are asked for)."""

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
    outcome = Outcome(keep_findings=args.write or args.output in FORMATS, now=now)
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
