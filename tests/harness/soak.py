"""Soak: a long mixed load on one runguard server while it is disturbed.

``bench/soak.py`` is the long run, with its figures; ``tests/serving/test_soak.py`` a short form.

``soaked_server`` starts ``runguard serve`` as the benchmarks' default configuration
("runguard 2x2": ``RunguardWorker``, 2 workers x 2 threads, TLS, the
repository's ``policies/`` in a ConfigMap-style volume) through the tests' harness
(``RunguardServer``), with its stdout (the audit log) a FIFO read slowly: about 10 KB/s
(``SlowSink``), far less than the traffic writes. Then it drives a fixed mix of reviews
(``mix()``) from client processes: some over keep-alive TLS connections, some on a new TLS
connection each, every request with a fresh ``uid`` (``soak()``):

* ``/mutate`` of the typical run Pod (``workloads.typical_run_pod``): allowed, with a patch;
* ``/validate`` of a compliant run Pod: allowed;
* ``/validate`` of the typical run Pod as submitted (root, privileged sidecar, foreign
  secret) and of one with ``hostPID``: denied;
* malformed reviews (not JSON, wrong apiVersion, empty uid, a Pod claiming to be a
  ConfigMap) to both endpoints: a 400 with a JSON error.

Meanwhile, in the background: ``slow`` slow and idle connections
(``slow_clients.SlowClients``) held open and opened again every ``HOLD_SECONDS``; the
policy swapped ``reloads`` times between two versions that differ only in
``runAsUser`` (8877 / 8878, seen in the patches: both versions decide the mix alike);
every ``sample_every`` seconds each worker's resident memory, open descriptors and
threads.

Counted: requests sent, answered, unanswered (connection error, timeout, closed before
the response) by reason, answers by status, 5xx, wrong answers (an answer that is not
the expected one: a decision flipped, a wrong ``uid``, a 400 that is not JSON...) with
the first examples, in the ``Report``; ``print_report`` prints the samples, growth from
the first sample to the last and latency p50/p99 (keep-alive and new connections
apart). Bounded in count (``requests``) and time (``seconds``).
"""

from __future__ import annotations

import base64
import http.client
import json
import multiprocessing as mp
import os
import random
import re
import ssl
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from webhook.policy.loader import load_policy
from webhook.serving import admission
from webhook.serving.admission import parse_review

from . import slow_clients
from .inputs import REPO, policy_files
from .polling import eventually
from .server import RunguardServer
from .workloads import memory_mb, typical_run_pod

UID = "00000000-0000-4000-8000-000000000000"  # replaced by a fresh uuid4 in each request
HEADERS = {"Content-Type": "application/json"}
TIMEOUT = 10.0  # seconds: the apiserver's default (and largest) webhook timeout
ADOPT_SECONDS = 30.0  # a swapped policy is served by every worker within this
HOLD_SECONDS = 15.0  # slow connections are held this long, then opened again
USERS = (8877, 8878)  # runAsUser of the two policy versions swapped in
SINK_BYTES_PER_S = 10_240  # the slow log reader: 1 KiB every 0.1 s
MAX_REQUESTS, MAX_SECONDS = 1_000_000, 1800.0
MAX_EXAMPLES = 5  # wrong answers kept as examples


# ------------------------------------------------------------------------ the mix


@dataclass(frozen=True)
class Kind:
    """One kind of request of the mix and the answer it must get."""

    name: str
    path: str
    body: bytes  # holds ``UID`` where the request's uid goes
    expect: str  # "allowed", "denied" or "malformed" (400, a JSON error)
    weight: int


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    """A CREATE review of ``pod`` by the platform's service account, uid ``UID``."""
    review: dict[str, Any] = json.loads(
        slow_clients.review_of(pod, user="system:serviceaccount:dhcore:core")
    )
    review["request"]["uid"] = UID
    return review


def _bytes(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def compliant_pod() -> dict[str, Any]:
    """The typical run Pod without its sidecar as ``/mutate`` makes it: ``/validate``
    allows it. (With the sidecar it is denied: the profile's 64Gi limit plus the
    sidecar's default is over the run's 64Gi maximum.)"""
    pod = typical_run_pod()
    del pod["spec"]["containers"][1:]
    request = parse_review(_bytes(_review(pod)))
    decision = admission.review("mutate", request, load_policy(REPO / "policies")).decision
    assert decision is not None and decision.allowed, "the policy does not admit the run Pod"
    mutated: dict[str, Any] = decision.object
    return mutated


def mix() -> list[Kind]:
    """The kinds of request the clients send, each with its weight in the mix."""
    typical = typical_run_pod()
    compliant = compliant_pod()
    host_pid = {**compliant, "spec": {**compliant["spec"], "hostPID": True}}
    v1 = _review(typical)
    claims_configmap = _review(typical)
    claims_configmap["request"]["kind"]["kind"] = "ConfigMap"
    return [
        Kind("mutate typical", "/mutate", _bytes(v1), "allowed", 8),
        Kind("validate compliant", "/validate", _bytes(_review(compliant)), "allowed", 5),
        Kind("validate typical", "/validate", _bytes(v1), "denied", 3),
        Kind("validate hostPID", "/validate", _bytes(_review(host_pid)), "denied", 1),
        Kind("not JSON", "/validate", _bytes(v1)[:300], "malformed", 1),
        Kind(
            "v1beta1",
            "/mutate",
            _bytes({**v1, "apiVersion": "admission.k8s.io/v1beta1"}),
            "malformed",
            1,
        ),
        Kind("empty uid", "/validate", _bytes(v1).replace(UID.encode(), b""), "malformed", 1),
        Kind("Pod as ConfigMap", "/mutate", _bytes(claims_configmap), "malformed", 1),
    ]


def sequence(kinds: list[Kind], seed: int = 13) -> list[int]:
    """The order requests take their kind in: each kind by its weight, shuffled."""
    order = [i for i, kind in enumerate(kinds) for _ in range(kind.weight)]
    random.Random(seed).shuffle(order)
    return order


def policy_versions() -> list[dict[str, str]]:
    """The repository's policies as they are, and with ``runAsUser`` 8878."""
    first = policy_files(None)
    second = dict(first)
    text = first["runpolicy.yaml"]
    second["runpolicy.yaml"] = re.sub(r"runAsUser: 8877\b", f"runAsUser: {USERS[1]}", text)
    assert second["runpolicy.yaml"] != text, "policies/runpolicy.yaml: no runAsUser 8877"
    return [first, second]


# ----------------------------------------------------------------------- answers


def _run_as_user(patch: str) -> int | None:
    for op in json.loads(base64.b64decode(patch)):
        if op.get("path") == "/spec/securityContext/runAsUser":
            value = op.get("value")
            return value if isinstance(value, int) else None
    return None


def check(kind: Kind, status: int, content_type: str | None, data: bytes, uid: str) -> str:
    """What is wrong with this answer to a request of ``kind``: "" when it is right;
    else a reason. A policy version's ``runAsUser`` is returned as ``"user N"``."""
    if kind.expect == "malformed":
        if status != 400:
            return f"status {status}"
        if content_type != "application/json":
            return f"400 as {content_type}"
        error = json.loads(data)
        return "" if error.get("code") == 400 and error.get("message") else "400 without error"
    if status != 200:
        return f"status {status}"
    doc = json.loads(data)
    answer = doc.get("response") or {}
    if doc.get("kind") != "AdmissionReview" or answer.get("uid") != uid:
        return "not the review's answer (kind or uid)"
    allowed = answer.get("allowed")
    if allowed is not (kind.expect == "allowed"):
        return f"allowed {allowed}"
    if kind.path == "/mutate":
        user = _run_as_user(answer.get("patch", "W10="))
        return f"user {user}" if user in USERS else f"patch sets runAsUser {user}"
    return ""


@dataclass
class Tally:
    """What one client saw; added up over the clients."""

    sent: int = 0
    unanswered: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    answered_by_kind: Counter[str] = field(default_factory=Counter)
    wrong_by_kind: Counter[str] = field(default_factory=Counter)
    users: Counter[int] = field(default_factory=Counter)  # runAsUser in /mutate patches
    examples: list[str] = field(default_factory=list)
    keepalive_s: list[float] = field(default_factory=list)
    fresh_s: list[float] = field(default_factory=list)
    connections: int = 0

    def add(self, other: Tally) -> None:
        self.sent += other.sent
        self.connections += other.connections
        for mine, theirs in (
            (self.unanswered, other.unanswered),
            (self.statuses, other.statuses),
            (self.answered_by_kind, other.answered_by_kind),
            (self.wrong_by_kind, other.wrong_by_kind),
            (self.users, other.users),
        ):
            mine.update(theirs)  # type: ignore[arg-type]
        self.examples += other.examples[: MAX_EXAMPLES - len(self.examples)]
        self.keepalive_s += other.keepalive_s
        self.fresh_s += other.fresh_s

    def note(self, kind: Kind, status: int, reason: str) -> None:
        self.statuses[status] += 1
        self.answered_by_kind[kind.name] += 1
        if reason.startswith("user "):
            self.users[int(reason.split()[1])] += 1
        elif reason and status < 500:
            self.wrong_by_kind[kind.name] += 1
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append(f"{kind.name} {kind.path}: {reason}")

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    @property
    def errors_5xx(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


# ------------------------------------------------------------------------ clients


def _client(
    port: int,
    ca_file: str,
    fresh: bool,
    kinds: list[Kind],
    issued: Any,
    total: int,
    start_at: float,
    deadline: float,
    out: Any,
) -> None:
    """One client process: requests one after the other, on one keep-alive connection
    (``fresh`` False) or a new connection each, until ``total`` are issued by all the
    clients together or the (wall-clock) ``deadline``."""
    context = ssl.create_default_context(cafile=ca_file)
    order = sequence(kinds)
    tally = Tally()
    conn: http.client.HTTPSConnection | None = None
    while time.time() < start_at:
        time.sleep(0.005)
    while time.time() < deadline:
        with issued.get_lock():
            number = issued.value
            if number >= total:
                break
            issued.value = number + 1
        kind = kinds[order[number % len(order)]]
        uid = str(uuid.uuid4())
        if conn is None:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT, context=context)
            tally.connections += 1
        tally.sent += 1
        start = time.perf_counter()
        try:
            conn.request("POST", kind.path, kind.body.replace(UID.encode(), uid.encode()), HEADERS)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            tally.unanswered[type(exc).__name__] += 1
            conn.close()
            conn = None
            continue
        (tally.fresh_s if fresh else tally.keepalive_s).append(time.perf_counter() - start)
        try:
            reason = check(kind, resp.status, resp.getheader("Content-Type"), data, uid)
        except ValueError as exc:  # not JSON where JSON was due
            reason = f"unreadable answer: {exc}"
        tally.note(kind, resp.status, reason)
        if fresh or resp.will_close:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    out.send(tally)
    out.close()


# --------------------------------------------------------------- the disturbances


class SlowSink:
    """A FIFO for the server's stdout, read at ``rate`` bytes/s (ten reads a second)."""

    def __init__(self, path: Path, rate: int = SINK_BYTES_PER_S) -> None:
        self.path = path
        self.chunk = max(1, rate // 10)
        os.mkfifo(path)
        # opened first, without blocking, so that the server's open for writing returns
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.read_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.read_bytes += len(os.read(self.fd, self.chunk))
            except BlockingIOError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self.fd)


class Background:
    """Threads that disturb the server while the clients run, and one that samples it."""

    def __init__(
        self,
        server: RunguardServer,
        issued: Any,
        total: int,
        seconds: float,
        slow: int,
        reloads: int,
        sample_every: float,
    ) -> None:
        self.server = server
        self.issued = issued
        self.total, self.seconds = total, seconds
        self.slow, self.reloads, self.sample_every = slow, reloads, sample_every
        self.samples: list[Sample] = []
        self.echo = False
        self.swaps = self.adopted = 0
        self.slow_held = self.slow_closed_by_server = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._guarded, args=(run,), daemon=True)
            for run in (self._sample, self._hold_slow, self._swap)
        ]

    def __enter__(self) -> Background:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=slow_clients.OPEN_SECONDS + HOLD_SECONDS + 10)

    def _guarded(self, run: Callable[[], None]) -> None:
        try:
            run()
        except Exception as exc:  # reported, and a failure of the soak
            self.errors.append(f"{run.__name__}: {exc!r}")

    def _progress(self) -> float:
        """How far the run is, by count or by time, whichever is further."""
        by_time = (time.monotonic() - self._started) / self.seconds
        return max(float(self.issued.value) / self.total, by_time)

    def _sample(self) -> None:
        while True:
            taken = sample(self.server, self.issued.value, self._started)
            self.samples += taken
            if self.echo and taken:  # progress of a long run, on stderr
                usage = ", ".join(f"{s.rss_mb:.1f} MB {s.fds} fds {s.threads} thr" for s in taken)
                print(
                    f"{taken[0].seconds:5.0f} s {taken[0].requests:8d} requests: {usage}",
                    file=sys.stderr,
                    flush=True,
                )
            if self._stop.wait(self.sample_every):
                return

    def _hold_slow(self) -> None:
        while self.slow and not self._stop.is_set():
            with slow_clients.SlowClients(
                self.server.port, str(self.server.ca_file), self.slow
            ) as held:
                self.slow_held += len(held.sockets)
                self._stop.wait(HOLD_SECONDS)
                self.slow_closed_by_server += held.closed_by_server()

    def _serving(self, digest: str) -> bool:
        return set(served_digests(self.server, 8).values()) == {digest}

    def _swap(self) -> None:
        versions = policy_versions()
        volume = self.server.policy_volume
        assert volume is not None, "the server's policy is not a volume"
        for swap in range(1, self.reloads + 1):
            while self._progress() < swap / (self.reloads + 1):
                if self._stop.wait(0.05):
                    return
            volume.update(versions[swap % 2])
            self.swaps += 1
            digest = load_policy(self.server.policy_dir).digest
            eventually(
                f"every worker serving swap {swap}", partial(self._serving, digest), ADOPT_SECONDS
            )
            self.adopted += 1


# ----------------------------------------------------------------------- samples


@dataclass(frozen=True)
class Sample:
    seconds: float
    pid: int
    rss_mb: float
    fds: int
    threads: int
    requests: int


def worker_usage(pid: int) -> tuple[float, int, int]:
    """(resident MB, open descriptors, threads) of one process."""
    rss, _ = memory_mb(pid)
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M)[1])  # type: ignore[index]
    return rss, fds, threads


def sample(server: RunguardServer, requests: int, started: float) -> list[Sample]:
    out = []
    for pid in sorted(server.worker_pids()):
        try:
            usage = worker_usage(pid)
        except (OSError, TypeError):  # the worker just exited
            continue
        out.append(Sample(time.monotonic() - started, pid, *usage, requests))
    return out


def by_worker(samples: list[Sample]) -> dict[int, list[Sample]]:
    workers: dict[int, list[Sample]] = {}
    for one in samples:
        workers.setdefault(one.pid, []).append(one)
    return workers


# ------------------------------------------------------------------------- a run


@dataclass
class Report:
    tally: Tally
    samples: list[Sample]
    baseline: dict[int, tuple[float, int, int]]  # per worker, after the warm-up
    seconds: float
    swaps: int
    adopted: int  # swaps every worker was seen serving
    slow_held: int
    slow_closed_by_server: int
    background_errors: list[str]
    workers_before: set[int]
    workers_after: set[int]
    clients_lost: int  # client processes that never reported (their requests unknown)
    issued: int  # requests the clients took a number for

    @property
    def unanswered(self) -> int:
        """Requests issued and not answered, those of a lost client included."""
        return self.issued - self.tally.answered

    @property
    def wrong(self) -> int:
        return sum(self.tally.wrong_by_kind.values())

    def figures(self) -> dict[str, Any]:
        latencies = sorted(self.tally.keepalive_s + self.tally.fresh_s)
        first = {pid: runs[0] for pid, runs in by_worker(self.samples).items()}
        last = {pid: runs[-1] for pid, runs in by_worker(self.samples).items()}
        return {
            "requests": self.issued,
            "answered": self.tally.answered,
            "unanswered": self.unanswered,
            "errors_5xx": self.tally.errors_5xx,
            "wrong": self.wrong,
            "rss_mb_start": round(max((s.rss_mb for s in first.values()), default=0), 1),
            "rss_mb_end": round(max((s.rss_mb for s in last.values()), default=0), 1),
            "fds_start": max((s.fds for s in first.values()), default=0),
            "fds_end": max((s.fds for s in last.values()), default=0),
            "threads_start": max((s.threads for s in first.values()), default=0),
            "threads_end": max((s.threads for s in last.values()), default=0),
            "p50_ms": round(1000 * percentile(latencies, 0.50), 2),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 2),
            "keepalive_p99_ms": round(1000 * percentile(sorted(self.tally.keepalive_s), 0.99), 2),
            "fresh_p99_ms": round(1000 * percentile(sorted(self.tally.fresh_s), 0.99), 2),
            "rps": round(self.tally.answered / self.seconds, 1) if self.seconds else 0.0,
            "seconds": round(self.seconds, 1),
            "reloads": self.swaps,
            "reloads_adopted": self.adopted,
            "slow_held": self.slow_held,
            "worker_restarts": len(self.workers_after - self.workers_before),
        }


def percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def warm_up(server: RunguardServer, count: int) -> None:
    """``count`` reviews at once on new connections: every worker's threads started."""
    results = slow_clients.reviews(server.port, str(server.ca_file), count, TIMEOUT)
    if not all(ok for ok, _ in results):
        raise RuntimeError(f"warm-up: {sum(not ok for ok, _ in results)} reviews failed")


def soak(
    server: RunguardServer,
    *,
    requests: int,
    seconds: float,
    keepalive: int = 4,
    fresh: int = 1,
    slow: int = 64,
    reloads: int = 4,
    sample_every: float = 10.0,
    echo: bool = False,
) -> Report:
    """Drive the mix at ``server`` (bounded by ``requests`` and ``seconds``) while slow
    clients, policy swaps and samples run beside it."""
    requests = max(1, min(requests, MAX_REQUESTS))
    seconds = max(1.0, min(seconds, MAX_SECONDS))
    warm_up(server, 4 * len(server.worker_pids()))
    time.sleep(0.5)  # the warm-up's connections closed on the server's side
    samples = sample(server, 0, time.monotonic())
    # Workers are the same program: a worker the warm-up's few requests never reached has
    # not opened its pool's threads and connections yet, so the warmest worker's counts
    # are every worker's baseline (a leak still shows as growth past them).
    fds = max((s.fds for s in samples), default=0)
    threads = max((s.threads for s in samples), default=0)
    baseline = {s.pid: (s.rss_mb, fds, threads) for s in samples}
    workers_before = server.worker_pids()
    kinds = mix()
    ctx = mp.get_context("fork")
    issued = ctx.Value("q", 0)
    start_at = time.time() + 0.5
    deadline = start_at + seconds
    pipes, procs = [], []
    for index in range(keepalive + fresh):  # forked before the background threads start
        recv, send = ctx.Pipe(duplex=False)
        args = (server.port, str(server.ca_file), index >= keepalive, kinds, issued, requests)
        proc = ctx.Process(target=_client, args=(*args, start_at, deadline, send), daemon=True)
        proc.start()
        send.close()
        pipes.append(recv)
        procs.append(proc)
    tally, lost = Tally(), 0
    background = Background(server, issued, requests, seconds, slow, reloads, sample_every)
    background.echo = echo
    with background:
        for recv, proc in zip(pipes, procs, strict=True):
            remaining = max(0.0, deadline - time.time()) + TIMEOUT + 30
            try:
                reported = recv.poll(remaining)
                if reported:
                    tally.add(recv.recv())
            except EOFError:  # the process died before it reported
                reported = False
            lost += not reported
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        elapsed = time.time() - start_at
    background.samples += sample(server, issued.value, background._started)
    return Report(
        tally=tally,
        samples=background.samples,
        baseline=baseline,
        seconds=elapsed,
        swaps=background.swaps,
        adopted=background.adopted,
        slow_held=background.slow_held,
        slow_closed_by_server=background.slow_closed_by_server,
        background_errors=background.errors,
        workers_before=workers_before,
        workers_after=server.worker_pids(),
        clients_lost=lost,
        issued=issued.value,
    )


# ------------------------------------------------------------------------ server


@contextmanager
def soaked_server(
    workdir: Path,
    *,
    workers: int = 2,
    threads: int = 2,
    log_queue: int | None = None,
    sink_rate: int = SINK_BYTES_PER_S,
) -> Iterator[tuple[RunguardServer, SlowSink]]:
    """``runguard serve`` with the repository's policies in a ConfigMap-style volume and
    its stdout (the audit log) a FIFO read slowly; stopped on the way out."""
    env = {"RUNGUARD_THREADS": str(threads)}
    if log_queue is not None:
        env["RUNGUARD_LOG_QUEUE"] = str(log_queue)
    server = RunguardServer(
        workdir, policy=policy_versions()[0], workers=workers, env=env, atomic=True
    )
    sink = SlowSink(workdir / "stdout.fifo", sink_rate)
    server.stdout_path = sink.path  # open() for writing returns: the reader is there
    try:
        server.start()
        yield server, sink
    finally:
        server.stop()
        sink.close()


def served_digests(server: RunguardServer, connections: int) -> dict[int, str]:
    """The policy digest each worker reports in ``/readyz``, asked on new connections."""
    heard = {}
    for _ in range(connections):
        with server.session() as session:
            body = server.get("/readyz", session=session).json()
            heard[body["worker"]] = body["policy"]["digest"]
    return heard


def audit_dropped(server: RunguardServer) -> float:
    key = ("runguard_log_lines_dropped_total", (("log", "audit"),))
    return float(server.metrics().get(key, 0.0))


# ------------------------------------------------------------------------ output


def print_report(report: Report, dropped: float, sink_read: int) -> None:
    tally = report.tally
    print(f"{'s':>7} {'worker':>8} {'RSS MB':>8} {'fds':>5} {'threads':>8} {'requests':>9}")
    for one in report.samples:
        print(
            f"{one.seconds:7.0f} {one.pid:8d} {one.rss_mb:8.1f} {one.fds:5d} "
            f"{one.threads:8d} {one.requests:9d}"
        )
    for pid, runs in by_worker(report.samples).items():
        a, b = runs[0], runs[-1]
        print(
            f"worker {pid}: RSS {a.rss_mb:.1f} -> {b.rss_mb:.1f} MB ({b.rss_mb - a.rss_mb:+.1f}), "
            f"fds {a.fds} -> {b.fds} ({b.fds - a.fds:+d}), "
            f"threads {a.threads} -> {b.threads} ({b.threads - a.threads:+d})"
        )
    print(f"answers by status: {dict(sorted(tally.statuses.items()))}")
    print(f"answers by kind: {dict(sorted(tally.answered_by_kind.items()))}")
    print(f"unanswered by reason: {dict(tally.unanswered) or 'none'}")
    print(f"wrong by kind: {dict(tally.wrong_by_kind) or 'none'}")
    for example in tally.examples:
        print(f"  wrong: {example}")
    for name, values in (("keep-alive", tally.keepalive_s), ("new connection", tally.fresh_s)):
        ordered = sorted(values)
        print(
            f"latency {name}: {len(ordered)} requests, p50 {1000 * percentile(ordered, 0.5):.2f}"
            f" ms, p99 {1000 * percentile(ordered, 0.99):.2f} ms"
        )
    print(
        f"connections opened by the clients: {tally.connections}; "
        f"policy swaps: {report.swaps} ({report.adopted} seen served by every worker); "
        f"runAsUser in patches: {dict(tally.users)}"
    )
    print(
        f"slow connections held: {report.slow_held}, closed by the server before the "
        f"client gave up: {report.slow_closed_by_server}"
    )
    print(f"audit log: {sink_read} bytes read by the slow reader, {dropped:.0f} lines dropped")
    if report.background_errors or report.clients_lost:
        print(f"background errors: {report.background_errors}; clients lost: {report.clients_lost}")
