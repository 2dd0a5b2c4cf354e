"""Benchmark of the admission server over TLS with keep-alive (not a test).

Starts runguard's server (gunicorn with the repository's ``gunicorn.conf.py``: the options
``runguard serve`` runs with) on a free local port with fresh certificates and the
repository's ``policies/``, then drives, in the same run, from a loopback load
generator with ``--connections`` concurrent keep-alive connections:

* ``POST /bench/allowed`` -- a trivial endpoint of the same server that reads the body
  and returns a fixed allowed review (``bench/trivial_app.py``, a WSGI middleware in
  front of runguard's application: runguard itself has no such endpoint);
* ``POST /mutate`` -- a platform run Pod that the policy patches (profile, root,
  secrets, volumes: most mutation steps fire).

It prints requests/s, p50 and p99 for each, the resident memory of each worker, and
checks the targets (mutate >= 60% of trivial throughput, p99 <= 10 ms, <= 80 MB per
worker). ``--server sync`` runs the same app under gunicorn's ``sync`` worker (one TLS
handshake per request) for comparison. Every phase is bounded in time and count.

    .venv/bin/python bench/bench_http.py [--seconds 10] [--connections 8]
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_config import (
    CONNECTIONS,
    PLATFORM_USER,
    POLICY_DIR,
    REPO,
    TRIVIAL_APP,
    TRIVIAL_PATH,
)
from harness import slow_clients
from harness.workloads import memory_mb
from harness.workloads import typical_run_pod as run_pod

MAX_REQUESTS_PER_CONNECTION = 500_000
TARGET_RATIO, TARGET_P99_MS, TARGET_RSS_MB = 0.60, 10.0, 80.0


def review_bytes() -> bytes:
    # as the platform (policies/ platform.identities): its run keeps its own claim and secret
    return slow_clients.review_of(run_pod(), user=PLATFORM_USER)


# ------------------------------------------------------------------ load generator


class Connection:
    """A keep-alive HTTPS/1.1 connection, reconnecting when the server closes it."""

    def __init__(self, port: int, ca_file: str) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=ca_file)
        self.sock: ssl.SSLSocket | None = None
        self.buffer = b""
        self.handshakes = 0

    def _connect(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.handshakes += 1
        self.buffer = b""
        return self.context.wrap_socket(raw, server_hostname="127.0.0.1")

    def request(self, payload: bytes) -> int:
        if self.sock is None:
            self.sock = self._connect()
        self.sock.sendall(payload)
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the response")
            self.buffer += chunk
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed in the body")
            rest += chunk
        self.buffer = rest[length:]
        if close:
            self.close()
        return status

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _client(
    port: int, ca_file: str, path: str, body: bytes, start_at: float, seconds: float, out: Any
) -> None:
    """One connection in its own process: requests back to back until the deadline."""
    payload = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    conn = Connection(port, ca_file)
    conn.request(payload)  # connect and warm up before the clock starts
    while time.time() < start_at:
        time.sleep(0.001)
    latencies: list[float] = []
    failures = 0
    deadline = time.perf_counter() + seconds
    for _ in range(MAX_REQUESTS_PER_CONNECTION):
        now = time.perf_counter()
        if now >= deadline:
            break
        try:
            status = conn.request(payload)
        except OSError:
            failures += 1
            conn.close()
            continue
        latencies.append(time.perf_counter() - now)
        if status != 200:
            failures += 1
    conn.close()
    out.send((latencies, failures, conn.handshakes))
    out.close()


def drive(
    port: int, ca_file: str, path: str, body: bytes, connections: int, seconds: float
) -> dict[str, float]:
    ctx = mp.get_context("fork")
    start_at = time.time() + 1.0
    pipes, procs = [], []
    for _ in range(connections):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_client, args=(port, ca_file, path, body, start_at, seconds, send)
        )
        proc.start()
        pipes.append(recv)
        procs.append(proc)
    latencies: list[float] = []
    failures = handshakes = 0
    for recv, proc in zip(pipes, procs, strict=True):
        if recv.poll(seconds + 60):
            lat, fail, hs = recv.recv()
            latencies += lat
            failures += fail
            handshakes += hs
        else:
            failures += 1
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    latencies.sort()
    count = len(latencies)
    return {
        "requests": count,
        "rps": count / seconds,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(count - 1, int(count * 0.99))] if latencies else 0,
        "failures": failures,
        "handshakes": handshakes,
    }


# ------------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_env(tree: Path, policies: Path, certs: Path, port: int) -> dict[str, str]:
    """Fresh certificates in ``certs`` and the environment of ``tree``'s runguard serving
    ``policies`` on 127.0.0.1:``port``: this environment's, without any ``RUNGUARD_``
    setting or metrics directory of its own."""
    from webhook.install.certs import new_cert_set, write_cert_set

    now = dt.datetime.now(dt.UTC)
    write_cert_set(certs, new_cert_set("runguard", "runguard", ["127.0.0.1", "localhost"], now))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNGUARD_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(
        PYTHONPATH=str(tree),
        RUNGUARD_POLICY_DIR=str(policies),
        RUNGUARD_CERT_FILE=str(certs / "tls.crt"),
        RUNGUARD_KEY_FILE=str(certs / "tls.key"),
        RUNGUARD_BIND=f"127.0.0.1:{port}",
    )
    return env


def start_server(
    workdir: Path, kind: str, workers: int, threads: int, worker_class: str = ""
) -> tuple[Any, int]:
    """runguard under the repository's ``gunicorn.conf.py`` (``runguard serve``'s options),
    its application with the trivial endpoint (``bench/trivial_app.py``); ``kind`` sync,
    or a ``worker_class`` (``gthread``, ``webhook.serving.worker.SharedListenerWorker``...),
    else ``runguard serve``'s own (``RunguardWorker``)."""
    certs = workdir / "certs"
    port = free_port()
    env = server_env(REPO, POLICY_DIR, certs, port)
    env.update(RUNGUARD_WORKERS=str(workers), RUNGUARD_THREADS=str(threads))
    cmd = [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py")]
    if kind == "sync":  # gunicorn turns sync into gthread when threads > 1
        cmd += ["--worker-class", "sync", "--threads", "1"]
    elif worker_class:
        cmd += ["--worker-class", worker_class]
    cmd.append(TRIVIAL_APP)
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(workdir / "stderr", "wb")
    )
    wait_for_tls(proc, port, certs / "ca.crt", workdir / "stderr", 30.0)
    return proc, port


def wait_for_tls(proc: Any, port: int, ca_file: Path, stderr: Path, timeout: float) -> None:
    """Until the server ``proc`` completes a TLS handshake on ``port`` (then a second for
    every worker to boot); exits with its stderr when it stops or does not answer."""
    context = ssl.create_default_context(cafile=str(ca_file))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{stderr.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1"):
                    break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"server not answering after {timeout:.0f} s:\n{stderr.read_text()}")
    time.sleep(1.0)  # let every worker boot


def workers_of(master: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                pids.append(int(entry.name))
    return sorted(pids)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (a worker's, across its threads)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per endpoint and round")
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    parser.add_argument("--rounds", type=int, default=2, help="trivial, mutate; repeated")
    parser.add_argument("--server", choices=["gthread", "sync"], default="gthread")
    parser.add_argument("--workers", type=int, default=0, help="default: as runguard serve")
    parser.add_argument("--threads", type=int, default=0, help="default: as runguard serve")
    args = parser.parse_args()
    args.seconds = min(args.seconds, 120.0)
    args.rounds = max(1, min(args.rounds, 5))

    from webhook.serving.settings import DEFAULT_THREADS, default_workers

    workers = args.workers or default_workers()
    args.threads = args.threads or DEFAULT_THREADS
    with tempfile.TemporaryDirectory(prefix="runguard-bench-") as tmp:
        proc, port = start_server(Path(tmp), args.server, workers, args.threads)
        ca_file = str(Path(tmp) / "certs" / "ca.crt")
        try:
            mutate_body = review_bytes()
            runs: dict[str, list[dict[str, float]]] = {"trivial": [], "mutate": []}
            for _ in range(args.rounds):
                for name, path in (("trivial", TRIVIAL_PATH), ("mutate", "/mutate")):
                    before = cpu_seconds(workers_of(proc.pid))
                    result = drive(port, ca_file, path, mutate_body, args.connections, args.seconds)
                    used = cpu_seconds(workers_of(proc.pid)) - before
                    result["cpu_us"] = 1e6 * used / max(1, result["requests"])
                    runs[name].append(result)
            memory = {pid: memory_mb(pid) for pid in workers_of(proc.pid)}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()

    threads = f" x {args.threads} threads" if args.server == "gthread" else ""
    print(
        f"runguard bench: {args.server}, {workers} workers{threads}, {args.connections} "
        f"keep-alive TLS connections, {args.rounds} x {args.seconds:g}s per endpoint, "
        f"{os.cpu_count()} cpus (server and load generator share them)"
    )
    print(
        f"{'endpoint':10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7} "
        f"{'TLS hs':>7} {'server CPU/req':>15}"
    )
    best: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        for r in results:
            print(
                f"{name:10} {r['rps']:8.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
                f"{r['failures']:7.0f} {r['handshakes']:7.0f} {r['cpu_us']:12.0f} us"
            )
        best[name] = {
            "rps": statistics.median(r["rps"] for r in results),
            "p99_ms": statistics.median(r["p99_ms"] for r in results),
            "failures": sum(r["failures"] for r in results),
        }
    for pid, (rss, pss) in memory.items():
        print(f"worker {pid}: {rss:.1f} MB resident ({pss:.1f} MB proportional)")

    ratio = best["mutate"]["rps"] / best["trivial"]["rps"]
    worst_rss = max(rss for rss, _ in memory.values())
    checks = [
        (
            f"mutate throughput {ratio:.0%} of trivial (>= {TARGET_RATIO:.0%})",
            ratio >= TARGET_RATIO,
        ),
        (
            f"mutate p99 {best['mutate']['p99_ms']:.2f} ms (<= {TARGET_P99_MS:g} ms)",
            best["mutate"]["p99_ms"] <= TARGET_P99_MS,
        ),
        (
            f"resident memory {worst_rss:.1f} MB per worker (<= {TARGET_RSS_MB:g} MB)",
            worst_rss <= TARGET_RSS_MB,
        ),
        ("no failed request", best["mutate"]["failures"] + best["trivial"]["failures"] == 0),
    ]
    for text, ok in checks:
        print(f"{'ok  ' if ok else 'MISS'} {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
