"""AdmissionReview plumbing: parse a review, ask the engine, build the response.

Everything here is a pure function of its arguments (no Flask, no I/O), so the HTTP
layer (``app.py``) only moves bytes and the HTTP contract's rules are testable alone.

Two error families, as in kopf and Kyverno:

* a request that is not a usable AdmissionReview is an ``AdmissionError`` and becomes
  an HTTP 4xx with a JSON body; the apiserver then applies the webhook's
  ``failurePolicy``:

  - ``MalformedReview`` (400): empty body, not JSON, not an ``admission.k8s.io/v1``
    AdmissionReview, no ``request``, no ``uid``, an object that is not a JSON object,
    an object whose ``kind`` is not the review's ``request.kind.kind``;
  - ``UnsupportedMediaType`` (415): a content type other than ``application/json``;
  - ``BodyTooLarge`` (413): a body over the configured limit;

* an object the engine judges non-compliant, or cannot understand, is a *denial*: HTTP
  200, ``allowed: false``, every violation listed in ``status.message``.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, Required, TypedDict, cast

import orjson

from webhook import engine
from webhook.engine.context import ClusterView, Context, Requester
from webhook.engine.receipts import SharedReceipts
from webhook.engine.types import Decision
from webhook.policy.model import Policy

# What ``/mutate`` leaves for ``/validate``'s backstop: made when the app is imported, in
# the server's master before the workers fork, so every worker maps the same table
# (``webhook.engine.receipts``).
RECEIPTS = SharedReceipts()

__all__ = [
    "API_VERSION",
    "AdmissionError",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "BodyTooLarge",
    "Endpoint",
    "MalformedReview",
    "Outcome",
    "UnsupportedMediaType",
    "check_content_type",
    "context_of",
    "decision_response",
    "encode_review",
    "parse_review",
    "review",
    "review_response",
]

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS: tuple[Operation, ...] = ("CREATE", "UPDATE", "DELETE", "CONNECT")
Endpoint = Literal["mutate", "validate"]

JSON = dict[str, Any]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict, total=False):
    """The ``request`` of an AdmissionReview, as far as runguard reads it."""

    uid: Required[str]
    operation: Required[Operation]
    kind: GroupVersionKind
    resource: JSON
    subResource: str
    namespace: str
    name: str
    object: JSON | None
    oldObject: JSON | None
    dryRun: bool
    userInfo: UserInfo


class Status(TypedDict, total=False):
    code: int
    reason: str
    message: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]
    status: NotRequired[Status]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


class AdmissionError(Exception):
    """A request that is not a usable AdmissionReview; ``status`` is the HTTP code."""

    status = 400
    reason = "BadRequest"

    def to_dict(self) -> dict[str, object]:
        return {"error": self.reason, "code": self.status, "message": str(self)}


class MalformedReview(AdmissionError):
    status = 400
    reason = "MalformedReview"


class UnsupportedMediaType(AdmissionError):
    status = 415
    reason = "UnsupportedMediaType"


class BodyTooLarge(AdmissionError):
    status = 413
    reason = "BodyTooLarge"


def check_content_type(mimetype: str) -> None:
    """Admission requests are ``application/json`` (parameters such as charset aside)."""
    if mimetype.strip().lower() != "application/json":
        shown = mimetype[:60] or "none"
        raise UnsupportedMediaType(f"content type must be application/json, got {shown}")


def parse_review(body: bytes) -> AdmissionRequest:
    """The ``request`` of an ``admission.k8s.io/v1`` AdmissionReview, checked for shape."""
    if not body:
        raise MalformedReview("empty body: expected an AdmissionReview")
    try:
        doc = orjson.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise MalformedReview(f"body is not valid JSON: {_short(exc)}") from None
    if not isinstance(doc, dict):
        raise MalformedReview("body must be a JSON object (an AdmissionReview)")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise MalformedReview(
            f"expected apiVersion {API_VERSION} kind {KIND}, "
            f"got {_shown(doc.get('apiVersion'))} {_shown(doc.get('kind'))}"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid must be a non-empty string")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise MalformedReview(f"request.operation must be one of {', '.join(OPERATIONS)}")
    _check_types(request, dict, "a JSON object or null", "object", "oldObject")
    if operation in ("CREATE", "UPDATE") and request.get("object") is None:
        raise MalformedReview(f"request.object is required for {operation}")
    _check_types(request, str, "a string", "namespace", "name", "subResource")
    _check_types(request, bool, "a boolean", "dryRun")
    _check_types(request, dict, "a JSON object", "kind", "userInfo")
    _check_kind(request)
    return cast(AdmissionRequest, request)


def _check_types(request: JSON, kind: type, what: str, *keys: str) -> None:
    """Each of ``keys`` the request holds is null or of JSON type ``kind``."""
    for key in keys:
        if (value := request.get(key)) is not None and not isinstance(value, kind):
            raise MalformedReview(f"request.{key} must be {what}")


def _check_kind(request: JSON) -> None:
    """The object is of the kind the review says: the apiserver never sends otherwise,
    and judging a Pod by the rules of the kind it claims to be would let it through."""
    declared = (request.get("kind") or {}).get("kind")
    for key in ("object", "oldObject"):
        actual = (request.get(key) or {}).get("kind")
        if declared is not None and actual is not None and actual != declared:
            raise MalformedReview(
                f"request.{key}.kind {_shown(actual)} does not match "
                f"request.kind.kind {_shown(declared)}"
            )


INTERNAL_ERROR_MESSAGE = (
    "runguard could not judge this object (internal error, see the webhook log); "
    "denied to stay safe"
)


@dataclass(frozen=True)
class Outcome:
    """What one review produced: the response, and the decision when the engine ran."""

    response: AdmissionReview
    decision: Decision | None
    error: BaseException | None = None  # an engine failure, for the caller to log

    @property
    def label(self) -> str:
        """The ``decision`` label of the reviews metric: allowed, patched, denied or error."""
        resp = self.response["response"]
        if self.error is not None:
            return "error"
        if not resp["allowed"]:
            return "denied"
        return "patched" if "patch" in resp else "allowed"


def review(
    endpoint: Endpoint,
    request: AdmissionRequest,
    policy: Policy,
    cluster: ClusterView | None = None,
) -> Outcome:
    """Judge one admission request with ``policy`` (and the cluster state ownership needs,
    when the server keeps one); never raises (see ``_judge``).

    The engine does not raise: a bug in a step comes back as an ``engine.error`` denial
    with the exception in ``Decision.error``, which becomes ``Outcome.error`` for the
    caller to log with its traceback and count. Anything raised here anyway is denied the
    same way (fail closed, like ``failurePolicy: Fail``).
    """
    try:
        outcome = _judge(endpoint, request, policy, cluster)
        if outcome.decision is not None and outcome.decision.error is not None:
            return Outcome(outcome.response, outcome.decision, error=outcome.decision.error)
        return outcome
    except Exception as exc:  # the caller logs it; the apiserver gets a clear denial
        denial = review_response(request["uid"], allowed=False, message=INTERNAL_ERROR_MESSAGE)
        return Outcome(denial, None, error=exc)


def context_of(request: AdmissionRequest, cluster: ClusterView | None) -> Context:
    """Who asks (``request.userInfo``), what for, and the cluster view, for the engine."""
    info = request.get("userInfo") or {}
    username = info.get("username")
    groups = info.get("groups") or []
    named = username if isinstance(username, str) and username else None
    kept = tuple(g for g in groups if isinstance(g, str))
    requester = Requester(named, kept) if named else None
    subresource = request.get("subResource")
    return Context(
        requester=requester,
        state=cluster,
        operation=request["operation"],
        subresource=subresource if isinstance(subresource, str) else "",
        resource=_resource(request.get("resource")),
    )


def _resource(resource: Any) -> str:  # GROUP/resource; resource alone in the core group
    r = resource if isinstance(resource, dict) else {}
    return "/".join(p for p in (r.get("group"), r.get("resource")) if isinstance(p, str) and p)


def _judge(
    endpoint: Endpoint, request: AdmissionRequest, policy: Policy, cluster: ClusterView | None
) -> Outcome:
    """Judge one admission request with ``policy`` and build the response.

    ``/mutate`` patches CREATE; on UPDATE it passes ``oldObject`` and the engine patches
    only to put back the running spec (``kubectl apply`` of the user's manifest again),
    never to change an immutable spec. ``/validate`` judges CREATE and UPDATE, passing
    ``oldObject`` so violations already present do not block unrelated updates. DELETE is
    allowed; a CONNECT is ``webhook.serving.shells``' (the server sends every one there).
    """
    uid = request["uid"]
    obj = request.get("object")
    namespace = request.get("namespace") or None
    operation = request["operation"]
    if operation == "CONNECT":  # never let through unjudged
        refused = "runguard judges a CONNECT only as a door into a Pod, by its shells webhook"
        return Outcome(review_response(uid, allowed=False, message=refused), None)
    if obj is None or operation == "DELETE":
        return Outcome(review_response(uid, allowed=True), None)
    old = request.get("oldObject") if operation == "UPDATE" else None
    context = context_of(request, cluster)
    if endpoint == "mutate":
        if operation == "UPDATE" and old is None:
            return Outcome(review_response(uid, allowed=True), None)
        decision = engine.mutate(
            obj, policy, namespace=namespace, old=old, context=context, receipts=RECEIPTS
        )
        return Outcome(decision_response(uid, decision, patch=True), decision)
    decision = engine.validate(
        obj, policy, namespace=namespace, old=old, context=context, receipts=RECEIPTS
    )
    return Outcome(decision_response(uid, decision, patch=False), decision)


def decision_response(uid: str, decision: Decision, *, patch: bool) -> AdmissionReview:
    if not decision.allowed:
        return review_response(
            uid,
            allowed=False,
            warnings=decision.warnings,
            audit_annotations=decision.audit_annotations,
            message=decision.message(),
        )
    return review_response(
        uid,
        allowed=True,
        patch=decision.patch if patch else None,
        warnings=decision.warnings,
        audit_annotations=decision.audit_annotations,
    )


def review_response(
    uid: str,
    *,
    allowed: bool,
    patch: list[JSON] | None = None,
    warnings: list[str] | None = None,
    audit_annotations: dict[str, str] | None = None,
    message: str | None = None,
) -> AdmissionReview:
    """An ``admission.k8s.io/v1`` AdmissionReview response; empty fields are left out."""
    response: AdmissionResponse = {"uid": uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode("ascii")
    if warnings:
        response["warnings"] = shown_warnings(warnings)
    if audit_annotations:
        response["auditAnnotations"] = dict(audit_annotations)
    if not allowed:
        response["status"] = {
            "code": 403,
            "reason": "Forbidden",
            "message": message or "runguard denied the request",
        }
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


# The apiserver keeps about 4 KiB of warnings per response (k8s.io/apiserver
# pkg/endpoints/filters/warning.go, truncateAtTotalRunes) and drops the rest unsaid.
WARNINGS_BUDGET = 4096


def shown_warnings(warnings: list[str]) -> list[str]:
    """The warnings that fit the apiserver's budget, then one saying how many did not
    (an UPDATE of a Pod with 100k violations already present would send 100k)."""
    budget = WARNINGS_BUDGET - 64  # room for the line counting the rest
    if sum(map(len, warnings)) <= budget:
        return list(warnings)
    shown: list[str] = []
    used = 0
    for text in warnings:
        if used + len(text) > budget and len(shown) < len(warnings) - 1:
            rest = len(warnings) - len(shown)
            shown.append(f"runguard: {rest} more warnings not shown")
            break
        shown.append(text)
        used += len(text)
    return shown


def encode_review(review_doc: AdmissionReview) -> bytes:
    """The response body (orjson: several times faster than the json module here)."""
    return orjson.dumps(review_doc)


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 120 else text[:117] + "..."


def _shown(value: object) -> str:
    """A value from the request, quoted and cut short: never echo large input back."""
    if value is None:
        return "none"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
