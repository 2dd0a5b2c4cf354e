"""A RunPolicy with its profiles written to a directory (``policy_dir``) and two teams'
namespaces (``NAMESPACES``, ``CONTEXT``), as ``runguard whatif`` and ``explain`` read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webhook.clusterstate import StaticClusterState
from webhook.engine.context import Context

from .inputs import write

RUN_POLICY = """\
    apiVersion: runguard.io/v1
    kind: RunPolicy
    metadata: {name: runs}
    spec:
      selector: {matchLabels: {app.kubernetes.io/managed-by: dhcore}}
      profiles: {label: dhcore/template, default: small, unknown: Deny}
      resources: {maximums: {cpu: "16", memory: 64Gi, gpu: "2"}, onExceed: Clamp}
      security: {runAsUser: 8877}
      platform: {projectLabel: dhcore/project}
    """

SMALL = """\
    apiVersion: runguard.io/v1
    kind: Profile
    metadata: {name: small}
    spec:
      resources:
        requests:
          cpu: {min: "1", default: "2", max: "4"}
          memory: {min: 1Gi, default: 4Gi, max: MAX}
    """

A100 = """\
    apiVersion: runguard.io/v1
    kind: Profile
    metadata: {name: a100}
    spec:
      SELECTOR
      resources: {requests: {cpu: "8", memory: 32Gi, gpu: "1"}}
    """


def policy_dir(
    path: Path, *, small_max: str = "16Gi", a100: bool = True, selector: str = ""
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    write(path, "runpolicy.yaml", RUN_POLICY)
    profiles = SMALL.replace("MAX", small_max)
    if a100:
        profiles += "---\n" + A100.replace("SELECTOR", selector or "description: A100")
    write(path, "profiles.yaml", profiles)
    return path


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}},
    }


NAMESPACES = [namespace("team-a", team="a"), namespace("team-b")]

CONTEXT = Context(state=StaticClusterState.from_documents(NAMESPACES))

TEAM_A_ONLY = "namespaceSelector: {matchLabels: {team: a}}"
