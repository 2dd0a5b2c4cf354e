"""What must not take decisions down: logging, bad clients, bad requests (a real
``runguard serve``: gunicorn over TLS)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness import (
    STOP_TIMEOUT,
    RunguardServer,
    admission_review,
    peer_certificate,
    run_pod,
    sample_policy,
)

REVIEWS = 200  # well over a 4 KiB pipe and a 16-line queue of audit lines


@contextmanager
def served_with(
    monkeypatch: pytest.MonkeyPatch, *, close_stdout: bool = False, fd: int | None = None
) -> Iterator[None]:
    """Servers started inside get stdout closed, or stdout and stderr on ``fd``.

    The fixtures of conftest start ``runguard serve`` with ``subprocess.Popen``; this
    changes only what the child's stdout and stderr are.
    """
    real = subprocess.Popen

    def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if close_stdout:  # as `runguard serve >&-`: Python starts with sys.stdout None
            cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
        if fd is not None:
            kwargs.update(stdout=fd, stderr=fd)
        return real(cmd, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", popen)
        yield


def dropped(server: RunguardServer, log: str) -> float:
    return server.metrics().get(("runguard_log_lines_dropped_total", (("log", log),)), 0.0)


def sigterm_exit_code(server: RunguardServer) -> int:
    """SIGTERM, then the exit code: the wait is bounded, a hang fails the test."""
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"runguard serve still running {STOP_TIMEOUT:.0f} s after SIGTERM")


# ----------------------------------------------------------------------- logging


def test_with_stdout_closed_reviews_are_answered_and_the_lost_audit_said(
    start_runguard: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with served_with(monkeypatch, close_stdout=True):
        server = start_runguard(policy=sample_policy(), workers=1)
    for _ in range(5):
        assert server.review("/mutate", run_pod())["allowed"] is True
    ready = server.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"  # degraded logging is not an outage...
    audit = body["logging"]["audit"]  # ...but it is said
    assert body["logging"]["status"] == "degraded" and audit["status"] == "degraded"
    assert audit["dropped"] >= 5 and "closed" in audit["reason"]
    assert dropped(server, "audit") >= 5
    assert sigterm_exit_code(server) == 0


def test_with_stdout_and_stderr_a_pipe_nobody_reads_the_server_keeps_deciding(
    start_runguard: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # full after a few lines
    try:
        with served_with(monkeypatch, fd=write_end):
            server = start_runguard(
                policy=sample_policy(), workers=1, env={"RUNGUARD_LOG_QUEUE": "16"}
            )
        os.close(write_end)  # the server's copies stay open; nobody ever reads them
        write_end = -1
        session = server.session()
        for _ in range(REVIEWS):
            resp = server.post("/validate", admission_review(run_pod()), session=session)
            assert resp.status_code == 200 and resp.json()["response"]["allowed"] is False
        assert server.get("/healthz").status_code == 200  # on a fresh connection too
        with server.session() as fresh:
            assert server.get("/healthz", session=fresh).status_code == 200
        body = server.get("/readyz").json()
        assert body["status"] == "ready" and body["logging"]["status"] == "degraded"
        assert body["logging"]["audit"]["dropped"] > 0
        assert {"audit", "server"} <= set(body["logging"])  # stderr: reported too
        assert dropped(server, "audit") > 0
        assert sigterm_exit_code(server) == 0
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


# ----------------------------------------------------- errors gunicorn answers itself


def exchange(server: RunguardServer, data: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send raw bytes over TLS; the status line, headers and body of the answer."""
    context = ssl.create_default_context(cafile=str(server.ca_file))
    received = b""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(data)
            for _ in range(1000):  # until the server closes (Connection: close)
                try:
                    chunk = tls.recv(65536)
                except (ssl.SSLError, ConnectionResetError):
                    break
                if not chunk:
                    break
                received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


HEADERS_101 = b"".join(b"X-H%d: v\r\n" % i for i in range(101))


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /%s HTTP/1.1\r\nHost: x\r\n\r\n" % (b"a" * 5000), 414),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + HEADERS_101 + b"\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    ],
    ids=["bad-request-line", "uri-too-long", "too-many-headers", "header-too-large"],
)
def test_errors_gunicorn_answers_itself_are_the_contracts_json(
    runguard_server: RunguardServer, request_bytes: bytes, status: int
) -> None:
    line, headers, body = exchange(runguard_server, request_bytes)
    assert line.startswith(b"HTTP/1.1 %d " % status), line
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)
    assert error["code"] == status and error["error"] and error["message"]
    assert len(error["message"]) <= 200  # never the whole bad request echoed back
    assert runguard_server.get("/healthz").status_code == 200


def test_a_review_whose_object_is_not_of_its_kind_is_refused(
    runguard_server: RunguardServer,
) -> None:
    review = admission_review(run_pod(hostPID=True))
    review["request"]["kind"]["kind"] = "ConfigMap"  # a Pod that claims to be a ConfigMap
    resp = runguard_server.post("/validate", review)
    assert resp.status_code == 400 and resp.headers["Content-Type"] == "application/json"
    message = resp.json()["message"]
    assert "'Pod'" in message and "'ConfigMap'" in message


# ------------------------------------------------------------------ certificates


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def test_a_worker_forked_while_the_certificate_is_missing_serves_the_last_good_one(
    start_runguard: Any,
) -> None:
    server = start_runguard(policy=sample_policy(), workers=1)
    master = server.pid
    reloaded = rf"\[{master}\] \[INFO\] runguard\.server: certificate \S+ reloaded"
    refused = rf"\[{master}\] \[ERROR\] runguard\.server: certificate \S+ not reloaded"
    cert, key, serial = server.ca.issue(days=3)
    write_atomically(server.key_file, key)
    write_atomically(server.cert_file, cert)
    server.wait_for(lambda: count(reloaded, server.stderr) == 1, "the master's reload")
    server.wait_for(
        lambda: peer_certificate("127.0.0.1", server.port, server.ca_file).serial_number == serial,
        "the renewed certificate served",
    )

    before = count(refused, server.stderr)
    server.cert_file.unlink()  # gone, e.g. a botched secret update
    server.wait_for(lambda: count(refused, server.stderr) > before, "the master noticing")
    (victim,) = server.worker_pids()
    os.kill(victim, signal.SIGKILL)
    server.wait_for(
        lambda: len(server.worker_pids()) == 1 and victim not in server.worker_pids(),
        "a new worker",
    )
    for _ in range(3):  # the new worker: the renewed certificate, not the one of the start
        served = peer_certificate("127.0.0.1", server.port, server.ca_file)
        assert served.serial_number == serial != server.serial
    assert server.review("/mutate", run_pod())["allowed"] is True
