"""Scenario 3: a Job, CronJob or Deployment whose run template cannot be fixed is
rejected at ``kubectl apply``; a fixable one is accepted. A Job's or CronJob's template
is stored mutated (the profile where a queue counts it), a Deployment's as sent (its
Pods are what runguard mutates), with warnings saying what will change in them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from webhook.engine.review import TEMPLATE_KEPT

from .cluster import Cluster
from .runs import (
    NONCOMPLIANT_RULES,
    Webhook,
    apply,
    controller,
    exists,
    get,
    header_warnings,
    is_subset,
    kubectl_warnings,
    messy_run_pod,
    noncompliant_run_pod,
    pod,
    pod_template,
    rule_ids,
)

pytestmark = pytest.mark.e2e

KINDS = {"Job": "job", "CronJob": "cronjob", "Deployment": "deployment"}
TEMPLATE_PATH = {
    "Job": "spec.template.spec",
    "CronJob": "spec.jobTemplate.spec.template.spec",
    "Deployment": "spec.template.spec",
}


def assert_stored(kind: str, sent: dict[str, Any], stored: dict[str, Any]) -> None:
    """A Deployment is not patched: the template is what the user wrote. A Job's and a
    CronJob's template is stored with the profile and the fixes, as their Pods get them."""
    template = pod_template(stored)
    if kind == "Deployment":
        assert is_subset(pod_template(sent), template)
        assert template["spec"]["securityContext"] == {"runAsUser": 0, "fsGroup": 0}
        assert "affinity" not in template["spec"]
        assert [v["name"] for v in template["spec"]["volumes"]] == ["shared", "work"]
        return
    spec = template["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"].get("runAsUser") != 0
    assert [v["name"] for v in spec["volumes"]] == ["work"]
    assert spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("nvidia", "high")


def assert_warned(kind: str, warnings: list[str]) -> None:
    """A kept template's warnings say what its Pods will get; a mutated one's what
    was done to it."""
    if kind == "Deployment":
        assert warnings[0] == TEMPLATE_KEPT
        warnings = warnings[1:]
    assert warnings[0].startswith("runguard: profile 1xa100 applied"), warnings
    assert "runguard: pre-existing volumes removed: shared" in warnings


@pytest.mark.parametrize("kind", KINDS)
def test_unfixable_template_is_rejected_at_apply_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str, kind: str
) -> None:
    sent = controller(kind, "bad", noncompliant_run_pod("bad"))
    assert "labels" not in sent["metadata"]  # only the template says "run"
    done = apply(cluster, namespace, sent)
    assert done.returncode != 0
    error = done.stderr.splitlines()[-1]
    assert error.startswith("Error from server (Forbidden)")
    assert 'admission webhook "validate-controllers.runguard.io" denied the request' in error
    assert f"runguard denied {kind} bad" in error
    assert rule_ids(error) == NONCOMPLIANT_RULES
    assert f"{TEMPLATE_PATH[kind]}.hostNetwork" in error
    assert not exists(cluster, namespace, KINDS[kind], "bad")


@pytest.mark.parametrize("kind", KINDS)
def test_fixable_template_is_accepted_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str, kind: str
) -> None:
    sent = controller(kind, "train", messy_run_pod("train"))
    done = apply(cluster, namespace, sent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{KINDS[kind]}.{sent['apiVersion'].split('/')[0]}/train created"
    assert_warned(kind, kubectl_warnings(done.stderr))
    assert_stored(kind, sent, get(cluster, namespace, KINDS[kind], "train"))


def test_controller_that_is_not_a_run_is_accepted(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    template = pod("tool", {"app": "tool"}, hostNetwork=True)
    for kind in KINDS:
        done = apply(cluster, namespace, controller(kind, "tool", template))
        assert done.returncode == 0, done.stderr
        assert kubectl_warnings(done.stderr) == []


def test_controllers_python_client(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    batch, apps = client.BatchV1Api(api_client), client.AppsV1Api(api_client)
    bad = noncompliant_run_pod("bad")
    for create, kind in (
        (batch.create_namespaced_job, "Job"),
        (batch.create_namespaced_cron_job, "CronJob"),
        (apps.create_namespaced_deployment, "Deployment"),
    ):
        with pytest.raises(client.ApiException) as raised:
            create(namespace, controller(kind, "bad", bad))
        assert raised.value.status == 403, kind
        message = json.loads(raised.value.body)["message"]
        assert 'admission webhook "validate-controllers.runguard.io" denied' in message
        assert rule_ids(message) == NONCOMPLIANT_RULES, kind

        sent = controller(kind, "train", messy_run_pod("train"))
        created, status, headers = getattr(create.__self__, create.__name__ + "_with_http_info")(
            namespace, sent
        )
        assert status == 201
        assert_warned(kind, header_warnings(headers))
        assert_stored(kind, sent, api_client.sanitize_for_serialization(created))
