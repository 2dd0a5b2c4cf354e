"""``runguard audit --rbac``: who holds, in the run namespaces, a door no admission
request is made for (``webhook.audit.rbacreport``), read from the cluster's namespaces,
Roles and bindings; as a table, JSON rows, or reports (``-o policyreport``,
``-o openreports``): one per run namespace and a cluster-scoped one for the cluster-wide
grants, all named ``runguard-rbac``. ``--write`` applies them in the formats
``runguard audit --write`` writes (``webhook.cli.audit_write``): by default each the
cluster serves the CRDs of, ``--reports`` to name them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from webhook.audit.clusteraudit import AuditError
from webhook.audit.rbacdoors import RBAC_API
from webhook.audit.rbacreport import (
    RbacReport,
    platform_of,
    rbac_report,
    rbac_reports,
    shells_webhook_installed,
)
from webhook.audit.rbacreport import to_rows as rbac_rows
from webhook.audit.rbacreport import to_table as rbac_table
from webhook.audit.reportbook import ReportFormat
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.cli.audit_write import FORMATS, apply_report, crds_checked, served_formats
from webhook.cli.cluster import REQUEST_TIMEOUT, Session, dump_reports, on_cluster, say
from webhook.install.manifests import SHELLS_CONFIGURATION_NAME
from webhook.policy.model import Policy

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
    if args.output == "summary" or (args.cluster_state and (args.write or args.policy_objects)):
        print(
            "runguard audit: --rbac prints a table, json, policyreport or openreports; "
            "--write and --policy-objects read the cluster, not --cluster-state",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    policy = None if args.policy_objects else load_policy_or_report(args.policy)
    if policy is None and not args.policy_objects:
        return EXIT_BAD_INPUT
    try:
        if args.cluster_state:
            assert policy is not None, "--policy-objects reads the cluster"
            report = _rbac_from_files(args, policy)
        else:
            report = on_cluster(
                args, "audit", _rbac_from_cluster(args), policy=policy,
                doing="read the roles and bindings",
            )  # fmt: skip
        if report is None:
            return EXIT_BAD_INPUT
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    found, shown = len(report.unexpected()), len(report.shown(args.include_expected))
    hidden = len(report.findings) - shown
    say(
        None,
        f"{found:,} findings in {len(report.namespaces):,} run namespaces and cluster-wide"
        + (f" ({hidden:,} expected, not shown)" if hidden else "")
        + f"; the shells webhook is {'on' if report.shells else 'off'}",
    )  # fmt: skip
    if args.write:
        return EXIT_OK
    return EXIT_DENIED if found else EXIT_OK


def _rbac_from_files(args: argparse.Namespace, policy: Policy) -> RbacReport | None:
    """The report of ``--cluster-state``'s objects, printed (None: said why not)."""
    from webhook.clusterstate.model import ClusterStateError
    from webhook.inputs.documents import InputError, read_objects
    from webhook.inputs.limits import CLUSTER_STATE_FILES

    try:
        objects = [o for f in args.cluster_state for o in read_objects(f, CLUSTER_STATE_FILES)]
        shells = args.shells == "on" if args.shells else shells_webhook_installed(objects)
        report = rbac_report(objects, platform_of(policy), shells=shells, namespace=args.namespace)
    except (InputError, ClusterStateError) as exc:
        print(f"runguard audit: --cluster-state: {exc}", file=sys.stderr)
        return None
    _rbac_output(report, args, time.time())
    return report


def _rbac_from_cluster(args: argparse.Namespace) -> Callable[[Session], RbacReport]:
    """The report of the cluster's objects, printed, and written with ``--write`` in each
    format asked for, or served (``served_formats``)."""

    def work(session: Session) -> RbacReport:
        now = time.time()
        objects = _rbac_objects(session.api_client)
        shells = args.shells == "on" if args.shells else _shells_on(session.api_client)
        platform = platform_of(session.policy)
        report = rbac_report(objects, platform, shells=shells, namespace=args.namespace)
        _rbac_output(report, args, now)
        if not args.write:
            return report
        session.doing = "read which report CRDs the cluster serves"
        for form in served_formats(session.api_client, args.reports):
            session.doing = f"write the RBAC {form.kind}s"
            reports = rbac_reports(form, report, include_expected=args.include_expected, now=now)
            with crds_checked(form):
                _write_rbac_reports(session.api_client, form, reports)
        return report

    return work


def _rbac_output(report: RbacReport, args: argparse.Namespace, now: float) -> None:
    """Print the report as asked: a table (none with ``--write`` and nothing to show),
    JSON rows, or the reports of the format ``-o`` names."""
    shown = report.shown(args.include_expected)
    if args.output == "json":
        json.dump(rbac_rows(shown), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output in FORMATS:
        form = FORMATS[args.output]
        dump_reports(
            rbac_reports(form, report, include_expected=args.include_expected, now=now),
            sys.stdout,
        )
    elif not args.write or shown:
        sys.stdout.write(rbac_table(shown) + "\n")


def _rbac_objects(api_client: Any) -> list[dict[str, Any]]:
    """Every Namespace, Role, RoleBinding, ClusterRole and ClusterRoleBinding."""
    return listed_objects(api_client, RBAC_LISTS)


def listed_objects(
    api_client: Any, lists: tuple[tuple[str, str, str, str], ...]
) -> list[dict[str, Any]]:
    """Every object of each (kind, apiVersion, API class, list call), one request each."""
    import orjson
    from kubernetes import client

    objects: list[dict[str, Any]] = []
    for kind, api_version, api_class, call in lists:
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


def _write_rbac_reports(api_client: Any, form: ReportFormat, reports: list[dict[str, Any]]) -> None:
    """Server-side apply the cluster-scoped report and each run namespace's, of ``form``
    (one each, replaced whole: an empty one says nothing is found there any more). Needs
    ``create`` and ``patch`` on both kinds: no get, since there are no parts to empty."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    for report in reports:
        apply_report(api, form, report)
    say(None, f"{len(reports):,} RBAC {form.kind}s written (one {form.cluster_kind})")
