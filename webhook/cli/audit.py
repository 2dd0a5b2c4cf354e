"""``runguard audit``: judge the Pods and pod controllers already in the cluster.

The shell around ``webhook.audit.clusteraudit``: the ``kubernetes`` client's connection, one
list request per page (raw JSON, ``_preload_content=False``: no typed-model round
trip), progress on stderr when it is a terminal, and ``--write``: the PolicyReports
server-side applied, one per namespace and RunPolicy (and part), and the
ClusterPolicyReport about the policy objects.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from webhook.audit.clusteraudit import (
    CLUSTER_REPORT_PLURAL,
    LISTINGS,
    PAGE_SIZE,
    REPORT_GROUP,
    REPORT_PLURAL,
    REPORT_VERSION,
    RESULTS_PER_REPORT,
    AuditError,
    ContinueExpired,
    Fetch,
    JsonRowsWriter,
    Listing,
    Page,
    ReportBook,
    TableWriter,
    cluster_policy_report,
    judged_pages,
    policy_report,
    report_name,
)
from webhook.audit.liveview import WHATIF_KINDS, group_resource, read_view
from webhook.audit.rbacreport import (
    RBAC_API,
    RbacReport,
    platform_of,
    rbac_policy_reports,
    rbac_report,
    shells_webhook_installed,
)
from webhook.audit.rbacreport import to_rows as rbac_rows
from webhook.audit.rbacreport import to_table as rbac_table
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.engine.context import Context
from webhook.install.manifests import SHELLS_CONFIGURATION_NAME
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy

LISTS = LISTINGS  # (kind, apiVersion, ...) per kind listed: the audit ClusterRole grants these
# What is read beside the runs (``read_view``): (group, resource), listed too.
VIEW_LISTS = tuple(group_resource(kind) for kind in WHATIF_KINDS)
# What --write does to policyreports (server-side apply: create or patch; get to find
# parts no longer needed): exactly what the audit CronJob's ClusterRole grants.
REPORT_VERBS = ("get", "create", "patch")
CLUSTER_REPORT_VERBS = ("create", "patch")  # one ClusterPolicyReport, applied whole
FIELD_MANAGER = "runguard-audit"
REQUEST_TIMEOUT = (10, 300)  # seconds: to connect, then to read one page or one write
# A report written whole by server-side apply, its answer read raw (``_done``).
SERVER_SIDE_APPLY: dict[str, Any] = {
    "field_manager": FIELD_MANAGER,
    "force": True,
    "_content_type": "application/apply-patch+yaml",
    "_preload_content": False,
    "_request_timeout": REQUEST_TIMEOUT,
}
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
        help="judge with the cluster's RunPolicy and Profile objects (what runguard serves "
        "with --policy-objects) instead of the files of -p",
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
        with _api_client(args) as api_client, tempfile.TemporaryDirectory() as scratch:
            directory = args.policy
            if args.policy_objects:
                doing, directory = "read the policy objects", scratch
                policy = _policy_from_objects(api_client, scratch)
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
            _dump_reports([cluster_report, *reports], sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except ConfigException as exc:
        print(f"runguard audit: cannot {doing}: {_config_reason(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ApiException, AuditError, HTTPError, OSError) as exc:
        reason = _reason(exc, writing=doing != "list objects")
        print(f"runguard audit: cannot {doing}: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.write:
        return EXIT_OK
    return EXIT_DENIED if outcome.counts["fail"] + outcome.counts["warn"] else EXIT_OK


def _api_client(args: argparse.Namespace) -> Any:
    from kubernetes import client, config

    if args.kubeconfig or not _in_cluster():
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=args.kubeconfig, context=args.context
        )
    else:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ


# --- listing ---------------------------------------------------------------------------


def kube_fetch(api_client: Any) -> Fetch:
    """One list request through the ``kubernetes`` client, its body left undecoded."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    apis: dict[str, Any] = {}

    def fetch(listing: Listing, namespace: str | None, query: Mapping[str, str]) -> bytes:
        api = apis.get(listing.api_class) or getattr(client, listing.api_class)(api_client)
        apis[listing.api_class] = api
        kwargs: dict[str, Any] = {
            "limit": int(query["limit"]),
            "_preload_content": False,
            "_request_timeout": REQUEST_TIMEOUT,
        }
        for key, arg in (
            ("continue", "_continue"),
            ("labelSelector", "label_selector"),
            ("fieldSelector", "field_selector"),
        ):
            if query.get(key):
                kwargs[arg] = query[key]
        try:
            if namespace:
                response = getattr(api, listing.list_namespaced)(namespace, **kwargs)
            else:
                response = getattr(api, listing.list_all)(**kwargs)
        except ApiException as exc:
            if exc.status == 410 and "continue" in query:
                raise ContinueExpired(str(exc.reason)) from exc
            raise
        try:
            return bytes(response.data)
        finally:
            response.release_conn()

    return fetch


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


def _mirror_policy_objects(api_client: Any, directory: str) -> None:
    """The cluster's RunPolicy and Profile objects as policy files in ``directory``."""
    from kubernetes import client

    from webhook.policy.crd import GROUP, MIRRORED, PLURALS, VERSION
    from webhook.policy.mirror.objects import mirror

    api: Any = client.CustomObjectsApi(api_client)
    items: list[dict[str, Any]] = []
    for kind in MIRRORED:
        plural = PLURALS[kind]
        listed: dict[str, Any] = api.list_cluster_custom_object(
            GROUP, VERSION, plural, _request_timeout=REQUEST_TIMEOUT
        )
        items += [{**item, "kind": kind} for item in listed.get("items") or ()]
    mirror(items, directory)


def _policy_from_objects(api_client: Any, scratch: str) -> Policy | None:
    """The policy the cluster's RunPolicy and Profile objects make (None: errors printed)."""
    _mirror_policy_objects(api_client, scratch)
    return load_policy_or_report(scratch)


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
        _say(progress, f"not read ({line}): the decisions that need it fail closed")
    pages = judged_pages(
        kube_fetch(api_client),
        policy,
        namespace=args.namespace,
        page_size=args.page_size,
        notice=lambda message: _say(progress, message),
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
    _say(None, f"{outcome.describe()}, {time.monotonic() - started:.1f}s")
    return outcome


def _summary(outcome: Outcome, out: TextIO) -> None:
    rows: list[tuple[str, ...]] = [("NAMESPACE", "PASS", "FAIL", "WARN")]
    for namespace, counts in sorted(outcome.by_namespace.items()):
        rows.append((namespace, *(str(counts[r]) for r in ("pass", "fail", "warn"))))
    rows.append(("TOTAL", *(str(outcome.counts[r]) for r in ("pass", "fail", "warn"))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


class Progress:
    """One line on a terminal, rewritten in place."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def show(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\r\x1b[Krunguard audit: {text} ({elapsed:.0f}s)")
        self.stream.flush()

    def clear(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


def _say(progress: Progress | None, message: str) -> None:
    """A line on stderr for the log, under the progress line when there is one."""
    if progress is not None:
        progress.clear()
    print(f"runguard audit: {message}", file=sys.stderr)


# --- PolicyReports ---------------------------------------------------------------------


def _dump_reports(reports: Iterable[dict[str, Any]], out: TextIO) -> None:
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: several times faster
    for i, report in enumerate(reports):
        if i:
            out.write("---\n")
        yaml.dump(report, out, Dumper=dumper, sort_keys=False)


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
        _done(response)

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
        _done(response)
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
    _say(
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
    _done(response)
    _say(None, f"ClusterPolicyReport {report['metadata']['name']} written")


def _done(response: Any) -> None:
    """Read what is left of an answer (its connection goes back to the pool, where a
    next request would otherwise read these bytes first) and release it."""
    response.drain_conn()
    response.release_conn()


NO_REPORT_CRD = (
    f"404: the cluster serves no {REPORT_GROUP}/{REPORT_VERSION} PolicyReports or "
    "ClusterPolicyReports: install their CRDs with `kubectl apply -k "
    "manifests/policyreport-crd` (or keep the ones Kyverno or Policy Reporter install), "
    "or run without --write"
)


def _reason(exc: BaseException, writing: bool = False) -> str:
    """An exception in a line: for the apiserver's answers, its Status message, and what
    to do when the answer is that the report CRDs are missing."""
    body = getattr(exc, "body", None)
    status = getattr(exc, "status", None)
    message = None
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
    if (
        writing
        and status == 404
        and (message is None or "could not find the requested resource" in message)
    ):
        # A group or resource the apiserver does not serve answers a bare 404 Not Found.
        return NO_REPORT_CRD
    if message:
        return f"{status}: {message}"
    text = str(getattr(exc, "reason", None) or exc)
    return text if len(text) <= 300 else text[:300] + "..."


def _config_reason(exc: BaseException) -> str:
    """A kubeconfig problem in a line that says where runguard looked and what to do."""
    text = str(exc)
    if "No configuration found" in text or "Invalid kube-config file" in text:
        return (
            "no kubeconfig found: set KUBECONFIG or pass --kubeconfig FILE (and --context "
            "NAME to pick a context); inside a Pod, runguard uses its ServiceAccount's token"
        )
    return f"{text} (check --kubeconfig, KUBECONFIG and --context)"


# --- --rbac ----------------------------------------------------------------------------

# What --rbac lists (its ClusterRole: list on each): kind, API class, list call.
RBAC_LISTS = (
    ("Namespace", "v1", "CoreV1Api", "list_namespace"),
    ("Role", RBAC_API, "RbacAuthorizationV1Api", "list_role_for_all_namespaces"),
    ("RoleBinding", RBAC_API, "RbacAuthorizationV1Api", "list_role_binding_for_all_namespaces"),
    ("ClusterRole", RBAC_API, "RbacAuthorizationV1Api", "list_cluster_role"),
    ("ClusterRoleBinding", RBAC_API, "RbacAuthorizationV1Api", "list_cluster_role_binding"),
)


def run_rbac(args: argparse.Namespace) -> int:
    """``runguard audit --rbac``: read the objects (files or cluster), report, write."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from webhook.clusterstate.model import ClusterStateError
    from webhook.inputs.documents import InputError, read_objects
    from webhook.serving.inputlimits import CLUSTER_STATE_FILES

    if args.output == "summary" or (args.cluster_state and (args.write or args.policy_objects)):
        print(
            "runguard audit: --rbac prints a table, json or policyreport; --write and "
            "--policy-objects read the cluster, not --cluster-state",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    policy = None if args.policy_objects else load_policy_or_report(args.policy)
    if policy is None and not args.policy_objects:
        return EXIT_BAD_INPUT
    doing = "read the roles and bindings"
    try:
        if args.cluster_state:
            objects = [o for f in args.cluster_state for o in read_objects(f, CLUSTER_STATE_FILES)]
            shells = args.shells == "on" if args.shells else shells_webhook_installed(objects)
            assert policy is not None, "--policy-objects reads the cluster"
            report = rbac_report(
                objects, platform_of(policy), shells=shells, namespace=args.namespace
            )
            reports = _rbac_output(report, args)
        else:
            with _api_client(args) as api_client, tempfile.TemporaryDirectory() as scratch:
                if args.policy_objects:
                    doing = "read the policy objects"
                    policy = _policy_from_objects(api_client, scratch)
                    if policy is None:
                        return EXIT_BAD_INPUT
                    doing = "read the roles and bindings"
                assert policy is not None
                objects = _rbac_objects(api_client)
                shells = args.shells == "on" if args.shells else _shells_on(api_client)
                report = rbac_report(
                    objects, platform_of(policy), shells=shells, namespace=args.namespace
                )
                reports = _rbac_output(report, args)
                if args.write:
                    doing = "write PolicyReports"
                    _write_rbac_reports(api_client, reports)
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except (InputError, ClusterStateError) as exc:
        print(f"runguard audit: --cluster-state: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConfigException as exc:
        print(f"runguard audit: cannot {doing}: {_config_reason(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ApiException, AuditError, HTTPError, OSError) as exc:
        reason = _reason(exc, writing=doing == "write PolicyReports")
        print(f"runguard audit: cannot {doing}: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    found, shown = len(report.unexpected()), len(report.shown(args.include_expected))
    hidden = len(report.findings) - shown
    _say(
        None,
        f"{found:,} findings in {len(report.namespaces):,} run namespaces and cluster-wide"
        + (f" ({hidden:,} expected, not shown)" if hidden else "")
        + f"; the shells webhook is {'on' if report.shells else 'off'}",
    )  # fmt: skip
    if args.write:
        return EXIT_OK
    return EXIT_DENIED if found else EXIT_OK


def _rbac_output(report: RbacReport, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Print the report as asked; the PolicyReports (for --write) in any case."""
    reports = rbac_policy_reports(report, include_expected=args.include_expected, now=time.time())
    shown = report.shown(args.include_expected)
    if args.output == "json":
        json.dump(rbac_rows(shown), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "policyreport":
        _dump_reports(reports, sys.stdout)
    elif not args.write or shown:
        sys.stdout.write(rbac_table(shown) + "\n")
    return reports


def _rbac_objects(api_client: Any) -> list[dict[str, Any]]:
    """Every Namespace, Role, RoleBinding, ClusterRole and ClusterRoleBinding."""
    import orjson
    from kubernetes import client

    objects: list[dict[str, Any]] = []
    for kind, api_version, api_class, call in RBAC_LISTS:
        api = getattr(client, api_class)(api_client)
        response = getattr(api, call)(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        try:
            listed = orjson.loads(response.data)
        finally:
            response.release_conn()
        if not isinstance(listed, dict) or not isinstance(listed.get("items") or [], list):
            raise AuditError(f"the list of {kind}s is not a {kind}List")
        objects += [
            {**item, "kind": kind, "apiVersion": api_version}
            for item in listed.get("items") or ()
            if isinstance(item, dict)
        ]
    return objects


def _shells_on(api_client: Any) -> bool:
    """Whether runguard's shells webhook configuration is in the cluster."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api: Any = client.AdmissionregistrationV1Api(api_client)
    try:
        api.read_validating_webhook_configuration(
            SHELLS_CONFIGURATION_NAME, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        ).release_conn()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _write_rbac_reports(api_client: Any, reports: list[dict[str, Any]]) -> None:
    """Server-side apply the ClusterPolicyReport and each run namespace's PolicyReport
    (one each, replaced whole: an empty one says nothing is found there any more)."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    for report in reports:
        meta = report["metadata"]
        if report["kind"] == "ClusterPolicyReport":
            response: Any = api.patch_cluster_custom_object(
                REPORT_GROUP, REPORT_VERSION, CLUSTER_REPORT_PLURAL, meta["name"], report,
                **SERVER_SIDE_APPLY,
            )  # fmt: skip
        else:
            response = api.patch_namespaced_custom_object(
                REPORT_GROUP, REPORT_VERSION, meta["namespace"], REPORT_PLURAL, meta["name"],
                report, **SERVER_SIDE_APPLY,
            )  # fmt: skip
        _done(response)
    _say(None, f"{len(reports):,} RBAC PolicyReports written (one ClusterPolicyReport)")
