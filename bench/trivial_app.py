"""runguard's WSGI application with a trivial endpoint in front, for the benchmarks.

``POST /bench/allowed`` reads the body, as a review's would be, and returns a fixed
allowed AdmissionReview: the cost of the server alone (TLS, HTTP, gunicorn's worker),
which ``bench/bench_http.py`` and ``bench/bench_all.py`` set ``/mutate`` against. Every
other request goes to runguard's application unchanged. gunicorn loads it in place of
runguard's own, with the repository's configuration:

    gunicorn -c gunicorn.conf.py 'bench.trivial_app:create_app()'

Not part of runguard: the server it ships serves no such endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

PATH = "/bench/allowed"
ALLOWED = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
    b'"response":{"uid":"","allowed":true}}'
)
HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(ALLOWED)))]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def with_trivial_endpoint(app: WSGIApp) -> WSGIApp:
    """``app`` with ``POST /bench/allowed`` answered ahead of it."""

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "POST":
            return app(environ, start_response)
        stream = environ["wsgi.input"]
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
