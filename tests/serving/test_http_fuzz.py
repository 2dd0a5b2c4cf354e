"""Fuzzing the admission endpoints through a real ``runguard serve`` (gunicorn, TLS).

Reviews built from ``harness.fuzz``'s generators (run Pods and random values,
their JSON text with random edits) and odd request fields (operations, uids, dry runs,
namespaces, user infos, old objects, content types) go to ``/mutate`` and ``/validate``.
Every answer is a JSON error with a 4xx status, or a 200 AdmissionReview answering the
request's uid; never a 5xx, never a crashed worker. Each answer is also the one the
same review gets from ``webhook.serving.admission`` in-process with the same policy (same status,
same decision): the HTTP layer neither loses nor flips a decision. And a run Pod with
``hostPID``, whatever noise rides along, is never allowed by ``/validate``.

A fixed, bounded set of examples (``derandomize``: the same ones on every run, so CI
never turns red by chance) and no deadline (a shared machine's pauses are not failures).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness import REPO, RunguardServer, admission_review, run_pod
from harness.fuzz import SHORT as FILES
from harness.fuzz import edited, pods, scalars, values, written
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.policy.loader import load_policy  # noqa: E402
from webhook.serving.admission import AdmissionError, parse_review, review  # noqa: E402

# the file fuzz's short settings; its fixture is the module's server
SHORT = settings(FILES, max_examples=150, suppress_health_check=list(HealthCheck))
POLICY = load_policy(REPO / "policies")  # what runguard_server serves
JSON_TYPE = {"Content-Type": "application/json"}
OPERATIONS = ["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH", "", None, 1]

# --- inputs ---------------------------------------------------------------------------

objects = st.one_of(pods, st.builds(run_pod), values)
requests = st.fixed_dictionaries(
    {"object": objects},
    optional={
        "operation": st.sampled_from(OPERATIONS),
        "uid": st.one_of(st.text(max_size=40), scalars),
        "dryRun": st.one_of(st.booleans(), scalars),
        "namespace": st.one_of(st.sampled_from(["ml", "kube-system", ""]), scalars),
        "name": st.one_of(st.text(max_size=12), scalars),
        "userInfo": st.one_of(
            st.fixed_dictionaries(
                {"username": st.one_of(st.text(max_size=12), scalars)},
                optional={"groups": st.one_of(st.lists(st.text(max_size=8)), values)},
            ),
            values,
        ),
        "oldObject": objects,
        "kind": st.one_of(
            st.fixed_dictionaries(
                {"kind": st.sampled_from(["Pod", "Job", "ConfigMap", ""]), "version": st.just("v1")}
            ),
            values,
        ),
    },
)


@st.composite
def reviews(draw: st.DrawFn) -> bytes:
    """An AdmissionReview with random fields, its JSON text sometimes edited or wrapped."""
    request = draw(requests)
    doc: Any = admission_review(request.pop("object"))
    doc["request"].update(request)
    shape = draw(st.sampled_from(["review", "review", "edited", "top-level", "other"]))
    if shape == "top-level":  # what wraps the request: apiVersion, kind, extra keys
        doc.update(draw(st.dictionaries(st.sampled_from(["apiVersion", "kind", "x"]), scalars)))
    text = json.dumps(doc)
    if shape == "edited":
        text = draw(edited(st.just(text)))
    elif shape == "other":
        text = draw(written)  # JSON or YAML of a Pod or a random value: not a review
    return text.encode("utf-8", "surrogatepass")


noise = st.dictionaries(st.text(min_size=1, max_size=8).map(lambda k: "x-" + k), values, max_size=3)


@st.composite
def host_pid_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A run Pod with ``hostPID``, random keys beside it in the spec, its containers and
    its metadata: always a violation of the repository's policies."""
    pod = run_pod()
    pod["metadata"]["annotations"] = draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8)))
    pod["spec"]["containers"][0].update(draw(noise))
    pod["spec"].update(draw(noise))
    pod["spec"]["hostPID"] = True
    pod.update(draw(noise))
    return pod


# --- checks ---------------------------------------------------------------------------


def in_process(path: str, body: bytes) -> tuple[int, bool | None]:
    """(status, allowed) that ``webhook.serving.admission`` gives this body with the same policy."""
    try:
        request = parse_review(body)
    except AdmissionError as error:
        return error.status, None
    outcome = review("mutate" if path == "/mutate" else "validate", request, POLICY)
    return 200, outcome.response["response"]["allowed"]


def answer(server: RunguardServer, path: str, body: bytes, content_type: str) -> dict[str, Any]:
    """The server's answer, checked for shape: a 4xx JSON error or a 200 review."""
    resp = server.post(path, body, headers={"Content-Type": content_type})
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    assert resp.headers["Content-Type"] == "application/json", resp.headers
    doc: dict[str, Any] = resp.json()
    if resp.status_code != 200:
        assert 400 <= resp.status_code < 500
        assert doc["code"] == resp.status_code and doc["error"] and doc["message"]
        return {"status": resp.status_code}
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    out = doc["response"]
    assert out["uid"] == json.loads(body)["request"]["uid"]
    assert isinstance(out["allowed"], bool)
    return {"status": 200, "allowed": out["allowed"]}


@pytest.fixture(scope="module")
def workers(runguard_server: RunguardServer) -> set[int]:
    """The server's workers before the examples; it serves ``POLICY``."""
    assert runguard_server.get("/readyz").json()["policy"]["digest"] == POLICY.digest
    return runguard_server.worker_pids()


@SHORT
@given(
    body=reviews(),
    path=st.sampled_from(["/mutate", "/validate"]),
    content_type=st.sampled_from(["application/json"] * 8 + ["text/plain", "application/yaml"]),
)
def test_any_review_gets_a_json_error_or_the_in_process_decision(
    runguard_server: RunguardServer, workers: set[int], body: bytes, path: str, content_type: str
) -> None:
    got = answer(runguard_server, path, body, content_type)
    if content_type != "application/json":
        assert got == {"status": 415}
        return
    status, allowed = in_process(path, body)
    assert got["status"] == status
    if status == 200:
        assert got["allowed"] is allowed


@SHORT
@given(pod=host_pid_pods())
def test_a_run_pod_with_host_pid_is_never_allowed_whatever_rides_along(
    runguard_server: RunguardServer, workers: set[int], pod: dict[str, Any]
) -> None:
    body = json.dumps(admission_review(pod, namespace="ml")).encode("utf-8", "surrogatepass")
    got = answer(runguard_server, "/validate", body, "application/json")
    assert got.get("allowed") is not True, got  # denied, or refused as malformed


def test_the_fuzzed_server_is_whole(runguard_server: RunguardServer, workers: set[int]) -> None:
    """After the examples above: the same workers, no traceback, still ready."""
    assert runguard_server.worker_pids() == workers
    assert "Traceback" not in runguard_server.stderr
    assert runguard_server.get("/readyz").json()["status"] == "ready"
