"""The shipped ``manifests/`` base read as documents (``base_documents``, ``base_object``) and
the Pod runguard's own Deployment runs (``deployment_pod``)."""

from __future__ import annotations

from typing import Any

import yaml

from .inputs import REPO

BASE = REPO / "manifests"


def base_documents() -> dict[str, list[dict[str, Any]]]:
    docs = {}
    for path in sorted(BASE.rglob("*.yaml")) + sorted(BASE.rglob("*.yml")):
        if "certs" in path.relative_to(BASE).parts:
            continue
        docs[str(path.relative_to(BASE))] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def base_object(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for docs in base_documents().values()
        for d in docs
        if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def deployment_pod() -> dict[str, Any]:
    pod: dict[str, Any] = base_object("Deployment", "runguard")["spec"]["template"]
    return pod
