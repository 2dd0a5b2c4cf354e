"""What ``runguard audit --write`` stores, per report format (``bench_audit.py --offline``).

The objects of ``bench_audit.py``'s plan (the same bodies: run Pods as runguard admitted
them, every 20th on the host network, Jobs, Pods outside the selector) are made in
memory a page at a time and judged as ``runguard audit`` judges a listed page, without
an apiserver; the findings go to a ``ReportBook``, and each format's reports (the
namespaced ones and the cluster-scoped one, exactly what ``--write`` applies) are
rendered one at a time and measured as the JSON the apiserver stores: the number of
objects, their bytes, the largest. Beside them, the bound: namespaces x RunPolicies
with runs, and one object per run (what a reporter writing a report per resource
stores). Time and peak RSS are this process's (``getrusage``), for everything from
the first object made.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Iterator
from typing import Any

import orjson
from bench_config import POLICY_DIR, REPO

from webhook.audit.clusteraudit import judge
from webhook.audit.openreports import OPEN_REPORTS
from webhook.audit.policyreport import POLICY_REPORTS
from webhook.audit.reportbook import RESULTS_PER_REPORT, ReportBook, policy_results
from webhook.policy.loader import load_policy

PAGE = 500  # objects made and judged at a time, as a listed page
CRDS = (
    REPO / "manifests/policyreport-crd/wgpolicyk8s.io_policyreports.yaml",
    REPO / "manifests/policyreport-crd/wgpolicyk8s.io_clusterpolicyreports.yaml",
    REPO / "tests/openreports/openreports.io_reports.yaml",  # reports-api's, verbatim
    REPO / "tests/openreports/openreports.io_clusterreports.yaml",
)


def install_crds(cluster: Any) -> None:
    """Both formats' CRDs, so that ``--write`` writes both."""
    files = [arg for path in CRDS for arg in ("-f", str(path))]
    cluster.kubectl("apply", "--server-side", *files, check=True)
    for form in (POLICY_REPORTS, OPEN_REPORTS):
        for plural in (form.plural, form.cluster_plural):
            crd = f"crd/{plural}.{form.group}"
            cluster.kubectl("wait", "--for=condition=Established", crd, check=True)


def stored(cluster: Any) -> dict[str, dict[str, int]]:
    """What the apiserver holds of each format after ``--write``: objects and the bytes of
    their JSON as read back (metadata, managedFields and all)."""
    figures = {}
    for form in (POLICY_REPORTS, OPEN_REPORTS):
        sizes = []
        for plural in (form.plural, form.cluster_plural):
            done = cluster.kubectl("get", f"{plural}.{form.group}", "-A", "-o", "json")
            items = json.loads(done.stdout)["items"] if done.returncode == 0 else []
            sizes += [len(orjson.dumps(item)) for item in items]
        figures[form.name] = {"objects": len(sizes), "bytes": sum(sizes)}
    return figures


def print_stored(figures: dict[str, dict[str, int]]) -> None:
    print("\nstored by --write, read back from the apiserver")
    for name, f in figures.items():
        print(f"{name:<14} {f['objects']:>8,} objects {f['bytes'] / 1e6:>8.1f} MB")
    print(json.dumps({"stored": figures}))


def pages(bodies: dict[str, bytes], objects: list[tuple[str, str, str]]) -> Iterator[list[Any]]:
    """``objects`` (template, namespace, name) as decoded list items, a page at a time."""
    for start in range(0, len(objects), PAGE):
        page = []
        for template, namespace, name in objects[start : start + PAGE]:
            body = bodies[template].replace(b"__NAME__", name.encode())
            item = orjson.loads(body.replace(b"__RUN__", name.encode()))
            item["metadata"]["namespace"] = namespace
            page.append(item)
        yield page


def measure(count: int, plan: Any, templates: Any) -> dict[str, Any]:
    """Judge ``count`` planned objects, then render and size both formats."""
    policy = load_policy(POLICY_DIR)
    started, cpu = time.monotonic(), time.process_time()
    book = ReportBook(time.time())
    runs = results = 0
    for page in pages(templates(policy), plan(count)):
        findings = list(judge(page, policy))
        runs += len(findings)
        results += sum(max(1, len(f.violations)) for f in findings)
        book.add(findings)
    judged = time.monotonic() - started
    about_policy = policy_results(policy, now=time.time())
    formats = {}
    for form in (POLICY_REPORTS, OPEN_REPORTS):
        sizes = [len(orjson.dumps(form.cluster_report(about_policy)))]
        sizes += [len(orjson.dumps(report)) for report in book.reports(form)]
        formats[form.name] = {
            "objects": len(sizes),
            "bytes": sum(sizes),
            "largest_bytes": max(sizes),
            "bytes_per_run": round(sum(sizes) / max(runs, 1)),
        }
    return {
        "count": count,
        "runs": runs,
        "results": results,
        "namespaces_x_runpolicies": len(book.findings),
        "one_object_per_run": runs,
        "results_per_report": RESULTS_PER_REPORT,
        "formats": formats,
        "judge_seconds": round(judged, 1),
        "seconds": round(time.monotonic() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_offline(args: argparse.Namespace, plan: Any, templates: Any) -> None:
    """Print the table, then one JSON line."""
    figures = measure(args.count, plan, templates)
    print(
        f"\nrunguard audit --write, offline: {figures['count']:,} objects, "
        f"{figures['runs']:,} runs, {figures['results']:,} results in "
        f"{figures['namespaces_x_runpolicies']} namespaces x RunPolicies (parts of "
        f"{figures['results_per_report']:,} results); judged in {figures['judge_seconds']}s, "
        f"all in {figures['seconds']}s ({figures['cpu_seconds']}s CPU), peak RSS "
        f"{figures['peak_rss_mb']:.0f} MB"
    )
    header = ("format", "objects", "MB stored", "largest KB", "bytes/run")
    print("{:<14} {:>8} {:>10} {:>11} {:>10}".format(*header))
    for name, f in figures["formats"].items():
        print(
            f"{name:<14} {f['objects']:>8,} {f['bytes'] / 1e6:>10.1f} "
            f"{f['largest_bytes'] / 1e3:>11.0f} {f['bytes_per_run']:>10,}"
        )
    print(f"{'one per run':<14} {figures['one_object_per_run']:>8,}")
    print(json.dumps(figures))
