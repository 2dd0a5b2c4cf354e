"""``runguard audit --write``: the reports server-side applied, in each format asked for.

``--reports`` names the formats (``policyreport``: wgpolicyk8s.io's PolicyReports,
``openreports``: OpenReports' Reports); by default both, each where the cluster serves
its CRDs (read from discovery, which every authenticated user may read): a format whose
CRDs are missing is said on stderr and skipped, and only none served at all is an error.
Named explicitly, a format the cluster does not serve is an error.

Per format: a report per namespace and RunPolicy (and part) applied whole, then the parts
a namespace no longer needs emptied, then the cluster-scoped report about the policy
objects. Needs ``get``, ``create`` and ``patch`` on the namespaced kind and ``create``,
``patch`` on the cluster-scoped one, nothing else (``manifests/audit-cronjob/rbac.yaml``).

``runguard audit --rbac --write`` (``webhook.cli.audit_rbac``) chooses its formats the same
way, with the same ``--reports``, and applies its reports with ``apply_report``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from webhook.audit.clusteraudit import AuditError
from webhook.audit.openreports import OPEN_REPORTS
from webhook.audit.policyreport import POLICY_REPORTS
from webhook.audit.reportbook import ReportBook, ReportFormat, report_name
from webhook.cli.cluster import REQUEST_TIMEOUT, SERVER_SIDE_APPLY, Progress, release, say
from webhook.keys import POLICY_LABEL

FORMATS = {form.name: form for form in (POLICY_REPORTS, OPEN_REPORTS)}
# What --write does to the namespaced reports (server-side apply: create or patch; get to
# find parts no longer needed) and to the cluster-scoped one (applied whole): exactly what
# the audit CronJob's ClusterRole grants, for each format.
REPORT_VERBS = ("get", "create", "patch")
CLUSTER_REPORT_VERBS = ("create", "patch")
MAX_PARTS = 10_000  # report parts probed per namespace when emptying stale ones
# Where each format's CRDs come from, for the message when a cluster lacks them.
INSTALL = {
    POLICY_REPORTS.name: "`kubectl apply -k manifests/policyreport-crd` (or keep the ones "
    "Kyverno or Policy Reporter install)",
    OPEN_REPORTS.name: "the OpenReports project's (github.com/openreports/reports-api, "
    "config/crd; Kyverno and Policy Reporter's charts install them too)",
}


def report_formats(text: str) -> tuple[ReportFormat, ...]:
    """``--reports``' value: formats separated by commas, each once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected {' or '.join(FORMATS)}, or both separated by a comma"
        )
    return tuple(FORMATS[name] for name in dict.fromkeys(names))


def missing_kinds(api_client: Any, form: ReportFormat) -> list[str]:
    """The kinds of ``form`` the cluster does not serve (discovery: its group version's
    resources)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        served = client.CustomObjectsApi(api_client).get_api_resources(
            form.group, form.version, _request_timeout=REQUEST_TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:
            return [form.kind, form.cluster_kind]
        raise
    names = {resource.name for resource in served.resources or ()}
    return [
        kind
        for kind, plural in ((form.kind, form.plural), (form.cluster_kind, form.cluster_plural))
        if plural not in names
    ]


def not_served(form: ReportFormat, kinds: list[str]) -> str:
    return (
        f"the cluster serves no {form.api_version} {' or '.join(kinds)}: install their CRDs "
        f"from {INSTALL[form.name]}"
    )


def served_formats(
    api_client: Any, asked: tuple[ReportFormat, ...] | None
) -> tuple[ReportFormat, ...]:
    """The formats to write: ``asked`` (each must be served), or by default every format
    the cluster serves (the others said on stderr). Raises ``AuditError`` when a format
    asked for, or every format, is not served."""
    usable: list[ReportFormat] = []
    for form in asked or tuple(FORMATS.values()):
        kinds = missing_kinds(api_client, form)
        if not kinds:
            usable.append(form)
        elif asked:
            raise AuditError(f"{not_served(form, kinds)}, or run without --reports {form.name}")
        else:
            say(None, f"{not_served(form, kinds)}; {form.name} not written")
    if not usable:
        raise AuditError("no report format to write: install one's CRDs, or run without --write")
    return tuple(usable)


@contextmanager
def crds_checked(form: ReportFormat) -> Iterator[None]:
    """Writing ``form``'s reports: a 404 to an apply (which creates what is missing) is
    its CRDs gone since discovery, said as a missing format is."""
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        if exc.status == 404:
            raise AuditError(f"404: {not_served(form, [form.kind, form.cluster_kind])}") from exc
        raise


def apply_report(api: Any, form: ReportFormat, report: dict[str, Any]) -> None:
    """Server-side apply one report of ``form`` with ``api`` (a ``CustomObjectsApi``):
    of the namespaced kind when its metadata names a namespace, else the cluster-scoped
    one. Created, or replaced whole (``results`` is an atomic list)."""
    meta = report["metadata"]
    if "namespace" in meta:
        response: Any = api.patch_namespaced_custom_object(
            form.group, form.version, meta["namespace"], form.plural, meta["name"], report,
            **SERVER_SIDE_APPLY,
        )  # fmt: skip
    else:
        response = api.patch_cluster_custom_object(
            form.group, form.version, form.cluster_plural, meta["name"], report,
            **SERVER_SIDE_APPLY,
        )  # fmt: skip
    release(response)


def write_reports(api_client: Any, form: ReportFormat, book: ReportBook, per_report: int) -> None:
    """Server-side apply each report (created, or replaced whole: ``results`` is an
    atomic list), then empty the parts a namespace no longer needs. Needs ``create``,
    ``patch`` and ``get`` on the kind, nothing else (no list: a namespace left without
    runs keeps its last report; see docs/audit.md)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    parts: Counter[tuple[str, str]] = Counter()  # by namespace and RunPolicy

    def exists(namespace: str, name: str) -> bool:
        try:
            response: Any = api.get_namespaced_custom_object(
                form.group, form.version, namespace, form.plural, name,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        release(response)
        return True

    emptied = 0
    try:
        for report in book.reports(form, per_report):
            apply_report(api, form, report)
            meta = report["metadata"]
            parts[meta["namespace"], meta["labels"][POLICY_LABEL]] += 1
            if progress is not None:
                progress.show(f"{form.kind}s written: {parts.total():,}")
        for (namespace, policy), count in parts.items():
            for part in range(count + 1, count + 1 + MAX_PARTS):
                if not exists(namespace, report_name(policy, part)):
                    break
                apply_report(api, form, form.report(policy, namespace, part, []))
                emptied += 1
    finally:
        if progress is not None:
            progress.clear()
    say(
        None,
        f"{parts.total():,} {form.kind}s written in {len({ns for ns, _ in parts}):,} "
        "namespaces" + (f", {emptied:,} parts no longer needed emptied" if emptied else ""),
    )


def write_cluster_report(api_client: Any, form: ReportFormat, report: dict[str, Any]) -> None:
    """Server-side apply the cluster-scoped report (one object, replaced whole)."""
    from kubernetes import client

    apply_report(client.CustomObjectsApi(api_client), form, report)
    say(None, f"{form.cluster_kind} {report['metadata']['name']} written")
