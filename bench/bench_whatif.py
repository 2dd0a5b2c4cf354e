"""Benchmark of ``runguard whatif`` over synthetic runs (not a test): time and peak memory.

The runs are what ``runguard whatif`` reads from a cluster: list pages of raw JSON
(``--page-size`` items), served by an in-process fake of the apiserver's paged list that
makes each page when it is asked for (no apiserver: ``bench_audit.py`` measures the
listing itself). Of the runs, 1% are Jobs, the rest Pods as runguard admitted them under
``policies/``, naming ``1xt4``, ``1xa100``, ``cpu-large`` or no profile in turn, spread
over ``NAMESPACES`` namespaces, half of them labelled ``example.com/team=a``. The
proposal keeps ``1xa100`` to team A's namespaces and lowers ``1xt4``'s memory limit:
some runs are denied, some changed, the rest unchanged.

Each count runs in a fresh process (the same loop as the command: ``listed_pages``,
``compare_all``, the tally, the table written to /dev/null); its wall time, CPU time
and peak RSS (``wait4``) are measured. Peak memory should not grow with the count.
Prints a table, then one JSON line.

    .venv/bin/python bench/bench_whatif.py [--counts 1000,10000] [--page-size 500]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import bench_config
from bench_config import REPO

from webhook.audit.clusteraudit import LISTINGS, Listing, listed_pages  # noqa: E402
from webhook.audit.whatif import TableWriter, Tally, compare_all  # noqa: E402
from webhook.cli.whatif import selecting  # noqa: E402
from webhook.clusterstate import StaticClusterState  # noqa: E402
from webhook.engine import mutate  # noqa: E402
from webhook.engine.context import Context  # noqa: E402
from webhook.policy.loader import load_policy  # noqa: E402
from webhook.policy.model import Policy  # noqa: E402

POLICY_DIR = REPO / "policies"
NAMESPACES = 10
PROFILES = ("1xt4", "1xa100", "cpu-large", None)
RUN_TIMEOUT = 1800.0  # seconds, per measured run


def namespaces() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": f"bench-{i}",
                "labels": {"kubernetes.io/metadata.name": f"bench-{i}"}
                | ({"example.com/team": "a"} if i % 2 == 0 else {}),
            },
        }
        for i in range(NAMESPACES)
    ]


def classes() -> list[dict[str, Any]]:
    return [
        *({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
           "metadata": {"name": n}, "value": v}
          for n, v in (("low", 100), ("medium", 1000), ("high", 10000))),
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
         "handler": "nvidia"},
    ]  # fmt: skip


def write_proposal(directory: Path) -> None:
    """``policies/`` with ``1xa100`` kept to team A and ``1xt4``'s memory limit lowered."""
    import yaml

    for path in POLICY_DIR.glob("*.yaml"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            if doc.get("kind") != "Profile":
                continue
            if doc["metadata"]["name"] == "1xa100":
                doc["spec"]["namespaceSelector"] = {"matchLabels": {"example.com/team": "a"}}
            if doc["metadata"]["name"] == "1xt4":
                doc["spec"]["resources"]["limits"]["memory"] = "20Gi"
        (directory / path.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))


def templates(policy: Policy, context: Context) -> dict[str, list[bytes]]:
    """Per kind, stored objects (as a list page holds them: no kind, no apiVersion) with
    ``__NAME__`` / ``__NS__`` placeholders, one per profile."""
    pods, jobs = [], []
    for profile in PROFILES:
        labels = {
            "app.kubernetes.io/managed-by": "dhcore",
            "dhcore/run": "__NAME__",
            "dhcore/project": "__NS__-project",
        }
        if profile:
            labels["dhcore/template"] = profile
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "__NAME__", "namespace": "bench-0", "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "python:3.11",
                                "command": ["python", "train.py"],
                                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}],
            },
        }  # fmt: skip
        stored = mutate(pod, policy, namespace="bench-0", context=context).object
        job = {
            "metadata": {"name": "__NAME__", "namespace": "bench-0"},
            "spec": {"template": {"metadata": {"labels": labels}, "spec": pod["spec"]}},
        }
        for obj, into in ((stored, pods), (job, jobs)):
            body = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            into.append(json.dumps(body).replace('"bench-0"', '"__NS__"').encode())
    return {"Pod": pods, "Job": jobs}


class SyntheticApiserver:
    """A paged list of ``count`` runs, each page made when asked for."""

    def __init__(self, count: int, bodies: dict[str, list[bytes]]) -> None:
        jobs = count // 100
        self.counts = {"Pod": count - jobs, "Job": jobs}
        self.bodies = bodies
        self.requests = 0

    def __call__(self, listing: Listing, namespace: str | None, query: Mapping[str, str]) -> bytes:
        self.requests += 1
        total = self.counts.get(listing.kind, 0)
        start = int(query.get("continue") or 0)
        end = min(total, start + int(query["limit"]))
        items = []
        bodies = self.bodies.get(listing.kind, [])
        for i in range(start, end):  # key order: namespace, then name
            ns, name = f"bench-{i * NAMESPACES // max(total, 1)}", f"run-{i:07}"
            body = bodies[i % len(bodies)].replace(b"__NAME__", name.encode())
            items.append(body.replace(b"__NS__", ns.encode()))
        token = str(end) if end < total else ""
        head = json.dumps({"kind": f"{listing.kind}List", "metadata": {"continue": token}})
        return head[:-1].encode() + b', "items": [' + b",".join(items) + b"]}"


def worker(count: int, page_size: int, proposed_dir: str) -> None:
    """One measured run: the command's loop over ``count`` synthetic runs."""
    current, proposed = load_policy(POLICY_DIR), load_policy(proposed_dir)
    context = Context(state=StaticClusterState.from_documents([*namespaces(), *classes()]))
    fetch = SyntheticApiserver(count, templates(current, context))
    tally = Tally()
    with open(os.devnull, "w") as out:
        table = TableWriter(out)
        for _, _, items in listed_pages(
            fetch, selecting(current, proposed), page_size=page_size, listings=LISTINGS
        ):
            verdicts = list(compare_all(items, current, proposed, context))
            tally.add(verdicts)
            table.write(verdicts)
        table.close(tally)
    print(json.dumps({"totals": dict(tally.totals), "requests": fetch.requests}))


def measure(argv: list[str]) -> dict[str, Any]:
    started = time.monotonic()
    # output to files, not pipes: a child filling a pipe nobody reads would wait forever
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        proc = subprocess.Popen(argv, stdout=out_file, stderr=err_file, cwd=REPO)
        status, usage = bench_config.wait_bounded(proc, RUN_TIMEOUT)
        seconds = time.monotonic() - started
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read().decode(), err_file.read().decode()
    code = os.waitstatus_to_exitcode(status)
    said = json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit": code,
        "totals": said.get("totals", {}),
        "requests": said.get("requests", 0),
        "stderr": err[-5000:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,10000", help="runs per measured process")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--proposed", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.page_size, args.proposed)
        return
    counts = [int(c) for c in args.counts.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        write_proposal(Path(tmp))
        for count in counts:
            argv = [sys.executable, __file__, "--worker", str(count),
                    "--page-size", str(args.page_size), "--proposed", tmp]  # fmt: skip
            results[count] = measure(argv)
            print(f"{count:,} runs: {results[count]['seconds']}s", file=sys.stderr)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nrunguard whatif over synthetic runs, page size {args.page_size}; load average "
          f"{load} ({os.cpu_count()} cores)")  # fmt: skip
    print("{:>8} {:>8} {:>7} {:>12} {:>7} {:>8} {:>8} {:>9} {:>4}".format(
        "runs", "seconds", "cpu s", "peak RSS MB", "lists", "denied", "changed", "unchanged",
        "exit"))  # fmt: skip
    for count, r in results.items():
        t = r["totals"]
        print("{:>8,} {:>8.1f} {:>7.1f} {:>12.0f} {:>7} {:>8} {:>8} {:>9} {:>4}".format(
            count, r["seconds"], r["cpu_seconds"], r["peak_rss_mb"], r["requests"],
            t.get("denied", 0), t.get("changed", 0), t.get("unchanged", 0), r["exit"]))  # fmt: skip
        if r["exit"] != 0:
            print(r["stderr"], file=sys.stderr)
    figures = {
        "page_size": args.page_size,
        "load_average": os.getloadavg(),
        "results": {
            str(c): {k: v for k, v in r.items() if k != "stderr"} for c, r in results.items()
        },
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
