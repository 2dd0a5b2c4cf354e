"""Scenario 6: the kube-apiserver's audit log holds runguard's ``auditAnnotations``,
prefixed by the webhook's name, for the requests it mutated, denied or left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .cluster import Cluster
from .runs import (
    MESSY_MUTATIONS,
    NONCOMPLIANT_RULES,
    Webhook,
    apply,
    controller,
    messy_run_pod,
    noncompliant_run_pod,
    pod,
)

pytestmark = pytest.mark.e2e


def runguard_annotations(event: dict[str, Any]) -> dict[str, str]:
    return {
        key: value
        for key, value in event.get("annotations", {}).items()
        if key.split("/")[0].endswith("runguard.io")
    }


def listed(value: str) -> set[str]:
    return set(value.split(","))


def test_audit_log_holds_runguard_annotations(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    assert apply(cluster, namespace, messy_run_pod("train")).returncode == 0
    assert apply(cluster, namespace, noncompliant_run_pod("bad")).returncode != 0
    job = controller("Job", "bad-job", noncompliant_run_pod("bad"))
    assert apply(cluster, namespace, job).returncode != 0
    assert apply(cluster, namespace, pod("plain")).returncode == 0

    def event(resource: str, name: str) -> dict[str, Any]:
        return cluster.wait_for_audit_event(
            verb="create", resource=resource, namespace=namespace, name=name
        )

    mutated = event("pods", "train")
    assert mutated["responseStatus"]["code"] == 201
    annotations = runguard_annotations(mutated)
    assert annotations["mutate.runguard.io/profile"] == "1xa100"
    assert listed(annotations["mutate.runguard.io/mutations"]) == MESSY_MUTATIONS
    assert "validate.runguard.io/violations" not in annotations
    # The apiserver's own record of the patch it applied, as an object.
    patch = json.loads(mutated["annotations"]["patch.webhook.admission.k8s.io/round_0_index_0"])
    assert patch["webhook"] == "mutate.runguard.io"
    assert {"op": "remove", "path": "/spec/priority"} in patch["patch"]
    # Level Request: the object as the user sent it, before runguard.
    assert mutated["requestObject"]["spec"]["securityContext"] == {"runAsUser": 0, "fsGroup": 0}

    denied = event("pods", "bad")
    assert denied["responseStatus"]["code"] == 403
    annotations = runguard_annotations(denied)
    assert listed(annotations["validate.runguard.io/violations"]) == NONCOMPLIANT_RULES
    assert annotations["validate.runguard.io/enforcement"] == "Deny"

    denied_job = event("jobs", "bad-job")
    assert denied_job["responseStatus"]["code"] == 403
    annotations = runguard_annotations(denied_job)
    assert listed(annotations["validate-controllers.runguard.io/violations"]) == NONCOMPLIANT_RULES

    untouched = event("pods", "plain")
    assert untouched["responseStatus"]["code"] == 201
    assert runguard_annotations(untouched) == {}


def test_audit_log_marks_dry_runs(cluster: Cluster, runguard: Webhook, namespace: str) -> None:
    assert apply(cluster, namespace, noncompliant_run_pod("bad"), "--dry-run=server").returncode
    event = cluster.wait_for_audit_event(
        verb="create", resource="pods", namespace=namespace, name="bad"
    )
    assert "dryRun=All" in event["requestURI"]
    assert listed(runguard_annotations(event)["validate.runguard.io/violations"]) == (
        NONCOMPLIANT_RULES
    )
