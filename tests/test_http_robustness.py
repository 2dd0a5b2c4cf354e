"""What must not take decisions down: logging, bad clients, bad requests (a real
``runguard serve``: gunicorn over TLS)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import (
    STOP_TIMEOUT,
    RunguardServer,
    admission_review,
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
