"""Benchmark of ``runguard audit`` at cluster scale, against the e2e apiserver (not a test).

Starts etcd + kube-apiserver (``tests/e2e/cluster.py``; binaries built once and cached,
apiserver audit logging off: it is not what is measured), creates the PriorityClasses
and RuntimeClass the shipped profiles name and both report formats' CRDs, then fills the
cluster with ``--count`` objects through the API: a bounded loop of real creates from
``--threads`` keep-alive connections, no webhook registered. Of the objects, 1% are
Jobs (run templates), 9% Pods outside the policy's selector, the rest run Pods as
runguard admitted them (``policies/``, profile ``1xt4``), every 20th of them on the
host network (a violation).

Then each variant runs in a fresh process, its output to /dev/null, and its wall time,
CPU time and peak RSS (``wait4``) are measured (CPU time is the steadier figure on a
shared machine; the load average is printed with the results):

* ``before``: ``runguard audit`` as it was at commit ``BEFORE`` (one unpaginated list
  per kind through the typed models, every Decision kept), loaded from git;
* ``after``: ``runguard audit`` now (pages of ``--page-size``, Pods selected
  server-side, raw JSON, findings only), as ``-o table``, ``-o policyreport`` and
  ``--write -o summary`` (both formats), whose objects and bytes stored per format are
  then read back.

The old audit runs under an address-space limit (``--before-limit-gb``): at 100k
objects it needs gigabytes, and this machine is shared. Prints a table, then one JSON
line with every figure.

    .venv/bin/python bench/bench_audit.py [--count 10000] [--page-size 500] [--threads 6]
        [--before all|table|none] [--before-limit-gb 12]
    .venv/bin/python bench/bench_audit.py --offline [--count 100000]

``--offline`` needs no apiserver: the same objects judged in memory, and the objects and
bytes ``--write`` would store in each report format, against namespaces x RunPolicies
(``bench/audit_reports.py``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import audit_reports
import bench_config
from bench_config import POLICY_DIR, REPO

from tests.e2e import cluster as e2e
from tests.e2e.devcluster import prepare_cluster
from webhook.audit.clusteraudit import LISTINGS
from webhook.engine import mutate
from webhook.policy.loader import load_policy

BEFORE = "64f3a1460e42818ccd46e7442c8f91c54b00e3d5"  # HEAD when the paging work began
NAMESPACES = 10
RETRIES = 5  # per create, on 429 / 5xx / a dropped connection
RUN_TIMEOUT = 3600.0  # seconds, per measured audit

# The old implementation, run from its sources at BEFORE (the library and the command).
BEFORE_RUNNER = """
import sys, types
from kubernetes import client, config
import yaml
from webhook.policy.loader import load_policy

def load(name, path):
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(open(path).read(), path, "exec"), module.__dict__)
    return module

clusteraudit = load("before_clusteraudit", sys.argv[1])
command = load("before_cli_audit", sys.argv[2])
policy = load_policy(sys.argv[3])
config.load_kube_config(config_file=sys.argv[4])
with client.ApiClient() as api_client:
    findings = clusteraudit.audit(command.list_objects(api_client, None), policy)
if sys.argv[5] == "policyreport":
    yaml.safe_dump_all(clusteraudit.to_policy_reports(findings, policy), sys.stdout,
                       sort_keys=False)
else:
    print(clusteraudit.to_table(findings))
print(f"before: {len(findings)} runs", file=sys.stderr)
sys.exit(1 if any(f.decision.violations for f in findings) else 0)
"""


def run_pod(policy: Any) -> dict[str, Any]:
    """A run Pod as the platform sends it, after runguard's mutation (what is stored)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "__NAME__",
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/run": "__RUN__",
                "dhcore/template": "1xt4",
                "dhcore/project": "bench",
            },
            "annotations": {"dhcore/function": "train"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "train.py", "--epochs", "10"],
                    "env": [{"name": f"PARAM_{i}", "value": str(i)} for i in range(8)],
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                }
            ],
        },
    }
    admitted: dict[str, Any] = mutate(pod, policy).object
    return admitted


def templates(policy: Any) -> dict[str, bytes]:
    """Bodies with ``__NAME__`` / ``__RUN__`` placeholders, per kind of object created."""
    good = run_pod(policy)
    bad = json.loads(json.dumps(good))
    bad["spec"]["hostNetwork"] = True
    plain = json.loads(json.dumps(good))
    plain["metadata"]["labels"] = {"app": "web"}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "__NAME__"},
        "spec": {
            "template": {
                "metadata": {"labels": good["metadata"]["labels"]},
                "spec": good["spec"],
            }
        },
    }
    return {
        k: json.dumps(v).encode()
        for k, v in (("run", good), ("violation", bad), ("other", plain), ("job", job))
    }


def plan(count: int) -> list[tuple[str, str, str]]:
    """(template, namespace, name) for each object to create."""
    objects = []
    jobs = count // 100
    others = (count - jobs) // 10
    for i in range(count):
        namespace = f"bench-{i % NAMESPACES}"
        if i < jobs:
            objects.append(("job", namespace, f"job-{i:06}"))
        elif i < jobs + others:
            objects.append(("other", namespace, f"web-{i:06}"))
        else:
            kind = "violation" if i % 20 == 0 else "run"
            objects.append((kind, namespace, f"run-{i:06}"))
    return objects


def fill(cluster: e2e.Cluster, bodies: dict[str, bytes], objects: list[Any], threads: int) -> int:
    """Create ``objects`` from ``threads`` keep-alive connections; the number that failed."""
    context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    context.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
    failed = [0] * threads

    def worker(index: int) -> None:
        connection = http.client.HTTPSConnection("127.0.0.1", cluster.port, context=context)
        for template, namespace, name in objects[index::threads]:
            body = bodies[template].replace(b"__NAME__", name.encode())
            body = body.replace(b"__RUN__", name.encode())
            group = "/apis/batch/v1" if template == "job" else "/api/v1"
            path = f"{group}/namespaces/{namespace}/{'jobs' if template == 'job' else 'pods'}"
            for _ in range(RETRIES):
                try:
                    connection.request("POST", path, body, {"Content-Type": "application/json"})
                    response = connection.getresponse()
                    response.read()
                    if response.status in (201, 409):  # 409: already there (a retry)
                        break
                    if response.status not in (429, 500, 503, 504):
                        failed[index] += 1
                        break
                except (OSError, http.client.HTTPException):
                    connection.close()
                    connection = http.client.HTTPSConnection(
                        "127.0.0.1", cluster.port, context=context
                    )
                time.sleep(0.5)
            else:
                failed[index] += 1
        connection.close()

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(failed)


def measure(argv: Sequence[str], env: dict[str, str], limit_gb: float = 0) -> dict[str, Any]:
    """Run ``argv`` with stdout to /dev/null (and at most ``limit_gb`` of address space,
    so a run that would take the shared machine's memory fails instead): seconds, peak
    RSS, exit code, stderr."""

    def limit() -> None:
        size = int(limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    with tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=REPO,
            preexec_fn=limit if limit_gb else None,
        )
        status, usage = bench_config.wait_bounded(proc, RUN_TIMEOUT)
        seconds = time.monotonic() - started
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit": proc.returncode,
        "stderr": stderr[-20000:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000, help="objects to create")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--threads", type=int, default=6, help="concurrent creates")
    parser.add_argument(
        "--only", default="", help="measure only the variants whose name contains this"
    )
    parser.add_argument("--log-dir", type=Path, help="keep each variant's stderr here")
    parser.add_argument(
        "--before",
        choices=("all", "table", "none"),
        default="all",
        help="which outputs of the old audit to measure (it holds every object: slow, big)",
    )
    parser.add_argument(
        "--before-limit-gb",
        type=float,
        default=12.0,
        help="address space the old audit may take before it fails (default 12)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="no apiserver: the --count objects judged in memory, and the reports --write "
        "would store in each format counted and sized (bench/audit_reports.py)",
    )
    args = parser.parse_args()
    if args.offline:
        audit_reports.run_offline(args, plan, templates)
        return

    policy = load_policy(POLICY_DIR)
    e2e.AUDIT_POLICY = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "rules": [{"level": "None"}],
    }
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        work = Path(tmp)
        before = work / "before"
        before.mkdir()
        # Read only for --before: `--before none` runs where BEFORE's sources are not found.
        for path in ("webhook/audit/clusteraudit.py", "webhook/cli/audit.py"):
            if args.before == "none":
                break
            source = subprocess.run(
                ["git", "show", f"{BEFORE}:{path}"], cwd=REPO, capture_output=True, check=True
            ).stdout
            (before / path.replace("/", "_")).write_bytes(source)
        (before / "runner.py").write_text(BEFORE_RUNNER)

        with e2e.Cluster(work / "cluster", e2e.build_binaries()) as cluster:
            prepare_cluster(cluster)
            audit_reports.install_crds(cluster)
            for i in range(NAMESPACES):
                cluster.kubectl("create", "namespace", f"bench-{i}", check=True)
            objects = plan(args.count)
            started = time.monotonic()
            failed = fill(cluster, templates(policy), objects, args.threads)
            fill_seconds = time.monotonic() - started
            print(
                f"created {len(objects) - failed} objects in {fill_seconds:.1f}s "
                f"({(len(objects) - failed) / fill_seconds:.0f}/s), {failed} failed",
                file=sys.stderr,
            )

            env = {**cluster.env(), "PYTHONPATH": str(REPO)}
            results = {}
            for name, argv in variants(args, before, str(cluster.kubeconfig)).items():
                if args.only not in name:
                    continue
                limit = args.before_limit_gb if name.startswith("before") else 0
                results[name] = measure(argv, env, limit)
                if args.log_dir:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    log = args.log_dir / (re.sub(r"\W+", "-", name).strip("-") + ".log")
                    log.write_text(results[name]["stderr"])
                print(f"{name}: {results[name]['seconds']}s", file=sys.stderr)
            stored = audit_reports.stored(cluster) if "--write" in " ".join(results) else {}

    print_results(args, len(objects) - failed, fill_seconds, results)
    if stored:
        audit_reports.print_stored(stored)


def variants(args: argparse.Namespace, before: Path, kubeconfig: str) -> dict[str, list[str]]:
    """The command line of each audit measured."""
    audit = [sys.executable, "-m", "webhook", "audit", "-p", str(POLICY_DIR)]
    audit += ["--kubeconfig", kubeconfig, "--page-size", str(args.page_size)]
    commands = {
        "after: -o table": [*audit, "-o", "table"],
        "after: -o policyreport": [*audit, "-o", "policyreport"],
        "after: --write -o summary": [*audit, "--write", "-o", "summary"],
    }
    sources = [str(before / f"webhook_{m}.py") for m in ("clusteraudit", "cli_audit")]
    runner = [sys.executable, str(before / "runner.py"), *sources, str(POLICY_DIR), kubeconfig]
    if args.before != "none":
        commands["before: -o table"] = [*runner, "table"]
    if args.before == "all":
        commands["before: -o policyreport"] = [*runner, "policyreport"]
    return commands


FIGURES = ("seconds", "cpu_seconds", "peak_rss_mb", "requests", "runs", "exit")


def print_results(
    args: argparse.Namespace, created: int, fill_seconds: float, results: dict[str, Any]
) -> None:
    """The table, then one JSON line."""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nrunguard audit, {args.count:,} objects ({created:,} created in "
        f"{fill_seconds:.0f}s), page size {args.page_size}; load average at the end: "
        f"{load} ({os.cpu_count()} cores)"
    )
    header = ("variant", "seconds", "cpu s", "peak RSS MB", "lists", "runs", "exit")
    print("{:<28} {:>8} {:>7} {:>12} {:>6} {:>7} {:>4}".format(*header))
    for name, result in results.items():
        # The new audit says how many runs and pages; the old one made one list per kind.
        said = re.search(r"([\d,]+) runs \(.*in ([\d,]+) pages", result["stderr"])
        said = said or re.search(r"before: (\d+) runs", result["stderr"])
        numbers = [int(n.replace(",", "")) for n in said.groups()] if said else [0]
        result["runs"], result["requests"] = numbers[0], (numbers[1:] or [len(LISTINGS)])[0]
        row = [result[f] for f in FIGURES]
        print("{:<28} {:>8.1f} {:>7.1f} {:>12.0f} {:>6} {:>7} {:>4}".format(name, *row))
        if result["exit"] not in (0, 1):
            print(result["stderr"], file=sys.stderr)
    figures = {
        "count": args.count,
        "created": created,
        "fill_seconds": round(fill_seconds, 1),
        "page_size": args.page_size,
        "load_average": os.getloadavg(),
        "results": {name: {f: r[f] for f in FIGURES} for name, r in results.items()},
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
