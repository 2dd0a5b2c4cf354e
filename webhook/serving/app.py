"""The Flask application: admission endpoints, probes and metrics; routes only.

``create_app(config)`` reads its configuration when called, never at import time:
``config`` first, then the environment, both through ``webhook.serving.settings``. The
AdmissionReview rules live in ``admission.py``, the policy reload in ``policystore.py``,
the gunicorn side in ``server.py``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook.clusterstate import ClusterState
from webhook.clusterstate.metrics import ClusterStateCollector
from webhook.clusterstate.process import ClusterWatch, watched_kinds
from webhook.engine.context import ClusterView
from webhook.policy.mirror.objects import MAX_MESSAGE, check_object
from webhook.serving import admission, gcpause, logs, metrics, shells, transition
from webhook.serving.admission import AdmissionError, Endpoint
from webhook.serving.auditlog import AuditLog, audit_record
from webhook.serving.policystore import PolicyState, PolicyStore
from webhook.serving.settings import (
    BY_NAME,
    DEFAULT_LOG_QUEUE,
    DEFAULT_MAX_BODY,
    RELOAD_INTERVAL,
    SettingsError,
    read_settings,
)
from webhook.serving.shells import PodReader
from webhook.serving.tls import peer_verified
from webhook.serving.worker import draining

__all__ = ["create_app"]

log = logging.getLogger("runguard.app")

JSON_TYPE = "application/json"
PROBES = ("/healthz", "/readyz")  # open to the kubelet, which sends no client certificate
CLIENT_CERTIFICATE_REQUIRED = {
    "error": "ClientCertificateRequired",
    "code": 403,
    "message": "a client certificate signed by the webhook's client CA is required",
}


@dataclass
class Runguard:
    """What the routes share, kept in ``app.extensions["runguard"]``."""

    store: PolicyStore
    audit: AuditLog
    # What ownership decisions read beyond the review (ownership): the watch cache,
    # or None when the server keeps none (decisions needing it then fail closed).
    cluster_state: ClusterView | None = None
    # The watch process keeping it (``webhook.clusterstate``), when this app started one.
    cluster_watch: ClusterWatch | None = None
    # How a door's Pods are read (``webhook.serving.shells``: a Pod, a Service's), with the
    # cluster state's credentials; None without them (such a door is then denied).
    reads: shells.Reads | None = None


def create_app(config: Mapping[str, Any] | None = None) -> Flask:  # noqa: C901
    """The runguard WSGI application.

    ``config``: settings by name (``webhook.serving.settings.SETTINGS``: ``policy_dir``,
    ``max_body``, ``client_ca``, ``log_queue``, ``reload_interval``...), each
    one not given read from its environment variable; and ``policy_store`` /
    ``audit_stream`` to hand in a ready store or an audit stream. A policy that does not
    load leaves the app unready (503) until a good one appears.

    ``cluster_state`` (``in-cluster`` or a kubeconfig) starts the watch process of the
    cluster state (``webhook.clusterstate``), or ``cluster`` hands in a ready view; the
    handlers find it in ``app.extensions["runguard"].cluster_state`` (the engine gets it
    with each review), and with a ``ClusterState`` ``/readyz`` is 503 until every kind
    has been listed once.

    With ``client_ca`` (mTLS), every path but the probes answers 403 to a connection
    without a verified client certificate; the TLS layer (``server.py``) asks for one
    and refuses one from another CA.
    """
    config = config or {}
    settings = read_settings(config)

    app = Flask("webhook")
    app.config["MAX_CONTENT_LENGTH"] = settings.get("max_body", DEFAULT_MAX_BODY)
    store = config.get("policy_store")
    if store is None:
        if "policy_dir" not in settings:
            raise SettingsError(f"{BY_NAME['policy_dir'].env} is not set")
        store = PolicyStore(
            settings["policy_dir"], interval=settings.get("reload_interval", RELOAD_INTERVAL)
        )
        _first_load(store)
    if store.observer is None:
        store.observer = _publish_policy
    audit = AuditLog(
        config.get("audit_stream"), capacity=settings.get("log_queue", DEFAULT_LOG_QUEUE)
    )
    cluster_state, cluster_watch = _cluster_state(config, settings, store)
    cluster_metrics = (ClusterStateCollector(cluster_watch.state),) if cluster_watch else ()
    source = settings.get("cluster_state")
    reads = PodReader(source) if source is not None else None
    state = Runguard(store, audit, cluster_state, cluster_watch, reads)
    app.extensions["runguard"] = state

    if settings.get("client_ca") is not None:

        @app.before_request
        def client_certificate_required() -> Response | None:
            if request.path in PROBES or peer_verified(request.environ):
                return None
            log.warning("%s refused: no client certificate", request.path[:100])
            return _json(CLIENT_CERTIFICATE_REQUIRED, 403)

    def answer(endpoint: Endpoint, environ: Mapping[str, Any]) -> tuple[int, bytes]:
        with gcpause.paused(_content_length(environ)):
            return judge(endpoint, environ)

    def judge(endpoint: Endpoint, environ: Mapping[str, Any]) -> tuple[int, bytes]:
        start = time.perf_counter()
        m = metrics.get()
        try:
            req = _read_review(environ, app.config["MAX_CONTENT_LENGTH"])
        except AdmissionError as exc:
            m.observe_review(endpoint, "malformed", None)
            log.warning("%s: %s %s", endpoint, exc.status, exc)
            return exc.status, orjson.dumps(exc.to_dict())
        policy = store.current()
        if policy is None:
            m.observe_review(endpoint, "unavailable", None)
            return 503, orjson.dumps(_unavailable(store.state))
        cluster = state.cluster_state
        if shells.judges(endpoint, req):
            outcome = shells.review(req, policy, cluster, state.reads, state.reads)
        else:
            outcome = admission.review(endpoint, req, policy, cluster)
            outcome, policy = transition.settle(endpoint, req, policy, outcome, store, cluster)
        body = admission.encode_review(outcome.response)
        elapsed = time.perf_counter() - start
        m.observe_review(endpoint, outcome.label, elapsed)
        if outcome.decision is not None:
            for violation in outcome.decision.violations:
                m.violations.labels(violation.rule, outcome.decision.enforcement).inc()
        if outcome.error is not None:
            log.error(
                "%s: engine failed on %s uid=%s",
                endpoint,
                req.get("kind", {}).get("kind", "object"),
                req["uid"],
                exc_info=outcome.error,
            )
        state.audit.write(
            audit_record(endpoint, req, outcome, latency=elapsed, policy_digest=policy.digest)
        )
        return 200, body

    def judge_policy_object(environ: Mapping[str, Any]) -> tuple[int, bytes]:
        """``/validate-policy``: a RunPolicy or Profile object, refused with the errors
        ``runguard lint`` would give if it joined the policy the server loads."""
        try:
            req = _read_review(environ, app.config["MAX_CONTENT_LENGTH"])
        except AdmissionError as exc:
            log.warning("validate-policy: %s %s", exc.status, exc)
            return exc.status, orjson.dumps(exc.to_dict())
        obj = req.get("object")
        if req["operation"] not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
            response = admission.review_response(req["uid"], allowed=True)
            return 200, admission.encode_review(response)
        checked = check_object(obj, store.directory)
        if checked.errors:
            log.info("validate-policy: %s refused: %s", checked.label, "; ".join(checked.errors))
        message = (
            f"runguard: {checked.label} does not load (fix these keys and apply again): "
            + "; ".join(checked.errors)
        )
        response = admission.review_response(
            req["uid"],
            allowed=not checked.errors,
            warnings=[f"runguard: {w}" for w in checked.warnings],
            message=message[:MAX_MESSAGE],
        )
        return 200, admission.encode_review(response)

    @app.post("/mutate")
    def mutate() -> Response:
        status, body = answer("mutate", request.environ)
        return Response(body, status, mimetype=JSON_TYPE)

    @app.post("/validate")
    def validate() -> Response:
        status, body = answer("validate", request.environ)
        return Response(body, status, mimetype=JSON_TYPE)

    @app.post("/validate-policy")
    def validate_policy() -> Response:
        status, body = judge_policy_object(request.environ)
        return Response(body, status, mimetype=JSON_TYPE)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"}, 200)

    @app.get("/readyz")
    def readyz() -> Response:
        if draining():  # stopping: endpoints and load balancers are to drop this Pod
            message = "draining before shutdown: send new connections elsewhere"
            return _json({"status": "draining", "worker": os.getpid(), "message": message}, 503)
        store.current()
        current = store.state
        if current.policy is None:
            return _json(_unavailable(current), 503)
        status = "degraded" if current.rejected else "ready"
        # ``worker``: which process answered, so a rollout check can hear from each one
        body = {"status": status, "worker": os.getpid(), **current.to_dict()}
        if isinstance(cluster_state, ClusterState):
            body["clusterState"] = cluster = cluster_health(cluster_state)
            if cluster["waiting"]:
                waiting = ", ".join(cluster["waiting"])
                message = f"cluster state not synced yet: {waiting}"
                return _json({**body, "status": "unavailable", "message": message}, 503)
        return _json({**body, "logging": _logging_health(audit)}, 200)

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        store.current()  # this process publishes its policy state before its first review
        text = metrics.exposition(*cluster_metrics)
        return Response(text, 200, mimetype=metrics.CONTENT_TYPE_LATEST)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if isinstance(exc, RequestEntityTooLarge):
            limit = app.config["MAX_CONTENT_LENGTH"]
            err = admission.BodyTooLarge(f"body larger than the {limit} byte limit")
            return _json(err.to_dict(), err.status)
        return _json(
            {"error": exc.name.replace(" ", ""), "code": code, "message": exc.description}, code
        )

    # The POST endpoints straight on WSGI, ahead of Flask: no request context, routing
    # or Request / Response objects for a review (~100 us a request, docs/dev/performance.md).
    # Everything else, and a review refused for want of a client certificate, is Flask's.
    endpoints: dict[str, Callable[[Mapping[str, Any]], tuple[int, bytes]]] = {
        "/mutate": partial(answer, "mutate"),
        "/validate": partial(answer, "validate"),
        "/validate-policy": judge_policy_object,
    }
    flask_app = app.wsgi_app
    mtls = settings.get("client_ca") is not None

    def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        handler = endpoints.get(environ.get("PATH_INFO", ""))
        if (
            handler is None
            or environ.get("REQUEST_METHOD") != "POST"
            or (mtls and not peer_verified(environ))
        ):
            return flask_app(environ, start_response)
        status, body = handler(environ)
        start_response(_STATUS_LINES[status], [_JSON_HEADER, ("Content-Length", str(len(body)))])
        return (body,)

    app.wsgi_app = wsgi_app  # type: ignore[method-assign]
    return app


_JSON_HEADER = ("Content-Type", JSON_TYPE)
_STATUS_LINES = {
    code: f"{code} {HTTPStatus(code).phrase}" for code in (200, 400, 403, 413, 415, 503)
}


def _read_review(environ: Mapping[str, Any], limit: int) -> admission.AdmissionRequest:
    mimetype = environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()
    admission.check_content_type(mimetype)
    return admission.parse_review(_read_body(environ, limit))


# Past the limit, up to this much is still read (and dropped) so that the client, busy
# sending, gets to read the 413; a connection closed on unread data resets instead.
DRAIN_LIMIT = 16 * 1024 * 1024


def _content_length(environ: Mapping[str, Any]) -> int | None:
    text = environ.get("CONTENT_LENGTH", "")
    return int(text) if text.isdigit() else None


def _read_body(environ: Mapping[str, Any], limit: int) -> bytes:
    """The request body, at most ``limit`` bytes, with or without a Content-Length."""
    stream = environ["wsgi.input"]
    length = _content_length(environ)
    if length is not None and length <= limit:
        body: bytes = stream.read(length)
        return body
    body = b"" if length is not None else stream.read(limit + 1)
    if len(body) <= limit and length is None:
        return body
    drained = len(body)
    while drained < DRAIN_LIMIT and (chunk := stream.read(65536)):
        drained += len(chunk)
    raise admission.BodyTooLarge(f"body larger than the {limit} byte limit")


def _cluster_state(
    config: Mapping[str, Any], settings: Mapping[str, Any], store: PolicyStore
) -> tuple[ClusterView | None, ClusterWatch | None]:
    """The handed-in ``cluster`` view, else the state the ``cluster_state`` setting
    watches (its watch process started here: in the gunicorn master, which loads the
    app before forking the workers), else None. The watch also keeps ResourceClaims and
    the operators' kinds of the policy loaded now (a reload adding one needs a restart)."""
    given: ClusterView | None = config.get("cluster")
    if given is not None or settings.get("cluster_state") is None:
        return given, None
    kinds = watched_kinds(store.state.policy)
    watch = ClusterWatch(settings["cluster_state"], operator_kinds=kinds).start()
    return watch.state, watch


def cluster_health(cluster: ClusterState) -> dict[str, Any]:
    """The ``/readyz`` detail: kinds still waiting for their first sync, objects by kind."""
    stats = cluster.stats()
    return {
        "waiting": [kind for kind, kind_stats in stats.items() if not kind_stats.synced],
        "objects": {kind: kind_stats.objects for kind, kind_stats in stats.items()},
    }


def _first_load(store: PolicyStore) -> None:
    from webhook.policy.errors import PolicyError

    try:
        store.load()
    except PolicyError as exc:
        # Unready rather than dead: /readyz shows the errors and the next check after a
        # fix loads the policy.
        log.error("policy in %s does not load: %d error(s)", store.directory, len(exc.errors))
        for issue in exc.errors:
            log.error("  %s", issue)


def _logging_health(audit: AuditLog) -> dict[str, object]:
    """Logs that drop lines degrade logging, not the webhook: still ready, but said."""
    sinks: dict[str, dict[str, object]] = {**logs.stream_health(), "audit": audit.health()}
    degraded = any(sink["status"] != "ok" for sink in sinks.values())
    return {"status": "degraded" if degraded else "ok", **sinks}


def _unavailable(state: PolicyState) -> dict[str, object]:
    return {
        "status": "unavailable",
        "error": "Unavailable",
        "code": 503,
        "message": "no valid policy loaded",
        **state.to_dict(),
    }


def _publish_policy(state: PolicyState, result: bool | None) -> None:
    m = metrics.get()
    if result is not None:
        m.policy_reloads.labels("success" if result else "failure").inc()
    m.policy_rejected.set(1 if state.rejected else 0)
    if state.policy is not None:
        m.policy_last_success.set(state.loaded_at)


def _json(payload: Mapping[str, object], status: int) -> Response:
    return Response(orjson.dumps(payload), status, mimetype=JSON_TYPE)
