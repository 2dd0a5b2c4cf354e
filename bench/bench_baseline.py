"""This tree's server and engine against another checkout's, in the same run (not a test).

``make bench`` measures this tree alone; whether a change made anything slower needs the
earlier tree measured beside it, on the same machine at the same moments. Both servers
are started as ``runguard serve`` runs them (each tree's own ``gunicorn.conf.py``,
application and default worker), on the same policy files (the baseline's ``policies/``
unless ``--policies``: a newer tree reads an older policy format, not the reverse), with
fresh certificates. Rounds are interleaved: each round drives ``/mutate`` then
``/validate`` (the typical run Pod as the platform sends it, ``bench_http.drive``:
keep-alive TLS connections) at one server then the other, and times the engine of each
tree in a child process (``bench_compare.p50``, both on the baseline's platform test
policy). Per tree it prints medians [min-max] over rounds of requests/s, p99 and the
workers' CPU per request, resident memory per worker, ``engine_us_p50``, and the ratio
of this tree to the baseline (requests/s: higher is better; the rest: lower is better).
Bounded: ``--rounds`` (<= 5) x ``--seconds`` (<= 20) per endpoint.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/bench_baseline.py /tmp/base [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_compare
from bench_config import CONNECTIONS, PLATFORM_USER, REPO
from bench_http import cpu_seconds, drive, free_port, server_env, wait_for_tls, workers_of
from harness import slow_clients
from harness.workloads import memory_mb
from harness.workloads import typical_run_pod as run_pod

ENDPOINTS = ("/mutate", "/validate")
PLATFORM = Path("tests/cases/_policies/platform")  # the engine's policy: the baseline's


def start(tree: Path, policies: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``tree``'s runguard as ``runguard serve`` runs it, on 127.0.0.1, serving ``policies``."""
    certs = workdir / "certs"
    port = free_port()
    env = server_env(tree, policies, certs, port)
    log = open(workdir / "stderr", "wb")  # noqa: SIM115 - the server's, kept while it runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(tree / "gunicorn.conf.py")],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    wait_for_tls(proc, port, certs / "ca.crt", workdir / "stderr", 60.0)
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def measure(proc: subprocess.Popen[bytes], port: int, ca: str, path: str, body: bytes,
            seconds: float) -> dict[str, float]:  # fmt: skip
    before = cpu_seconds(workers_of(proc.pid))
    result = drive(port, ca, path, body, CONNECTIONS, seconds)
    used = cpu_seconds(workers_of(proc.pid)) - before
    result["cpu_us"] = 1e6 * used / max(1, result["requests"])
    return result


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=Path, help="a checkout of the baseline commit")
    parser.add_argument("--policies", type=Path, help="default: the baseline's policies/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per endpoint and round")
    args = parser.parse_args()
    rounds, seconds = max(1, min(args.rounds, 5)), max(1.0, min(args.seconds, 20.0))
    trees = {"this tree": REPO, "baseline": args.baseline.resolve()}
    policies = (args.policies or trees["baseline"] / "policies").resolve()
    body = slow_clients.review_of(run_pod(), user=PLATFORM_USER)
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    print(f"load average before: {os.getloadavg()[0]:.2f}; policies: {policies}")
    with tempfile.TemporaryDirectory(prefix="runguard-baseline-") as tmp:
        servers: dict[str, tuple[Any, int, str]] = {}
        try:
            for name, tree in trees.items():
                workdir = Path(tmp) / name.replace(" ", "-")
                workdir.mkdir()
                proc, port = start(tree, policies, workdir)
                servers[name] = proc, port, str(workdir / "certs" / "ca.crt")
            for number in range(1, rounds + 1):
                for name, tree in trees.items():
                    proc, port, ca = servers[name]
                    seen = figures[name]
                    for path in ENDPOINTS:
                        result = measure(proc, port, ca, path, body, seconds)
                        if result["failures"]:
                            print(f"{name} {path}: {result['failures']} failed requests")
                        for key in ("rps", "p99_ms", "cpu_us"):
                            seen.setdefault(f"{path} {key}", []).append(result[key])
                    rss = [memory_mb(pid)[0] for pid in workers_of(proc.pid)]
                    seen.setdefault("rss_mb_per_worker", []).append(statistics.mean(rss))
                    engine = bench_compare.p50(tree, seconds, trees["baseline"] / PLATFORM)
                    seen.setdefault("engine_us_p50", []).append(engine)
                print(f"round {number} of {rounds} done")
        finally:
            for proc, _, _ in servers.values():
                stop(proc)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"{'figure':<24} {'this tree':>22} {'baseline':>22} {'ratio':>7}")
    for key, values in figures["this tree"].items():
        base = figures["baseline"][key]
        ratio = statistics.median(values) / statistics.median(base)
        print(f"{key:<24} {spread(values):>22} {spread(base):>22} {ratio:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
