"""runguard's WSGI application with trivial endpoints in front, for the benchmarks.

``POST /bench/allowed`` reads the body, as a review's would be, and returns a fixed
allowed AdmissionReview: the cost of the server alone (TLS, HTTP, gunicorn's worker),
which ``bench/bench_http.py`` and ``bench/bench_all.py`` set ``/mutate`` against.
``POST /bench/echo`` decodes the AdmissionReview (orjson) and answers it allowed, with
its request's uid and no patch: an answer the apiserver takes, the floor of any webhook
served by this stack (``bench/bench_peers.py``'s trivial pair). Every other request goes
to runguard's application unchanged. gunicorn loads it in place of runguard's own, with
the repository's configuration:

    gunicorn -c gunicorn.conf.py 'bench.trivial_app:create_app()'

or ``runguard serve`` itself, its application wrapped the same way (``serve_command()``,
what ``bench_create.CreateLatency(echo=True)`` starts):

    python -P bench/trivial_app.py serve -p policies --cert ... --key ...

Not part of runguard: the server it ships serves no such endpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

PATH = "/bench/allowed"
ECHO_PATH = "/bench/echo"
ALLOWED = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
    b'"response":{"uid":"","allowed":true}}'
)
HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(ALLOWED)))]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def echo(body: bytes) -> bytes | None:
    """The allowed answer to the AdmissionReview ``body``, with its request's uid; None
    when it is not one."""
    import orjson

    try:
        uid = orjson.loads(body)["request"]["uid"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(uid, str):
        return None
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": {"uid": uid, "allowed": True}})  # fmt: skip


def with_trivial_endpoint(app: WSGIApp) -> WSGIApp:
    """``app`` with ``POST /bench/allowed`` and ``POST /bench/echo`` answered ahead of it."""

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path not in (PATH, ECHO_PATH) or environ.get("REQUEST_METHOD") != "POST":
            return app(environ, start_response)
        stream = environ["wsgi.input"]
        if path == ECHO_PATH:
            answer = echo(stream.read())
            if answer is None:
                start_response("400 Bad Request", [("Content-Length", "0")])
                return (b"",)
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(answer)))])  # fmt: skip
            return (answer,)
        while stream.read(65536):
            pass
        start_response("200 OK", HEADERS)
        return (ALLOWED,)

    return wsgi


def create_app() -> Any:
    """runguard's Flask application (``webhook.serving.app.create_app``, configured by its
    environment variables), its WSGI callable wrapped: the gunicorn hooks still find
    its state in ``app.extensions``."""
    from webhook.serving.app import create_app as runguard_app

    app = runguard_app()
    app.wsgi_app = with_trivial_endpoint(app.wsgi_app)  # type: ignore[method-assign]
    return app


def serve_command() -> list[str]:
    """The program to run in place of ``runguard`` for ``runguard serve`` with these
    endpoints (``-P``: not this folder on the import path, where ``map/``, ``opa/``...
    would be importable as packages)."""
    return [sys.executable, "-P", str(Path(__file__).resolve())]


def main(argv: Sequence[str] | None = None) -> int:
    """runguard's command line, ``runguard serve``'s application wrapped by
    ``with_trivial_endpoint``: the same flags, settings, policy check and gunicorn
    options as the server runguard ships."""
    from webhook.cli import main as runguard
    from webhook.serving.server import RunguardApplication

    load = RunguardApplication.load

    def load_with_bench_endpoints(self: RunguardApplication) -> Any:
        app = load(self)
        app.wsgi_app = with_trivial_endpoint(app.wsgi_app)
        return app

    RunguardApplication.load = load_with_bench_endpoints  # type: ignore[method-assign]
    return runguard(argv)


if __name__ == "__main__":
    sys.exit(main())
