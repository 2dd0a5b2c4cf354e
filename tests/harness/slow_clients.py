"""Connections that send nothing, or half of something, and real reviews beside them.

Used by ``bench/bench_all.py`` (the ``starved_requests`` figure), the soak and
``tests/serving/test_http_starvation.py``. ``SlowClients(port, count)`` opens ``count``
connections in four kinds, in turn: TCP only (no ClientHello), half a ClientHello, a
TLS session with half a request head, a whole head with half its body. They stay open,
sending nothing more, until ``close()``. ``reviews(...)`` sends real ``/validate``
reviews, each on a new TLS connection as an apiserver opens them, all at once, and
says which were answered.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

KINDS = ("idle", "half-hello", "half-head", "half-body")
HANDSHAKE_SECONDS = 1.0  # a slow client's own handshake, when the server is starved
OPEN_SECONDS = 15.0  # past this, the rest are opened as idle connections


def review_of(pod: dict[str, Any], user: str = "alice") -> bytes:
    """A CREATE AdmissionReview of ``pod`` in namespace ``ml``, as the apiserver sends it."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ml",
            "userInfo": {"username": user},
            "object": pod,
            "dryRun": False,
        },
    }
    return json.dumps(review).encode()


def review_body(name: str = "probe") -> bytes:
    """A review of a plain one-container Pod (allowed by the repository's policies)."""
    spec = {"containers": [{"name": "main", "image": "busybox"}]}
    return review_of({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _client_hello() -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


class SlowClients:
    """``count`` open connections that never finish what they started."""

    def __init__(self, port: int, ca_file: str, count: int) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=ca_file)
        self.sockets: list[socket.socket] = []
        hello = _client_hello()
        body = review_body("slow")
        deadline = time.monotonic() + OPEN_SECONDS
        for index in range(count):
            kind = KINDS[index % len(KINDS)]
            raw = socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_SECONDS)
            if kind == "idle" or time.monotonic() > deadline:
                self.sockets.append(raw)
                continue
            if kind == "half-hello":
                raw.sendall(hello[: len(hello) // 2])
                self.sockets.append(raw)
                continue
            tls = self.context.wrap_socket(
                raw, server_hostname="127.0.0.1", do_handshake_on_connect=False
            )
            try:  # a starved server never finishes it: then it is held mid-handshake
                tls.do_handshake()
            except OSError:
                self.sockets.append(tls)
                continue
            request = _head("/validate", len(body)) + body
            cut = request.index(b"\r\n") + 10 if kind == "half-head" else len(request) - 20
            tls.sendall(request[:cut])
            self.sockets.append(tls)

    def closed_by_server(self) -> int:
        """How many of them the server has closed (read raw, without blocking)."""
        closed = 0
        for sock in self.sockets:
            try:
                sock.setblocking(False)
            except OSError:
                closed += 1
                continue
            for _ in range(100):  # a TLS alert or session ticket may come before the end
                try:
                    data = socket.socket.recv(sock, 65536)  # the TCP bytes, not TLS records
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    closed += 1
                    break
        return closed

    def close(self) -> None:
        for sock in self.sockets:
            try:
                sock.close()
            except OSError:
                pass
        self.sockets.clear()

    def __enter__(self) -> SlowClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def one_review(port: int, ca_file: str, timeout: float) -> tuple[bool, float]:
    """A ``/validate`` review on a new TLS connection: (answered 200 with a response, s)."""
    start = time.monotonic()
    context = ssl.create_default_context(cafile=ca_file)
    body = review_body()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(max(0.1, timeout - (time.monotonic() - start)))
                tls.sendall(_head("/validate", len(body)) + body)
                data = b""
                for _ in range(1000):
                    chunk = tls.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                    head, sep, rest = data.partition(b"\r\n\r\n")
                    if sep and b'"response"' in rest and rest.rstrip().endswith(b"}"):
                        break
    except OSError:
        return False, time.monotonic() - start
    ok = data.startswith(b"HTTP/1.1 200") and b'"response"' in data
    return ok, time.monotonic() - start


def reviews(port: int, ca_file: str, count: int, timeout: float) -> list[tuple[bool, float]]:
    """``count`` reviews sent at once, each given ``timeout`` seconds."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(one_review, port, ca_file, timeout) for _ in range(count)]
        return [future.result(timeout=timeout + 30) for future in futures]


def starved(port: int, ca_file: str, slow: int, count: int, timeout: float) -> dict[str, Any]:
    """Reviews failed while ``slow`` slow connections are held open."""
    with SlowClients(port, ca_file, slow) as clients:
        time.sleep(0.5)  # let the server accept them all
        results = reviews(port, ca_file, count, timeout)
        held = len(clients.sockets)
    failed = sum(not ok for ok, _ in results)
    slowest = max(seconds for _, seconds in results)
    return {"held": held, "reviews": count, "failed": failed, "slowest_s": slowest}
