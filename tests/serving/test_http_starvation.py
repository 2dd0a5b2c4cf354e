"""No client can starve the server: real gunicorn, real TLS, real reviews.

64 connections that send nothing, half a ClientHello, half a request head or half a
body are held open (``harness.slow_clients``) while real ``/validate`` reviews, each
on a new TLS connection as the apiserver opens them, must all be answered. Stock
``gthread`` failed 6 of 10 with 4 such connections and 10 of 10 with 24. Bounds are
counts and generous times, never performance thresholds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from harness import RunguardServer, eventually, slow_clients

from webhook.serving.worker import REQUEST_TIMEOUT  # noqa: E402

SLOW = 64
REVIEWS = 16
REVIEW_TIMEOUT = 10.0  # the apiserver's default webhook timeout


@pytest.mark.slow
def test_slow_and_idle_connections_do_not_starve_reviews(
    start_runguard: Callable[..., RunguardServer],
) -> None:
    server = start_runguard(workers=2)
    ca = str(server.ca_file)
    with slow_clients.SlowClients(server.port, ca, SLOW) as held:
        assert len(held.sockets) == SLOW
        time.sleep(0.5)
        results = slow_clients.reviews(server.port, ca, REVIEWS, REVIEW_TIMEOUT)
        assert [ok for ok, _ in results] == [True] * REVIEWS
        # while they are still open: the server is not waiting on them with a thread
        assert held.closed_by_server() < SLOW
        # and it closes every one that never sends a whole request, in bounded time
        eventually(
            "the server closed every slow connection",
            lambda: held.closed_by_server() == SLOW,
            REQUEST_TIMEOUT + 20,
            interval=0.5,
        )
    # the server still answers afterwards, with the same workers
    assert all(ok for ok, _ in slow_clients.reviews(server.port, ca, 4, REVIEW_TIMEOUT))
    assert len(server.worker_pids()) == 2


JSON = {"Content-Type": "application/json"}


def test_expect_continue_and_chunked_bodies_are_answered(runguard_server: RunguardServer) -> None:
    body = slow_clients.review_body("expect")
    answer = runguard_server.post("/validate", body, headers={**JSON, "Expect": "100-continue"})
    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is True
    chunked = runguard_server.post("/validate", iter([body[:100], body[100:]]), headers=JSON)
    assert chunked.status_code == 200, chunked.text
    assert chunked.json()["response"]["allowed"] is True


def test_keepalive_connections_spread_over_workers(runguard_server: RunguardServer) -> None:
    """Each worker listens on a socket of its own: new connections do not all land on
    whichever worker woke first."""
    seen: set[int] = set()
    for _ in range(40):
        with runguard_server.session() as session:
            seen.add(runguard_server.get("/readyz", session=session).json()["worker"])
        if len(seen) == 2:
            break
    assert len(seen) == 2


def test_pipelined_requests_are_all_answered(runguard_server: RunguardServer) -> None:
    """Two reviews in one write on one connection: the loop reads both, a thread answers
    each (the second from what the first read left over)."""
    import socket
    import ssl

    body = slow_clients.review_body("pipelined")
    head = (
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    context = ssl.create_default_context(cafile=str(runguard_server.ca_file))
    with socket.create_connection(("127.0.0.1", runguard_server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall((head + body) * 2)
            data = b""
            for _ in range(1000):
                if data.count(b"HTTP/1.1 200") == 2 and data.rstrip().endswith(b"}}"):
                    break
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 2, data[:300]


@pytest.mark.slow
def test_a_server_held_by_slow_connections_stops_in_bounded_time(
    start_runguard: Callable[..., RunguardServer],
) -> None:
    """SIGTERM: connections that sent nothing close at once, those with half a request
    at their deadline; the workers never wait the whole graceful timeout on them."""
    server = start_runguard(workers=2)
    with slow_clients.SlowClients(server.port, str(server.ca_file), SLOW) as held:
        assert len(held.sockets) == SLOW
        time.sleep(0.5)
        workers = server.worker_pids()
        assert server.stop() == 0
    # Each worker left on its own (gunicorn logs this from the worker itself), not
    # killed by the master when the graceful timeout ran out: no clock needed to tell.
    for pid in workers:
        assert f"Worker exiting (pid: {pid})" in server.stderr, server.stderr[-2000:]
