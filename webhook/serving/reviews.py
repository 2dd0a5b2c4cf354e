"""The admission reviews on WSGI, ahead of Flask: ``/mutate``, ``/validate`` and
``/validate-policy`` read from the socket's body (bounded, drained past the limit),
judged, settled across a policy edit, counted and audited, with no request context,
routing or Request / Response objects (~100 us a request, docs/dev/performance.md).
What the routes share (``Runguard``) is kept in ``app.extensions["runguard"]``;
``app.py`` builds it and answers everything else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

import orjson

from webhook.clusterstate.process import ClusterWatch
from webhook.engine.context import ClusterView
from webhook.policy.mirror.objects import MAX_MESSAGE, check_object
from webhook.policy.model import Policy
from webhook.serving import admission, gcpause, metrics, shells, transition
from webhook.serving.admission import AdmissionError, Endpoint
from webhook.serving.auditlog import AuditLog, audit_record
from webhook.serving.policystore import PolicyState, PolicyStore
from webhook.serving.tls import peer_verified

__all__ = ["JSON_TYPE", "PATHS", "Reviews", "Runguard", "unavailable"]

log = logging.getLogger("runguard.app")

JSON_TYPE = "application/json"
PATHS = ("/mutate", "/validate", "/validate-policy")  # the POST endpoints answered here
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


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


class Reviews:
    """The POST endpoints, answered on WSGI ahead of Flask: no request context, routing
    or Request / Response objects for a review (~100 us a request,
    docs/dev/performance.md). A review is read, judged, settled across a policy edit,
    counted, then audited."""

    def __init__(self, state: Runguard, limit: int) -> None:
        self.state = state
        self.limit = limit  # bytes of a body
        handlers = (
            partial(self.review, "mutate"),
            partial(self.review, "validate"),
            self.review_policy_object,
        )
        self.endpoints: dict[str, Callable[[Mapping[str, Any]], tuple[int, bytes]]] = dict(
            zip(PATHS, handlers, strict=True)
        )

    def front(self, flask_app: Callable[..., Iterable[bytes]], mtls: bool) -> WsgiApp:
        """The WSGI app: a POST to an endpoint answered here; everything else (and with
        mTLS a connection without a verified client certificate, refused there) Flask's."""

        def wsgi_app(
            environ: dict[str, Any], start_response: Callable[..., Any]
        ) -> Iterable[bytes]:
            handler = self.endpoints.get(environ.get("PATH_INFO", ""))
            if (
                handler is None
                or environ.get("REQUEST_METHOD") != "POST"
                or (mtls and not peer_verified(environ))
            ):
                return flask_app(environ, start_response)
            status, body = handler(environ)
            headers = [_JSON_HEADER, ("Content-Length", str(len(body)))]
            start_response(_STATUS_LINES[status], headers)
            return (body,)

        return wsgi_app

    def review(self, endpoint: Endpoint, environ: Mapping[str, Any]) -> tuple[int, bytes]:
        """``/mutate`` and ``/validate``: read, judge, settle, metrics, audit (the
        collector paused while a large body is in hand)."""
        with gcpause.paused(_content_length(environ)):
            start = time.perf_counter()
            m = metrics.get()
            try:
                req = _read_review(environ, self.limit)
            except AdmissionError as exc:
                m.observe_review(endpoint, "malformed", None)
                log.warning("%s: %s %s", endpoint, exc.status, exc)
                return exc.status, orjson.dumps(exc.to_dict())
            policy = self.state.store.current()
            if policy is None:
                m.observe_review(endpoint, "unavailable", None)
                return 503, orjson.dumps(unavailable(self.state.store.state))
            outcome, policy = self.judge(endpoint, req, policy)
            body = admission.encode_review(outcome.response)
            elapsed = time.perf_counter() - start
            _count(m, endpoint, outcome, elapsed)
            if outcome.error is not None:
                kind = req.get("kind", {}).get("kind", "object")
                log.error(
                    "%s: engine failed on %s uid=%s", endpoint, kind, req["uid"],
                    exc_info=outcome.error,
                )  # fmt: skip
            record = audit_record(
                endpoint, req, outcome, latency=elapsed, policy_digest=policy.digest
            )
            self.state.audit.write(record)
            return 200, body

    def judge(
        self, endpoint: Endpoint, req: admission.AdmissionRequest, policy: Policy
    ) -> tuple[admission.Outcome, Policy]:
        """The outcome and the policy it was decided by: a connection into a Pod judged on
        the Pods it reaches, any other review by the engine, then settled across a policy
        edit that reached ``/mutate`` and ``/validate`` apart."""
        state = self.state
        if shells.judges(endpoint, req):
            return shells.review(req, policy, state.cluster_state, state.reads, state.reads), policy
        outcome = admission.review(endpoint, req, policy, state.cluster_state)
        return transition.settle(endpoint, req, policy, outcome, state.store, state.cluster_state)

    def review_policy_object(self, environ: Mapping[str, Any]) -> tuple[int, bytes]:
        """``/validate-policy``: a RunPolicy or Profile object, refused with the errors
        ``runguard lint`` would give if it joined the policy the server loads."""
        try:
            req = _read_review(environ, self.limit)
        except AdmissionError as exc:
            log.warning("validate-policy: %s %s", exc.status, exc)
            return exc.status, orjson.dumps(exc.to_dict())
        obj = req.get("object")
        if req["operation"] not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
            response = admission.review_response(req["uid"], allowed=True)
            return 200, admission.encode_review(response)
        checked = check_object(obj, self.state.store.directory)
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


def _count(
    m: metrics.Metrics, endpoint: Endpoint, outcome: admission.Outcome, elapsed: float
) -> None:
    m.observe_review(endpoint, outcome.label, elapsed)
    if outcome.decision is not None:
        for violation in outcome.decision.violations:
            m.violations.labels(violation.rule, outcome.decision.enforcement).inc()


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


def unavailable(state: PolicyState) -> dict[str, object]:
    return {
        "status": "unavailable",
        "error": "Unavailable",
        "code": 503,
        "message": "no valid policy loaded",
        **state.to_dict(),
    }
