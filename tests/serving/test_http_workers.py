"""Several gunicorn workers: metrics summed across them, a killed worker, shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from harness import REPO, RunguardServer, Traffic, admission_review, run_pod, sample_policy

from webhook import engine
from webhook.policy.loader import load_policy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def reviews(samples: Samples, endpoint: str, decision: str) -> float:
    key = ("runguard_admission_reviews_total", (("decision", decision), ("endpoint", endpoint)))
    return samples.get(key, 0.0)


def post(session: requests.Session, server: RunguardServer, path: str, body: Any) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body)
    resp = session.post(
        server.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=10
    )
    return resp.status_code


def compliant_pod(directory: Path) -> dict[str, Any]:
    """A run pod as /mutate leaves it under ``sample_policy()``: what /validate allows
    (validation denies whatever mutation would still change)."""
    directory.mkdir()
    for name, text in sample_policy().items():
        (directory / name).write_text(text)
    result: dict[str, Any] = engine.mutate(run_pod(), load_policy(directory)).object
    return result


def test_metrics_add_up_across_workers_after_known_traffic(
    start_runguard: Any, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"stale")  # a previous run's: wiped at start
    server = start_runguard(
        policy=sample_policy(), env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    )
    other = run_pod()
    other["metadata"]["labels"] = {"app": "web"}
    plan: list[tuple[str, Any]] = (
        [("/mutate", admission_review(run_pod()))] * 12
        + [("/mutate", admission_review(other))] * 5
        + [("/validate", admission_review(run_pod(hostPID=True)))] * 4
        + [("/validate", admission_review(compliant_pod(tmp_path / "policy")))] * 3
        + [("/mutate", b"{broken")] * 2
    )
    remaining = list(plan)

    def send(session: requests.Session) -> int:
        path, body = remaining.pop()  # list.pop is atomic under the GIL
        return post(session, server, path, body)

    # fresh connections, so that both workers (whichever accepts) answer some
    with Traffic(server, send, threads=3, fresh=True, max_requests=len(plan)) as traffic:
        server.wait_for(lambda: traffic.count == len(plan), "the planned traffic")
    assert traffic.errors == []
    assert sorted(traffic.results) == sorted([200] * 24 + [400] * 2)
    writers = {p.stem.rsplit("_", 1)[1] for p in metrics_dir.glob("counter_*.db")}
    assert len(writers) == 2 and "1" not in writers  # both workers counted, stale file gone

    for _ in range(3):  # every scrape, whichever worker answers it, sees the sum
        samples = server.metrics()
        assert reviews(samples, "mutate", "patched") == 12
        assert reviews(samples, "mutate", "allowed") == 5
        assert reviews(samples, "mutate", "malformed") == 2
        assert reviews(samples, "validate", "denied") == 4
        assert reviews(samples, "validate", "allowed") == 3
        count = "runguard_admission_review_duration_seconds_count"
        assert samples[(count, (("endpoint", "mutate"),))] == 17
        assert samples[(count, (("endpoint", "validate"),))] == 7
        bucket = "runguard_admission_review_duration_seconds_bucket"
        assert samples[(bucket, (("endpoint", "mutate"), ("le", "10.0")))] == 17
        assert (bucket, (("endpoint", "mutate"), ("le", "0.0005"))) in samples
        violations = "runguard_policy_violations_total"
        key = (violations, (("enforcement", "Deny"), ("rule", "security.host-namespace")))
        assert samples[key] == 4
        assert samples[("runguard_policy_rejected", ())] == 0
        assert samples[("runguard_policy_last_reload_success_timestamp_seconds", ())] > 0


def test_a_killed_worker_is_replaced_and_no_request_fails_after_retry(
    start_runguard: Any, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    server = start_runguard(
        policy=sample_policy(), env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    )
    body = admission_review(run_pod())
    retried: list[int] = []

    def send_with_retry(session: requests.Session) -> int:
        for attempt in range(5):
            try:
                status = post(
                    session if attempt == 0 else server.session(), server, "/mutate", body
                )
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                retried.append(attempt)  # the killed worker dropped it, maybe mid-response
                continue
            return status
        raise AssertionError("failed 5 times")

    def serving() -> list[int]:
        return [p for p in server.worker_pids() if (metrics_dir / f"counter_{p}.db").exists()]

    with Traffic(server, send_with_retry, threads=4, max_seconds=40) as traffic:
        server.wait_for(lambda: traffic.count > 50, "traffic")
        # a worker that has served (each listens on its own socket, so one may not have)
        server.wait_for(lambda: bool(serving()), "a worker that served")
        victim = min(serving())
        os.kill(victim, signal.SIGKILL)
        server.wait_for(
            lambda: victim not in server.worker_pids() and len(server.worker_pids()) == 2,
            "a replacement worker",
        )
        count = traffic.count
        server.wait_for(lambda: traffic.count > count + 100, "traffic after the replacement")
    assert traffic.errors == []
    assert set(traffic.results) == {200}
    assert server.proc is not None and server.proc.poll() is None

    samples = server.metrics()
    served = reviews(samples, "mutate", "patched")
    assert len(traffic.results) <= served <= len(traffic.results) + len(retried)
    assert samples[("runguard_policy_rejected", ())] == 0
    # the dead worker's live gauges are gone (child_exit), its counters kept
    assert not list(metrics_dir.glob(f"gauge_live*_{victim}.db"))
    assert list(metrics_dir.glob(f"counter_{victim}.db"))


def read_response(tls: ssl.SSLSocket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response (status line and headers, body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = tls.recv(65536)
        assert chunk, body
        body += chunk
    return head, body


def test_shutdown_finishes_the_review_in_flight(start_runguard: Any, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = start_runguard(policy=sample_policy(), env={"TMPDIR": str(scratch)})
    assert [p.name[:17] for p in scratch.iterdir()] == ["runguard-metrics-"]
    assert server.proc is not None
    body = json.dumps(admission_review(run_pod())).encode()
    request = (
        f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    context = ssl.create_default_context(cafile=str(server.ca_file))
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(request)  # a first review: the connection now belongs to a worker
            head, _ = read_response(tls)
            assert head.startswith(b"HTTP/1.1 200")
            tls.sendall(request[:-100])  # the next review is being received...
            server.proc.send_signal(signal.SIGTERM)
            server.wait_for(lambda: "Handling signal: term" in server.stderr, "SIGTERM")
            tls.sendall(request[-100:])  # ...and completes after the shutdown began
            head, payload = read_response(tls)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert json.loads(payload)["response"]["allowed"] is True
    assert server.proc.wait(timeout=40) == 0
    assert list(scratch.iterdir()) == []  # the metrics directory went with the server


def test_sigterm_with_a_shutdown_delay_drains_before_it_stops(start_runguard: Any) -> None:
    """``--shutdown-delay``: told to stop, the server keeps accepting and answering,
    closes each connection after its answer (kept-alive ones too) and says ``draining``
    on /readyz, so the apiserver's next connection goes to another replica; a second
    SIGTERM to a worker stops it at once. The delay is long so no clock is raced."""
    server = start_runguard(policy=sample_policy(), env={"RUNGUARD_SHUTDOWN_DELAY": "120"})
    assert server.proc is not None
    kept = server.session()
    before = kept.get(server.url + "/readyz", timeout=10)
    assert before.status_code == 200 and before.headers.get("Connection") != "close"
    workers = server.worker_pids()

    server.proc.send_signal(signal.SIGTERM)
    server.wait_for(lambda: server.stderr.count("draining for 120s") == len(workers), "drain")

    again = kept.get(server.url + "/readyz", timeout=10)  # the connection kept before
    assert again.status_code == 503 and again.headers["Connection"] == "close"
    assert again.json()["status"] == "draining"
    fresh = server.session()  # a new connection is still accepted, and answered
    answer = fresh.post(server.url + "/mutate", json=admission_review(run_pod()), timeout=10)
    assert answer.status_code == 200 and answer.headers["Connection"] == "close"
    assert answer.json()["response"]["allowed"] is True
    assert server.proc.poll() is None and server.worker_pids() == workers

    for pid in workers:  # a second SIGTERM: no more draining
        os.kill(pid, signal.SIGTERM)
    assert server.proc.wait(timeout=40) == 0
    assert "drained; stopping" not in server.stderr


def test_the_shutdown_delay_ends_by_itself(start_runguard: Any) -> None:
    server = start_runguard(policy=sample_policy(), env={"RUNGUARD_SHUTDOWN_DELAY": "1"})
    assert server.proc is not None
    workers = server.worker_pids()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    assert server.stderr.count("drained; stopping") == len(workers)
    with pytest.raises(requests.ConnectionError):  # nothing listens any more
        requests.get(server.url + "/healthz", verify=str(server.ca_file), timeout=5)


def test_without_a_shutdown_delay_sigterm_stops_at_once(start_runguard: Any) -> None:
    server = start_runguard(policy=sample_policy())
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=40) == 0
    assert "draining" not in server.stderr


def test_gunicorn_conf_py_runs_the_same_server(start_runguard: Any) -> None:
    server = start_runguard(policy=sample_policy(), gunicorn_conf=True)
    assert server.get("/readyz").json()["policy"]["name"] == "http-test"
    answer = server.review("/mutate", run_pod())
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    assert server.metrics()[("runguard_certificate_expiry_timestamp_seconds", ())] > 0
    assert "Using worker: RunguardWorker" in server.stderr  # gthread, with JSON errors


def test_serve_refuses_missing_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNGUARD_")}
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "-p", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "RUNGUARD_CERT_FILE" in done.stderr
