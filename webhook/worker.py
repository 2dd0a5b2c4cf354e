"""runguard's gunicorn worker: ``gthread``, with the contract's JSON errors.

gunicorn answers what it cannot hand to the application (a bad request line, a URI
over ``limit_request_line``, too many or too large headers) from ``handle_error``, with
an HTML page. SPEC section 4 promises a JSON error for every 4xx: this worker answers
``{"error", "code", "message"}`` with ``Content-Type: application/json``, the same
shape as the application's errors. A failed TLS handshake (a client certificate
refused, see ``--client-ca``) gets no answer: there is no TLS session to send it in.
"""

from __future__ import annotations

import ssl
from typing import Any

import orjson
from gunicorn import util
from gunicorn.http import errors
from gunicorn.workers.gthread import ThreadWorker

__all__ = ["RunguardWorker", "error_response"]

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
    """gunicorn's ``gthread`` worker, its errors answered in JSON."""

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        ip = addr[0] if isinstance(addr, tuple) and addr else "unix"
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
