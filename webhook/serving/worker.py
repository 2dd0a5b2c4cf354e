"""runguard's gunicorn worker: ``gthread`` whose loop waits for clients, JSON errors.

``RunguardWorker`` (its docstring has the why) never commits a thread to a client
that has not sent a whole request, and takes connections from a listening socket of
its own. ``SharedListenerWorker`` is the same without the socket of its own, for
``bench/bench_http.py``'s comparison.

gunicorn answers what it cannot hand to the application (a bad request line, a URI
over ``limit_request_line``, too many or too large headers) from ``handle_error``, with
an HTML page. runguard promises a JSON error for every 4xx: this worker answers
``{"error", "code", "message"}`` with ``Content-Type: application/json``, the same
shape as the application's errors. A failed TLS handshake (a client certificate
refused, see ``--client-ca``) gets no answer: there is no TLS session to send it in.

Told to stop (SIGTERM) with a shutdown delay (``--shutdown-delay``), a worker drains
first: for that long it keeps accepting and answering, closes each connection after
its answer (``Connection: close``), and ``/readyz`` says ``draining``. Endpoints drop a
terminating Pod a moment after the kubelet signals it, and the apiserver dials a
webhook's Service endpoints itself: a server that stopped at once would refuse the
connections it still opens, and reset those it keeps alive, and the apiserver retries
neither. Then it stops as ``gthread`` does.
"""

from __future__ import annotations

import errno
import selectors
import socket
import ssl
import struct
import time
from functools import partial
from typing import Any

import orjson
from gunicorn import http, util
from gunicorn import sock as gsock
from gunicorn.http import errors
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn, ThreadWorker

from webhook.serving.framing import Pending, request_ready

__all__ = [
    "REQUEST_TIMEOUT",
    "RunguardWorker",
    "SharedListenerWorker",
    "draining",
    "error_response",
]

REQUEST_TIMEOUT = (
    10.0  # seconds from accept (or a kept-alive request's first byte) to a whole request
)
READ_CHUNK = 65536
_QUIET_TLS = {None, "UNEXPECTED_EOF_WHILE_READING", "EOF occurred in violation of protocol"}

# (error, HTTP status, reason) in order: the first class that matches answers.
_STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (errors.InvalidResponseHeader, 500, "Internal Server Error"),  # the app's fault
    (errors.InvalidResponseHeaderName, 500, "Internal Server Error"),
    (errors.ConfigurationProblem, 500, "Internal Server Error"),
    (errors.LimitRequestLine, 414, "URI Too Long"),
    (errors.LimitRequestHeaders, 431, "Request Header Fields Too Large"),
    (errors.UnsupportedTransferCoding, 501, "Not Implemented"),
    (errors.ExpectationFailed, 417, "Expectation Failed"),
    (errors.ForbiddenProxyRequest, 403, "Forbidden"),
    (errors.ParseException, 400, "Bad Request"),
)
MAX_MESSAGE = 200  # never echo much of a bad request back
_DRAINING = [False]  # this process is draining (see the module doc)


def draining() -> bool:
    """Whether this process is a worker draining before it stops (``/readyz`` asks)."""
    return _DRAINING[0]


def error_response(exc: BaseException) -> tuple[int, bytes]:
    """The HTTP status and the whole response (head and JSON body) for ``exc``."""
    status, reason = 500, "Internal Server Error"
    for cls, code, text in _STATUS:
        if isinstance(exc, cls):
            status, reason = code, text
            break
    message = str(exc) if status != 500 else "internal error, see the server log"
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    body = orjson.dumps({"error": reason.replace(" ", ""), "code": status, "message": message})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return status, head.encode("latin-1") + body


class RunguardWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's ``gthread`` worker whose event loop, not a thread, waits for clients.

    Stock ``gthread`` hands a new connection to a thread at once: the thread does the
    TLS handshake and reads the request with blocking calls, so a connection that
    sends nothing (or half a ClientHello, half a header, half a body) holds one
    thread for as long as it stays open; two such connections stopped a worker
    answering anyone. Here the event loop does the handshake and reads the whole
    request without blocking; a thread gets a connection only when its request is in
    memory, and a connection that has not sent a whole request within
    ``REQUEST_TIMEOUT`` of its first byte (or of its accept) is closed. Kept-alive
    connections wait in the loop as in ``gthread``. The socket's kernel timeouts bound
    what a thread still does on it (a body over ``BUFFERED_BODY``, a response nobody
    reads). Each worker also listens on a socket of its own (``SO_REUSEPORT``), so
    the kernel spreads new connections over the workers instead of the first awake
    one taking them all. Errors gunicorn answers itself are JSON.
    """

    own_listener = True
    alive: bool  # gunicorn's: the worker's loop runs while it is True
    shutdown_delay = 0.0  # set per server by the post_fork hook (``webhook.serving.server``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[Any, Pending] = {}
        self._drain_until: float | None = None
        self._drain_logged = False

    def init_process(self) -> None:
        if self.own_listener:
            shared: list[Any] = getattr(self, "sockets")  # noqa: B009  # untyped base
            self.sockets = shared + _own_listeners(shared, self.cfg.backlog, self.log)
        super().init_process()

    # -- stopping: drain, then stop accepting

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: drain for ``shutdown_delay`` first; a second SIGTERM stops now."""
        if self.shutdown_delay > 0 and self._drain_until is None and self.alive:
            self._drain_until = time.monotonic() + self.shutdown_delay
            _DRAINING[0] = True
            return
        self.alive = False

    def handle_request(self, req: Any, conn: Any) -> Any:
        if _DRAINING[0]:
            req.must_close = True  # the client's next request goes to another replica
        return super().handle_request(req, conn)

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            # Stopping: close the listening sockets now, not after the graceful stop.
            # One left open but unwatched still gets connections from the kernel
            # (SO_REUSEPORT spreads them), which would wait unanswered, then be reset.
            for listener in self.sockets:
                listener.close()

    def _drained(self) -> None:
        if self._drain_until is None or not self.alive:
            return
        if not self._drain_logged:
            self._drain_logged = True
            self.log.info(
                "draining for %gs: answering, closing each connection after its answer",
                self.shutdown_delay,
            )
        if time.monotonic() >= self._drain_until:
            self.log.info("drained; stopping")
            self.alive = False

    # -- the loop: accept, handshake, read

    def accept(self, listener: Any) -> None:
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client, address, listener.getsockname())  # non-blocking
        # a thread's blocking read or write on it gives up after this long
        timeout = struct.pack("ll", int(REQUEST_TIMEOUT), 0)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeout)
        pending = Pending(conn, time.monotonic() + REQUEST_TIMEOUT)
        try:
            if self.cfg.is_ssl:
                conn.sock = gsock.ssl_context(self.cfg).wrap_socket(
                    client,
                    server_side=True,
                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
                    do_handshake_on_connect=False,
                )
                pending.handshaking = True
        except (OSError, ValueError) as exc:
            self.log.warning("TLS setup for %s failed: %s", _ip(address), exc)
            self._drop(pending, registered=False)
            return
        self._pending[conn] = pending
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._progress, pending))
        self._progress(pending, conn.sock)

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        """A kept-alive connection has bytes again: read its request in the loop."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._read_next(conn, b"")

    def _read_next(self, conn: Any, buffered: bytes) -> None:
        pending = Pending(conn, time.monotonic() + REQUEST_TIMEOUT, bytearray(buffered))
        self._pending[conn] = pending
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._progress, pending))
        self._progress(pending, conn.sock)

    def _progress(self, pending: Pending, _fileobj: Any) -> None:
        """Advance the handshake or the read as far as the socket allows, never waiting."""
        conn = pending.conn
        try:
            if pending.handshaking:
                conn.sock.do_handshake()
                pending.handshaking = False
            if pending.data and request_ready(pending, conn.sock):
                self._dispatch(pending)  # a pipelined request, read ahead whole
                return
            while True:
                chunk = conn.sock.recv(READ_CHUNK)
                if not chunk:
                    self._drop(pending)  # closed by the client
                    return
                pending.data += chunk
                if request_ready(pending, conn.sock):
                    self._dispatch(pending)
                    return
        except ssl.SSLWantReadError:
            self.poller.modify(conn.sock, selectors.EVENT_READ, partial(self._progress, pending))
        except ssl.SSLWantWriteError:
            self.poller.modify(conn.sock, selectors.EVENT_WRITE, partial(self._progress, pending))
        except BlockingIOError:
            pass
        except ssl.SSLError as exc:
            if pending.handshaking and exc.reason not in _QUIET_TLS:
                self.log.warning("TLS handshake with %s failed: %s", _ip(conn.client), exc)
            self._drop(pending)
        except OSError:
            self._drop(pending)  # reset by the client

    def _dispatch(self, pending: Pending) -> None:
        """The request is in memory: a thread parses and answers it from there."""
        conn = pending.conn
        self.poller.unregister(conn.sock)
        del self._pending[conn]
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            conn.initialized = True
        conn.data_ready = True
        conn.parser.unreader.unread(bytes(pending.data))
        self.enqueue_req(conn)

    def _drop(self, pending: Pending, registered: bool = True) -> None:
        conn = pending.conn
        if self._pending.pop(conn, None) is not None and registered:
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        self.nr_conns -= 1
        util.close(conn.sock)

    def murder_pending(self) -> None:
        """Close connections that have not sent a whole request in time, and, once the
        worker is stopping, those that have sent nothing (a request begun may finish)."""
        super().murder_pending()
        self._drained()  # the loop calls this at least once a second
        now = time.monotonic()
        for pending in list(self._pending.values()):
            if pending.deadline <= now:
                ip = _ip(pending.conn.client)
                self.log.info("closing %s: no whole request within %gs", ip, REQUEST_TIMEOUT)
                self._drop(pending)
            elif not self.alive and not pending.data:
                self._drop(pending)

    # -- after a thread answered

    def finish_request(self, conn: Any, fs: Any) -> None:
        try:
            keepalive = bool(fs.result()) if not fs.cancelled() else False
        except Exception:
            keepalive = False
        if not keepalive or conn.parser is None:
            super().finish_request(conn, fs)
            return
        try:
            conn.sock.setblocking(False)
            # bytes read ahead (a pipelined request) go back through the loop's read
            leftover = conn.parser.unreader.take_buffered()
            # (or decrypted by TLS and not yet taken: the poller would not see them)
            if leftover or (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                self._read_next(conn, leftover)
                return
            conn.set_timeout()
            if not self.alive:
                conn.timeout = min(conn.timeout, time.monotonic() + STOP_KEEPALIVE_LINGER)
            self.keepalived_conns.append(conn)
            self.poller.register(
                conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn)
            )
        except Exception:
            self.nr_conns -= 1
            conn.close()

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        ip = _ip(addr)
        if isinstance(exc, ssl.SSLWantReadError | ssl.SSLWantWriteError | BlockingIOError):
            self.log.info("closing %s: stalled for %gs while answered", ip, REQUEST_TIMEOUT)
            return
        if isinstance(exc, ssl.SSLError):
            self.log.warning("TLS handshake with %s failed: %s", ip, exc)
            return
        status, response = error_response(exc)
        if status == 500:
            self.log.exception("Error handling request %s", getattr(req, "uri", "(no URI read)"))
        else:
            self.log.warning("Invalid request from ip=%s: %s", ip, str(exc)[:MAX_MESSAGE])
        try:
            util.write_nonblock(client, response)
        except Exception:
            self.log.debug("Failed to send error message.")


class SharedListenerWorker(RunguardWorker):
    """``RunguardWorker`` taking connections only from the master's shared socket."""

    own_listener = False


def _own_listeners(listeners: list[Any], backlog: int, log: Any) -> list[socket.socket]:
    """A socket per TCP listener, bound beside it with ``SO_REUSEPORT``."""
    own = []
    for listener in listeners:
        if listener.family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if not listener.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
            log.warning("%s has no SO_REUSEPORT: connections are shared, not spread", listener)
            continue
        sock = socket.socket(listener.family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            # as gunicorn's own: accepted sockets inherit it (without it, Nagle and the
            # client's delayed ACK held small responses up to 40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(listener.getsockname())
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            log.warning("no listening socket of its own on %s: %s", listener, exc)
            continue
        own.append(sock)
    return own


def _ip(address: Any) -> str:
    return str(address[0]) if isinstance(address, tuple) and address else "unix"
