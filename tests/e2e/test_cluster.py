"""Smoke test of the e2e cluster itself: apiserver, kubectl, Python client, audit log."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubernetes import client

from .build import kubernetes_modfile
from .cluster import Cluster

pytestmark = pytest.mark.e2e

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: smoke
  labels: {app: smoke}
spec:
  containers:
  - name: main
    image: busybox:1.36
    command: [sleep, "3600"]
"""


def _minor(version: dict[str, Any]) -> int:
    return int(re.match(r"\d+", version["minor"]).group())  # type: ignore[union-attr]


def test_apiserver_is_ready_and_pinned(cluster: Cluster) -> None:
    ready = cluster.kubectl("get", "--raw", "/readyz", check=True)
    assert ready.stdout.strip() == "ok"

    versions = json.loads(cluster.kubectl("version", "-o", "json", check=True).stdout)
    pinned = re.search(r"k8s\.io/kubernetes (v\S+)", kubernetes_modfile().read_text())
    assert pinned is not None
    assert versions["serverVersion"]["gitVersion"] == pinned.group(1)
    # kubectl supports one minor version of skew either way.
    assert abs(_minor(versions["clientVersion"]) - _minor(versions["serverVersion"])) <= 1


def test_pod_created_with_kubectl_reads_back_with_python_client(
    cluster: Cluster, api_client: Any, namespace: str
) -> None:
    created = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=POD)
    assert created.returncode == 0, created.stderr
    assert "pod/smoke created" in created.stdout

    pod = client.CoreV1Api(api_client).read_namespaced_pod("smoke", namespace)
    assert pod.metadata.labels == {"app": "smoke"}
    assert pod.spec.containers[0].image == "busybox:1.36"
    assert pod.status.phase == "Pending"  # no scheduler, no kubelet

    event = cluster.wait_for_audit_event(
        verb="create", resource="pods", namespace=namespace, name="smoke"
    )
    assert event["level"] == "Request"
    assert event["responseStatus"]["code"] == 201
    assert event["requestObject"]["metadata"]["name"] == "smoke"
    assert "system:masters" in event["user"]["groups"]
