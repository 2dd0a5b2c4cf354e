"""Engine errors are errors (issue 8): a bug in a step is denied for the run with its own
rule id (fail closed), logged with its traceback and the request's identity, and counted
in the reviews metric as ``error``; never reported as bad input.

The app is driven in-process (its WSGI test client): a fault injected into the engine
cannot cross into a gunicorn worker, and what is under test is the app's handling of
the engine's answer, not HTTP."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from harness import TESTS

from webhook.engine import rules
from webhook.serving import metrics
from webhook.serving.app import create_app

POLICY = TESTS / "cases" / "_policies" / "platform"


def review(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "ml",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "train",
                    "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"},
                },
                "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
            },
        },
    }


def count(endpoint: str, decision: str) -> float:
    value = metrics.get().reviews.labels(endpoint, decision)._value.get()
    return float(value)


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_a_failing_step_is_denied_logged_and_counted(
    endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    def broken(pod: Any) -> None:
        raise KeyError("injected fault")

    monkeypatch.setattr(rules, "MUTATION_STEPS", (*rules.MUTATION_STEPS, broken))
    before = count(endpoint, "error")
    with (tmp_path / "audit.log").open("w") as audit, caplog.at_level(logging.ERROR):
        client = create_app({"policy_dir": str(POLICY), "audit_stream": audit}).test_client()
        answer = client.post(
            f"/{endpoint}", data=json.dumps(review("uid-42")), content_type="application/json"
        )
    assert answer.status_code == 200  # an answer the apiserver can use, not a 500
    response = answer.get_json()["response"]
    assert response["uid"] == "uid-42" and response["allowed"] is False
    assert "engine.error" in response["status"]["message"]
    assert "input.invalid" not in response["status"]["message"]
    assert count(endpoint, "error") == before + 1
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged and "uid-42" in logged[-1].getMessage()
    assert logged[-1].exc_info is not None and logged[-1].exc_info[0] is KeyError
