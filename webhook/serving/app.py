"""The runguard WSGI application: what the routes share, the admission reviews ahead of
Flask (``reviews.py``), and Flask's routes: probes, metrics, errors, the mTLS refusal.

``create_app(config)`` reads its configuration when called, never at import time:
``config`` first, then the environment, both through ``webhook.serving.settings``. The
AdmissionReview rules live in ``admission.py``, the policy reload in ``policystore.py``,
the gunicorn side in ``server.py``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook.clusterstate import ClusterState
from webhook.clusterstate.metrics import ClusterStateCollector
from webhook.clusterstate.process import ClusterWatch, watched_kinds
from webhook.engine.context import ClusterView
from webhook.serving import admission, logs, metrics
from webhook.serving.auditlog import AuditLog
from webhook.serving.policystore import PolicyState, PolicyStore
from webhook.serving.reviews import JSON_TYPE, PATHS, Reviews, Runguard, unavailable
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

PROBES = ("/healthz", "/readyz")  # open to the kubelet, which sends no client certificate
CLIENT_CERTIFICATE_REQUIRED = {
    "error": "ClientCertificateRequired",
    "code": 403,
    "message": "a client certificate signed by the webhook's client CA is required",
}


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
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
    state = _serving_state(config, settings)
    app = Flask("webhook")
    app.config["MAX_CONTENT_LENGTH"] = settings.get("max_body", DEFAULT_MAX_BODY)
    app.extensions["runguard"] = state
    mtls = settings.get("client_ca") is not None
    _flask_routes(app, state, mtls)
    reviews = Reviews(state, app.config["MAX_CONTENT_LENGTH"])
    app.wsgi_app = reviews.front(app.wsgi_app, mtls)  # type: ignore[method-assign,assignment]
    return app


def _serving_state(config: Mapping[str, Any], settings: Mapping[str, Any]) -> Runguard:
    """The policy store (loaded once), the audit log, the cluster state and the reader
    of a door's Pods, as the routes share them."""
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
    source = settings.get("cluster_state")
    reads = PodReader(source) if source is not None else None
    return Runguard(store, audit, cluster_state, cluster_watch, reads)


def _flask_routes(app: Flask, state: Runguard, mtls: bool) -> None:
    """What Flask answers: the probes, the metrics, errors as JSON, the mTLS refusal."""
    store, audit = state.store, state.audit
    cluster_metrics = (
        (ClusterStateCollector(state.cluster_watch.state),) if state.cluster_watch else ()
    )

    if mtls:

        @app.before_request
        def client_certificate_required() -> Response | None:
            if request.path in PROBES or peer_verified(request.environ):
                return None
            log.warning("%s refused: no client certificate", request.path[:100])
            return _json(CLIENT_CERTIFICATE_REQUIRED, 403)

    # The POST endpoints are ``Reviews``'; declared here (no view: no POST reaches Flask
    # but one refused above) so that another method is 405, OPTIONS answered.
    for path in PATHS:
        app.add_url_rule(path, path, methods=["POST"])

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
            return _json(unavailable(current), 503)
        status = "degraded" if current.rejected else "ready"
        # ``worker``: which process answered, so a rollout check can hear from each one
        body = {"status": status, "worker": os.getpid(), **current.to_dict()}
        if isinstance(state.cluster_state, ClusterState):
            body["clusterState"] = cluster = cluster_health(state.cluster_state)
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


def _publish_policy(state: PolicyState, result: bool | None) -> None:
    m = metrics.get()
    if result is not None:
        m.policy_reloads.labels("success" if result else "failure").inc()
    m.policy_rejected.set(1 if state.rejected else 0)
    if state.policy is not None:
        m.policy_last_success.set(state.loaded_at)


def _json(payload: Mapping[str, object], status: int) -> Response:
    return Response(orjson.dumps(payload), status, mimetype=JSON_TYPE)
