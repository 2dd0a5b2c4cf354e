"""The HTTP contract (docs/dev/server.md, "Endpoints") through a real ``runguard serve``: gunicorn,
TLS, real HTTP."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import requests
from harness import RunguardServer, admission_review, run_pod, sample_policy


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunguardServer]:
    srv = RunguardServer(tmp_path_factory.mktemp("contract"), policy=sample_policy())
    srv.start()
    yield srv
    srv.stop()


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


# ----------------------------------------------------------------------- /mutate


def test_mutate_patches_a_run_pod_and_echoes_the_uid(server: RunguardServer) -> None:
    pod = run_pod()
    review = admission_review(pod, namespace="ml")
    resp = server.post("/mutate", review)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "application/json"
    out = resp.json()["response"]
    assert out["uid"] == review["request"]["uid"]
    assert out["allowed"] is True
    result = patched(pod, out)
    assert result["spec"]["securityContext"]["runAsUser"] == 8877
    main = result["spec"]["containers"][0]
    assert main["resources"]["requests"]["memory"] == "2Gi"
    assert [e["name"] for e in main["env"]] == ["TOKEN"]
    assert all(w.startswith("runguard: ") and len(w) < 120 for w in out["warnings"])
    annotations = out["auditAnnotations"]
    assert annotations["profile"] == "small"
    assert {"profile.applied", "security.root", "secrets.forbidden"} <= set(
        annotations["mutations"].split(",")
    )
    assert "status" not in out


def test_mutate_uses_the_review_namespace_when_the_pod_has_none(server: RunguardServer) -> None:
    pod = run_pod()
    del pod["metadata"]["namespace"]
    out = server.review("/mutate", pod, namespace="kube-system")  # excluded namespace
    assert out["allowed"] is True and "patch" not in out and "auditAnnotations" not in out


def test_mutate_leaves_other_objects_untouched(server: RunguardServer) -> None:
    pod = run_pod()
    pod["metadata"]["labels"] = {"app": "not-a-run"}
    out = server.review("/mutate", pod)
    assert out == {"uid": out["uid"], "allowed": True}


def test_mutate_patches_only_on_create(server: RunguardServer) -> None:
    pod = run_pod()
    out = server.review("/mutate", pod, operation="UPDATE", oldObject=pod)
    assert out == {"uid": out["uid"], "allowed": True}


def test_delete_is_allowed_without_an_object(server: RunguardServer) -> None:
    for path in ("/mutate", "/validate"):
        out = server.review(path, None, operation="DELETE", oldObject=run_pod())
        assert out["allowed"] is True and "patch" not in out


# --------------------------------------------------------------------- /validate


def test_validate_denies_listing_every_violation(server: RunguardServer) -> None:
    pod = run_pod(hostNetwork=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    out = server.review("/validate", pod)
    assert out["allowed"] is False
    status = out["status"]
    assert status["code"] == 403
    for rule in (
        "security.root",
        "security.privileged",
        "security.host-namespace",
        "volumes.forbidden-type",
    ):
        assert f"[{rule}]" in status["message"]
        assert rule in out["auditAnnotations"]["violations"]
    assert "patch" not in out


def test_validate_allows_a_compliant_run_pod(server: RunguardServer) -> None:
    pod = run_pod()
    pod = patched(pod, server.review("/mutate", pod))
    out = server.review("/validate", pod)
    assert out["allowed"] is True and "status" not in out and "patch" not in out


def test_validate_judges_pod_templates_of_controllers(server: RunguardServer) -> None:
    template = run_pod()
    template["metadata"]["labels"]["dhcore/template"] = "no-such-profile"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml", "labels": template["metadata"]["labels"]},
        "spec": {"template": {"metadata": template["metadata"], "spec": template["spec"]}},
    }
    out = server.review("/validate", job)
    assert out["allowed"] is False
    assert "[profile.unknown]" in out["status"]["message"]
    # controllers are judged; a Job's template is patched at CREATE (where a queue counts
    # it), and the Job gets the label of the RunPolicy that governs it
    mutated = server.review("/mutate", job)
    assert mutated["allowed"] is True
    patch = json.loads(base64.b64decode(mutated["patch"]))
    label = {"op": "add", "path": "/metadata/labels/runguard.io~1policy", "value": "http-test"}
    assert patch[0] == label
    assert patch[1:] and all(op["path"].startswith("/spec/template/spec/") for op in patch[1:])
    # a Deployment's template is never patched: its Pods are
    deployment = {**job, "apiVersion": "apps/v1", "kind": "Deployment"}
    deployment["spec"] = {"selector": {"matchLabels": {"app": "j"}}, **job["spec"]}
    mutated = server.review("/mutate", deployment)
    assert json.loads(base64.b64decode(mutated["patch"])) == [label]


def test_validate_update_ignores_violations_already_there(server: RunguardServer) -> None:
    old = run_pod()
    new = run_pod()
    new["metadata"]["labels"]["extra"] = "label"
    out = server.review("/validate", new, operation="UPDATE", oldObject=old)
    assert out["allowed"] is True
    fresh = server.review("/validate", new)
    assert fresh["allowed"] is False


def test_an_object_the_engine_cannot_understand_is_denied(server: RunguardServer) -> None:
    pod = run_pod()
    pod["spec"]["containers"] = {"name": "main"}
    out = server.review("/validate", pod)
    assert out["allowed"] is False
    assert "[input.invalid]" in out["status"]["message"]
    # the mutating webhook leaves it alone for the validating one to deny
    assert "patch" not in server.review("/mutate", pod)


def test_dry_run_is_answered_the_same_and_logged_as_such(server: RunguardServer) -> None:
    pod = run_pod()
    wet = server.review("/mutate", pod)
    dry = server.review("/mutate", pod, dryRun=True)
    assert {k: v for k, v in dry.items() if k != "uid"} == {
        k: v for k, v in wet.items() if k != "uid"
    }
    server.wait_for(lambda: any(a["uid"] == dry["uid"] for a in server.audit_lines()), "audit")
    lines = {a["uid"]: a for a in server.audit_lines()}
    assert lines[dry["uid"]]["dryRun"] is True
    assert lines[wet["uid"]]["dryRun"] is False


# --------------------------------------------------------------------- audit log


def test_audit_log_has_one_line_per_decision_and_no_secrets(server: RunguardServer) -> None:
    pod = run_pod()
    review = admission_review(pod, namespace="ml")
    server.post("/mutate", review)
    denied = run_pod(hostPID=True)
    denied_out = server.review("/validate", denied)
    uid = review["request"]["uid"]
    server.wait_for(lambda: denied_out["uid"] in server.stdout, "audit line")
    lines = {a["uid"]: a for a in server.audit_lines()}
    line = lines[uid]
    assert set(line) >= {
        "time",
        "uid",
        "operation",
        "kind",
        "namespace",
        "name",
        "user",
        "dryRun",
        "profile",
        "mutations",
        "violations",
        "allowed",
        "enforcement",
        "latencyMs",
    }
    assert line["operation"] == "CREATE" and line["kind"] == "Pod"
    assert line["namespace"] == "ml" and line["name"] == "train"
    assert line["user"] == "alice@example.com"
    assert line["profile"] == "small" and "security.root" in line["mutations"]
    assert line["allowed"] is True and line["endpoint"] == "mutate"
    assert line["latencyMs"] >= 0
    bad = lines[denied_out["uid"]]
    assert bad["allowed"] is False and "security.host-namespace" in bad["violations"]
    assert bad["enforcement"] == "Deny"
    everything = server.stdout + server.stderr
    assert "s3cr3t-env-value" not in everything
    assert "someone-elses-secret" not in everything
    assert "python:3.11" not in everything  # no object dumps


# ------------------------------------------------------------------------ 4xx


def _error(resp: requests.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"] == "application/json"
    body: dict[str, Any] = resp.json()
    assert body["code"] == status and body["error"] and body["message"]
    return body


REVIEW = admission_review(run_pod())


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "empty body"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[" * 100_000, "JSON"),
        (json.dumps({**REVIEW, "apiVersion": "admission.k8s.io/v1beta1"}), "apiVersion"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            "no request",
        ),
        (json.dumps({**REVIEW, "request": {**REVIEW["request"], "uid": ""}}), "uid"),
        (
            json.dumps({**REVIEW, "request": {**REVIEW["request"], "operation": "PATCH"}}),
            "operation",
        ),
        (json.dumps({**REVIEW, "request": {**REVIEW["request"], "object": "pod"}}), "object"),
        (json.dumps({**REVIEW, "request": {**REVIEW["request"], "object": None}}), "object"),
        (json.dumps({**REVIEW, "request": {**REVIEW["request"], "dryRun": "yes"}}), "dryRun"),
    ],
)
def test_malformed_reviews_are_400(server: RunguardServer, body: Any, fragment: str) -> None:
    for path in ("/mutate", "/validate"):
        resp = server.post(path, body, headers={"Content-Type": "application/json"})
        assert fragment in _error(resp, 400)["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_non_json_content_type_is_415(server: RunguardServer, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    resp = server.post("/mutate", json.dumps(REVIEW).encode(), headers=headers)
    _error(resp, 415)


def test_an_oversized_body_is_413(server: RunguardServer) -> None:
    huge = run_pod()
    huge["metadata"]["annotations"] = {"blob": "x" * (5 * 1024 * 1024)}
    resp = server.post("/validate", admission_review(huge))
    assert "limit" in _error(resp, 413)["message"]
    # chunked, without a Content-Length: the limit holds while reading
    chunks = (
        json.dumps(admission_review(huge)).encode()[i : i + 65536]
        for i in range(0, 6 * 1024 * 1024, 65536)
    )
    resp = server.post("/validate", chunks, headers={"Content-Type": "application/json"})  # type: ignore[arg-type]
    _error(resp, 413)


def test_wrong_method_and_unknown_path_are_json_errors(server: RunguardServer) -> None:
    _error(server.get("/mutate"), 405)
    _error(server.get("/nope"), 404)
    _error(server.post("/nope", REVIEW), 404)


def test_bad_requests_crash_nothing(server: RunguardServer) -> None:
    before = server.worker_pids()
    for body in (b"", b"{", b"[" * 100_000, b"\x00" * 1000):
        server.post("/mutate", body, headers={"Content-Type": "application/json"})
    assert server.worker_pids() == before
    assert server.get("/healthz").status_code == 200
    assert "Traceback" not in server.stderr


# --------------------------------------------------------------- probes, metrics


def test_healthz_and_readyz(server: RunguardServer) -> None:
    assert server.get("/healthz").json() == {"status": "ok"}
    ready = server.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert body["policy"]["name"] == "http-test"
    assert len(body["policy"]["digest"]) >= 8
    assert body["policy"]["profiles"] == ["small"]
    assert "rejected" not in body


def test_metrics_are_prometheus_text(server: RunguardServer) -> None:
    resp = server.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    samples = server.metrics()
    assert ("runguard_policy_rejected", ()) in samples
    assert samples[("runguard_certificate_expiry_timestamp_seconds", ())] > 0


# ---------------------------------------------------------------------------- TLS


def test_plain_http_is_not_served(server: RunguardServer) -> None:
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)


def test_tls_1_2_or_newer_only(server: RunguardServer) -> None:
    modern = ssl.create_default_context(cafile=str(server.ca_file))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with modern.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(str(server.ca_file))
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # so that this client really offers TLS 1.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"):  # the server's refusal
            old.wrap_socket(raw, server_hostname="127.0.0.1")


def test_connections_are_kept_alive(server: RunguardServer) -> None:
    session = server.session()
    for _ in range(5):
        resp = server.post("/mutate", REVIEW, session=session)
        assert resp.status_code == 200
        assert resp.headers.get("Connection", "").lower() != "close"
    pool = session.get_adapter(server.url).poolmanager  # type: ignore[attr-defined]
    assert sum(p.num_connections for p in pool.pools._container.values()) == 1


def test_serve_refuses_a_bad_policy_at_start(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    bad = RunguardServer(
        tmp_path,
        policy={"runpolicy.yaml": "kind: RunPolicy\nspec: 3\n"},
        env={"TMPDIR": str(scratch)},
    )
    with pytest.raises(RuntimeError, match="exited 2"):
        bad.start()
    assert "runpolicy.yaml:" in bad.stderr
    assert list(scratch.iterdir()) == []  # no metrics directory left behind
