"""Project profiles: a RunPolicy that lets projects bring their own (``RUN_POLICY``), a few
``PROFILES``, and the cluster that holds a project's ``ProjectProfile`` (``cluster``, ``run``)."""

from __future__ import annotations

from typing import Any

from webhook.clusterstate import StaticClusterState
from webhook.engine.context import Context

RUN_POLICY = """\
    apiVersion: runguard.io/v1
    kind: RunPolicy
    metadata: {name: teams}
    spec:
      selector: {matchLabels: {app.kubernetes.io/managed-by: dhcore}}
      excludeNamespaces: [sandbox]
      profiles: {label: dhcore/template, unknown: Deny}
      resources:
        maximums: {cpu: "16", memory: 64Gi, gpu: "2"}
        families:
          - {name: nvidia, max: 14, members: {nvidia.com/gpu: 7}}
      scheduling:
        priorityClasses: {allowed: [low, high]}
      security: {runAsUser: 8877}
    """

PROFILES = """\
    {apiVersion: runguard.io/v1, kind: Profile, metadata: {name: small},
     spec: {resources: {requests: {cpu: "1", memory: 2Gi}}}}
    ---
    {apiVersion: runguard.io/v1, kind: Profile, metadata: {name: a100},
     spec: {namespaceSelector: {matchLabels: {example.com/team: a}},
            resources: {requests: {cpu: "8", gpu: "1"}}}}
    """


def project_profile(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "runguard.io/v1",
        "kind": "ProjectProfile",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": spec,
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}},
    }


def cluster(*objects: dict[str, Any]) -> Context:
    base = [namespace("team-a", **{"example.com/team": "a"}), namespace("team-b")]
    base += [{"kind": "PriorityClass", "metadata": {"name": n}} for n in ("low", "high")]
    return Context(state=StaticClusterState.from_documents([*base, *objects]))


def run(ns: str, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/template": profile},
        },
        "spec": {"containers": [{"name": "main", "image": "python:3.12"}]},
    }
