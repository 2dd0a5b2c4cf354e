"""Scenario 5: ``--dry-run=server`` gives the answer the real request gets, and
creates nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from .cluster import Cluster
from .runs import (
    NONCOMPLIANT_RULES,
    Webhook,
    apply,
    controller,
    exists,
    get,
    header_warnings,
    kubectl_warnings,
    messy_run_pod,
    noncompliant_run_pod,
    rule_ids,
)

pytestmark = pytest.mark.e2e


def denial(stderr: str) -> str:
    """runguard's message in kubectl's error line (after the webhook's name)."""
    return stderr.splitlines()[-1].split("denied the request: ", 1)[1]


def test_dry_run_mutates_as_the_real_create_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    sent = messy_run_pod("train")
    dry = apply(cluster, namespace, sent, "--dry-run=server", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    assert not exists(cluster, namespace, "pod", "train")

    real = apply(cluster, namespace, sent)
    assert real.returncode == 0, real.stderr
    assert kubectl_warnings(dry.stderr) == kubectl_warnings(real.stderr)
    assert json.loads(dry.stdout)["spec"] == get(cluster, namespace, "pod", "train")["spec"]


def test_dry_run_denies_as_the_real_create_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    for kind, sent in (
        ("pod", noncompliant_run_pod("bad")),
        ("job", controller("Job", "bad", noncompliant_run_pod("bad"))),
    ):
        dry = apply(cluster, namespace, sent, "--dry-run=server")
        assert dry.returncode != 0
        assert rule_ids(denial(dry.stderr)) == NONCOMPLIANT_RULES
        assert not exists(cluster, namespace, kind, "bad")
        real = apply(cluster, namespace, sent)
        assert real.returncode != 0
        assert denial(dry.stderr) == denial(real.stderr)


def test_dry_run_python_client(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    dry, status, dry_headers = core.create_namespaced_pod_with_http_info(
        namespace, messy_run_pod("train"), dry_run="All"
    )
    assert status == 201
    assert not exists(cluster, namespace, "pod", "train")
    real, _, real_headers = core.create_namespaced_pod_with_http_info(
        namespace, messy_run_pod("train")
    )
    assert header_warnings(dry_headers) == header_warnings(real_headers)
    assert api_client.sanitize_for_serialization(dry.spec) == api_client.sanitize_for_serialization(
        real.spec
    )

    with pytest.raises(client.ApiException) as raised:
        core.create_namespaced_pod(namespace, noncompliant_run_pod("bad"), dry_run="All")
    assert raised.value.status == 403
    assert rule_ids(json.loads(raised.value.body)["message"]) == NONCOMPLIANT_RULES
    assert not exists(cluster, namespace, "pod", "bad")
