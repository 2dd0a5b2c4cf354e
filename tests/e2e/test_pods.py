"""Run Pods through the real apiserver: mutated (1), rejected (2), untouched (4).

Each scenario goes through kubectl and through the ``kubernetes`` Python client, as a
user's ``kubectl apply`` and the platform's SDK would submit it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from .cluster import Cluster
from .devcluster import PRIORITIES
from .runs import (
    EXCLUDED_NAMESPACE,
    GPU_TOLERATION,
    MESSY_MUTATED_SPEC,
    MESSY_WARNINGS,
    NONCOMPLIANT_RULES,
    RUN_LABELS,
    Webhook,
    apply,
    exists,
    get,
    header_warnings,
    is_subset,
    kubectl_warnings,
    messy_run_pod,
    noncompliant_run_pod,
    picked,
    pod,
    rule_ids,
    run_pod,
)

pytestmark = pytest.mark.e2e


def assert_messy_pod_mutated(stored: dict[str, Any]) -> None:
    """What runguard must have made of ``messy_run_pod``, as the apiserver stored it."""
    spec = stored["spec"]
    assert picked(spec, MESSY_MUTATED_SPEC) == MESSY_MUTATED_SPEC
    assert is_subset(MESSY_MUTATED_SPEC, spec)
    # runguard dropped spec.priority with the class; the Priority plugin recomputed it.
    assert spec["priority"] == PRIORITIES["high"]
    # The profile's toleration, after the two the DefaultTolerationSeconds plugin adds.
    assert GPU_TOLERATION in spec["tolerations"]
    assert [t["key"] for t in spec["tolerations"] if t != GPU_TOLERATION] == [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]
    assert "volumeMounts" not in spec["containers"][1]
    # the run's labels, and the RunPolicy that governs it for its whole life
    assert stored["metadata"]["labels"] == {
        **RUN_LABELS,
        "dhcore/template": "1xa100",
        "runguard.io/policy": "platform",
    }


def assert_messy_warnings(warnings: list[str]) -> None:
    assert len(warnings) == len(MESSY_WARNINGS), warnings
    for got, expected in zip(warnings, MESSY_WARNINGS, strict=True):
        assert got.startswith(expected), (got, expected)
        assert len(got) <= 120


# --- 1. mutated ------------------------------------------------------------------------


def test_run_pod_is_created_mutated_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    done = apply(cluster, namespace, messy_run_pod("train"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pod/train created"
    assert_messy_warnings(kubectl_warnings(done.stderr))

    assert_messy_pod_mutated(get(cluster, namespace, "pod", "train"))


def test_run_pod_is_created_mutated_python_client(
    api_client: Any, runguard: Webhook, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    created, status, headers = core.create_namespaced_pod_with_http_info(
        namespace, messy_run_pod("train")
    )
    assert status == 201
    assert_messy_warnings(header_warnings(headers))
    assert_messy_pod_mutated(api_client.sanitize_for_serialization(created))
    stored = core.read_namespaced_pod("train", namespace)
    assert_messy_pod_mutated(api_client.sanitize_for_serialization(stored))


def test_priority_class_replaced_gets_the_new_classs_priority(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    """A class the policy does not allow is replaced by its default, and the
    apiserver's Priority plugin computes spec.priority from the new class."""
    urgent = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": "e2e-urgent"}, "value": 500000}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(urgent), check=True)
    done = apply(cluster, namespace, run_pod("urgent", priorityClassName="e2e-urgent"))
    assert done.returncode == 0, done.stderr
    spec = get(cluster, namespace, "pod", "urgent")["spec"]
    assert (spec["priorityClassName"], spec["priority"]) == ("medium", PRIORITIES["medium"])

    created = client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, run_pod("defaulted", "1xa100")
    )
    assert (created.spec.priority_class_name, created.spec.priority) == ("high", PRIORITIES["high"])


# --- 2. rejected -----------------------------------------------------------------------


def test_noncompliant_run_pod_is_rejected_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    done = apply(cluster, namespace, noncompliant_run_pod("bad"))
    assert done.returncode != 0
    error = done.stderr.splitlines()[-1]
    assert error.startswith("Error from server (Forbidden)")
    assert 'admission webhook "validate.runguard.io" denied the request' in error
    assert rule_ids(error) == NONCOMPLIANT_RULES
    assert "profile '8xh100' does not exist" in error
    assert not exists(cluster, namespace, "pod", "bad")


def test_noncompliant_run_pod_is_rejected_python_client(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    with pytest.raises(client.ApiException) as raised:
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, noncompliant_run_pod("bad"))
    assert raised.value.status == 403
    status = json.loads(raised.value.body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Forbidden", 403)
    assert 'admission webhook "validate.runguard.io" denied the request' in status["message"]
    assert rule_ids(status["message"]) == NONCOMPLIANT_RULES
    assert not exists(cluster, namespace, "pod", "bad")


# --- 4. untouched ----------------------------------------------------------------------

ROOTFUL_SPEC: dict[str, Any] = {
    "hostNetwork": True,
    "securityContext": {"runAsUser": 0},
    "containers": [
        {
            "name": "main",
            "image": "python:3.11",
            "resources": {"requests": {"cpu": "64", "memory": "512Gi"}},
            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
        }
    ],
    "volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}],
}

UNTOUCHED_CASES = {
    "no-labels": (pod("plain", **ROOTFUL_SPEC), None),
    "other-manager": (pod("other", {"app.kubernetes.io/managed-by": "helm"}, **ROOTFUL_SPEC), None),
    "no-run-id": (pod("norun", {"app.kubernetes.io/managed-by": "dhcore"}, **ROOTFUL_SPEC), None),
    "excluded-namespace": (run_pod("excluded", "8xh100", **ROOTFUL_SPEC), EXCLUDED_NAMESPACE),
}


def assert_untouched(cluster: Cluster, sent: dict[str, Any], stored: dict[str, Any]) -> None:
    assert is_subset(sent["spec"], stored["spec"]), picked(stored["spec"], sent["spec"])
    assert stored["metadata"].get("labels") == sent["metadata"].get("labels")
    for added in ("affinity", "priorityClassName", "runtimeClassName", "nodeSelector"):
        assert added not in stored["spec"]
    assert stored["spec"]["securityContext"] == {"runAsUser": 0}
    assert "securityContext" not in stored["spec"]["containers"][0]
    meta = stored["metadata"]
    event = cluster.wait_for_audit_event(
        verb="create", resource="pods", namespace=meta["namespace"], name=meta["name"]
    )
    assert event["responseStatus"]["code"] == 201
    assert not [key for key in event.get("annotations", {}) if "runguard" in key or
                "webhook.serving.admission" in key]  # fmt: skip


@pytest.mark.parametrize("case", UNTOUCHED_CASES)
def test_not_a_run_or_excluded_namespace_is_untouched_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str, case: str
) -> None:
    sent, where = UNTOUCHED_CASES[case]
    where = where or namespace
    name = f"{sent['metadata']['name']}-{namespace[-6:]}"  # one namespace for all runs
    sent = {**sent, "metadata": {**sent["metadata"], "name": name}}
    done = apply(cluster, where, sent)
    assert done.returncode == 0, done.stderr
    assert kubectl_warnings(done.stderr) == []
    stored = get(cluster, where, "pod", name)
    assert_untouched(cluster, sent, stored)


def test_not_a_run_is_untouched_python_client(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    sent, _ = UNTOUCHED_CASES["other-manager"]
    created, status, headers = client.CoreV1Api(api_client).create_namespaced_pod_with_http_info(
        namespace, sent
    )
    assert status == 201
    assert "Warning" not in headers
    assert_untouched(cluster, sent, api_client.sanitize_for_serialization(created))
