"""AdmissionReview parsing and response building, without HTTP (webhook/serving/admission.py)."""

from __future__ import annotations

import base64
import copy
import io
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from harness import admission_review, run_pod, sample_policy

from webhook import engine
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy
from webhook.serving import admission
from webhook.serving.admission import (
    BodyTooLarge,
    MalformedReview,
    UnsupportedMediaType,
    check_content_type,
    parse_review,
    review,
    review_response,
)
from webhook.serving.auditlog import AuditLog, audit_record


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Policy:
    directory = tmp_path_factory.mktemp("policy")
    for name, text in sample_policy().items():
        (directory / name).write_text(text)
    return load_policy(directory)


def body(**request: Any) -> bytes:
    review_doc = admission_review(run_pod())
    review_doc["request"].update(request)
    return json.dumps(review_doc).encode()


# ---------------------------------------------------------------------- parsing


def test_parse_review_returns_the_request() -> None:
    request = parse_review(body(namespace="ml", dryRun=True))
    assert request["operation"] == "CREATE" and request["namespace"] == "ml"
    assert request["dryRun"] is True and request["object"] is not None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "empty body"),
        (b"{", "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b"[" * 200_000, "depth limit exceeded"),
        (b"null", "JSON object"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', "expected apiVersion admission.k8s.io/v1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}',
            "no request",
        ),
        (body(uid=None), "uid"),
        (body(uid=7), "uid"),
        (body(operation="create"), "operation"),
        (body(object=[1]), "request.object must be a JSON object"),
        (body(oldObject="x"), "request.oldObject"),
        (body(object=None), "required for CREATE"),
        (body(operation="UPDATE", object=None), "required for UPDATE"),
        (body(namespace=3), "request.namespace"),
        (body(dryRun="false"), "dryRun"),
        (body(userInfo="alice"), "userInfo"),
        (body(kind="Pod"), "request.kind"),
    ],
)
def test_malformed_reviews(raw: bytes, fragment: str) -> None:
    with pytest.raises(MalformedReview, match=fragment) as caught:
        parse_review(raw)
    error = caught.value.to_dict()
    assert error["code"] == 400 and error["error"] == "MalformedReview"


def test_errors_never_echo_large_input() -> None:
    raw = json.dumps({"apiVersion": "x" * 10_000, "kind": "AdmissionReview"}).encode()
    with pytest.raises(MalformedReview) as caught:
        parse_review(raw)
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}}, "request.object.kind"),
        (
            {"operation": "UPDATE", "oldObject": {**run_pod(), "kind": "Secret"}},
            "request.oldObject.kind",
        ),
    ],
)
def test_an_object_of_another_kind_than_the_review_says_is_malformed(
    request_fields: dict[str, Any], field: str
) -> None:
    """A Pod that says it is a ConfigMap is not judged as one (nor as a Pod): 400."""
    with pytest.raises(MalformedReview, match=f"{field} .* does not match request.kind.kind"):
        parse_review(body(**request_fields))
    plain = run_pod()
    del plain["kind"]  # no kind in the object: nothing to disagree with
    assert parse_review(body(object=plain))["kind"]["kind"] == "Pod"


def test_delete_needs_no_object() -> None:
    request = parse_review(body(operation="DELETE", object=None, oldObject=run_pod()))
    assert request["operation"] == "DELETE"


@pytest.mark.parametrize("mimetype", ["application/json", "Application/JSON"])
def test_json_content_type(mimetype: str) -> None:
    check_content_type(mimetype)


@pytest.mark.parametrize(
    "mimetype", ["", "text/plain", "application/yaml", "application/json-patch"]
)
def test_other_content_types(mimetype: str) -> None:
    with pytest.raises(UnsupportedMediaType) as caught:
        check_content_type(mimetype)
    assert caught.value.status == 415


def test_error_statuses() -> None:
    assert (MalformedReview.status, UnsupportedMediaType.status, BodyTooLarge.status) == (
        400,
        415,
        413,
    )
    assert issubclass(BodyTooLarge, admission.AdmissionError)


# ------------------------------------------------------------------- responses


def test_review_response_allowed_with_patch() -> None:
    patch = [{"op": "add", "path": "/metadata/labels/x", "value": "y"}]
    out = review_response(
        "u1", allowed=True, patch=patch, warnings=["w"], audit_annotations={"profile": "p"}
    )
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch
    assert response["warnings"] == ["w"] and response["auditAnnotations"] == {"profile": "p"}
    assert "status" not in response


@pytest.mark.parametrize("patch", [None, [{"op": "remove", "path": "/a"}]])
def test_encode_review_is_the_review_as_json(patch: Any) -> None:
    review_doc = review_response(
        "u", allowed=True, patch=patch, warnings=['a "quoted" ünï'], audit_annotations={"k": "v"}
    )
    assert json.loads(admission.encode_review(review_doc)) == review_doc


def test_review_response_leaves_out_empty_fields() -> None:
    assert review_response("u", allowed=True)["response"] == {"uid": "u", "allowed": True}


def test_review_response_denied() -> None:
    response = review_response("u", allowed=False, message="runguard denied Pod x")["response"]
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 403,
        "reason": "Forbidden",
        "message": "runguard denied Pod x",
    }


# ---------------------------------------------------------------------- review


def test_review_mutate_patches_a_run_pod(policy: Policy) -> None:
    pod = run_pod()
    request = parse_review(json.dumps(admission_review(pod)).encode())
    outcome = review("mutate", request, policy)
    assert outcome.label == "patched" and outcome.error is None
    assert outcome.decision is not None and outcome.decision.profile == "small"
    response = outcome.response["response"]
    ops = json.loads(base64.b64decode(response["patch"]))
    assert jsonpatch.apply_patch(pod, ops) == outcome.decision.object
    assert response["auditAnnotations"]["profile"] == "small"


def test_review_validate_denies_with_every_violation(policy: Policy) -> None:
    pod = run_pod(hostNetwork=True)
    request = parse_review(json.dumps(admission_review(pod)).encode())
    outcome = review("validate", request, policy)
    assert outcome.label == "denied"
    response = outcome.response["response"]
    assert "patch" not in response
    assert "[security.host-namespace]" in response["status"]["message"]
    assert "[security.root]" in response["status"]["message"]


def test_review_mutate_never_changes_a_running_spec(policy: Policy) -> None:
    """An UPDATE of a pod admitted before this policy (or under another) is not patched:
    the apiserver would refuse the spec change, and with it the unrelated update."""
    pod = run_pod()
    request = parse_review(body(operation="UPDATE", object=pod, oldObject=pod))
    outcome = review("mutate", request, policy)
    assert outcome.label == "allowed"
    assert "patch" not in outcome.response["response"]


def test_review_mutate_puts_back_the_running_spec_on_update(policy: Policy) -> None:
    """``kubectl apply`` of the user's manifest again re-sends what runguard changed at
    creation; the patch restores the running spec, so the apply (a label) goes through."""
    original = run_pod()
    running = engine.mutate(original, policy).object
    resent = copy.deepcopy(running)
    resent["spec"]["containers"] = copy.deepcopy(original["spec"]["containers"])
    resent["metadata"]["labels"]["team"] = "vision"
    request = parse_review(body(operation="UPDATE", object=resent, oldObject=running))
    outcome = review("mutate", request, policy)
    assert outcome.label == "patched"
    patch = json.loads(base64.b64decode(outcome.response["response"]["patch"]))
    assert jsonpatch.apply_patch(resent, patch)["spec"] == running["spec"]
    assert outcome.decision is not None
    assert [c.rule for c in outcome.decision.mutations] == ["update.spec-kept"]


def test_review_passes_the_request_namespace(policy: Policy) -> None:
    pod = run_pod()
    del pod["metadata"]["namespace"]
    request = parse_review(json.dumps(admission_review(pod, namespace="kube-system")).encode())
    outcome = review("mutate", request, policy)
    assert outcome.decision is not None and not outcome.decision.applies


def test_review_denies_when_the_engine_fails() -> None:
    request = parse_review(body())
    broken: Any = None  # not a Policy: the engine cannot work with it
    outcome = review("validate", request, broken)
    assert outcome.label == "error" and outcome.error is not None
    response = outcome.response["response"]
    assert response["allowed"] is False
    assert "internal error" in response["status"]["message"]


# ------------------------------------------------------------------- audit log


def test_audit_record_names_ids_not_content(policy: Policy) -> None:
    pod = run_pod()
    request = parse_review(json.dumps(admission_review(pod, dryRun=True)).encode())
    outcome = review("mutate", request, policy)
    record = audit_record(
        "mutate", request, outcome, latency=0.0012, policy_digest=policy.digest, now=0.0
    )
    assert record["time"] == "1970-01-01T00:00:00.000Z"
    assert record["uid"] == request["uid"] and record["dryRun"] is True
    assert record["kind"] == "Pod" and record["name"] == "train" and record["namespace"] == "ml"
    assert record["user"] == "alice@example.com" and record["profile"] == "small"
    assert record["mutations"] == ["profile.applied", "security.root", "secrets.forbidden"]
    assert record["violations"] == [] and record["allowed"] is True
    assert record["latencyMs"] == 1.2 and record["policy"] == policy.digest
    text = json.dumps(record)
    assert "s3cr3t-env-value" not in text and "someone-elses-secret" not in text


def test_audit_log_writes_one_line_per_record() -> None:
    stream = io.StringIO()
    log = AuditLog(stream)
    log.write({"uid": "a"})
    log.write({"uid": "b", "name": "ünï"})
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["uid"] for line in lines] == ["a", "b"]


def test_audit_log_survives_a_closed_stream(tmp_path: Path) -> None:
    stream = open(tmp_path / "out", "w")  # noqa: SIM115
    stream.close()
    AuditLog(stream).write({"uid": "a"})  # no exception: a review must not fail on logging


def test_warnings_past_the_apiservers_budget_are_counted_not_sent() -> None:
    text = "runguard: allowed on update, already present: [security.root] c"
    many = [f"{text}{i}" for i in range(500)]
    response = admission.review_response("u", allowed=True, warnings=many)["response"]
    shown = response["warnings"]
    assert sum(map(len, shown)) <= admission.WARNINGS_BUDGET
    assert shown[:-1] == many[: len(shown) - 1]
    assert shown[-1] == f"runguard: {500 - (len(shown) - 1)} more warnings not shown"


def test_warnings_within_the_budget_are_all_sent() -> None:
    few = [f"runguard: w{i}" for i in range(20)]
    assert admission.review_response("u", allowed=True, warnings=few)["response"]["warnings"] == few
