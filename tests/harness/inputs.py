"""What the tests send and write: AdmissionReviews, run Pods, small policies."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def admission_review(obj: Any, **fields: Any) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview request for ``obj`` (CREATE by default)."""
    meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
    kind = obj.get("kind", "Pod") if isinstance(obj, dict) else "Pod"
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "operation": "CREATE",
        "namespace": meta.get("namespace", "default"),
        "name": meta.get("name", ""),
        "object": obj,
        "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
        "dryRun": False,
    }
    request.update(fields)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def sample_policy(
    *, run_as_user: int = 8877, memory: str = "2Gi", enforcement: str = "Deny"
) -> dict[str, str]:
    """A small policy in two files: ``run_as_user`` lives in one, ``memory`` (the
    ``small`` profile's request) in the other, so a test can tell a policy loaded
    half old, half new from either whole version."""
    runpolicy = f"""\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {{name: http-test}}
spec:
  selector:
    matchLabels: {{app.kubernetes.io/managed-by: dhcore}}
  excludeNamespaces: [kube-system]
  enforcement: {enforcement}
  profiles: {{label: dhcore/template, default: small, unknown: Deny}}
  resources:
    defaults: {{requests: {{cpu: 100m, memory: 256Mi}}}}
    maximums: {{cpu: "16", memory: 64Gi, gpu: "2"}}
    onExceed: Clamp
  security:
    onRoot: Strip
    runAsUser: {run_as_user}
    runAsGroup: 999
    fsGroup: 999
  volumes:
    platformClaims: ["v-{{labels[dhcore/run]}}-*"]
    onPreExisting: Strip
  secrets:
    allowed: ["sec-*-{{labels[dhcore/run]}}"]
    onForbidden: Strip
"""
    profiles = f"""\
apiVersion: runguard.io/v1
kind: Profile
metadata: {{name: small}}
spec:
  resources:
    requests: {{cpu: "1", memory: {memory}}}
"""
    return {"runpolicy.yaml": runpolicy, "profiles.yaml": profiles}


def run_pod(name: str = "train", **spec: Any) -> dict[str, Any]:
    """A platform run Pod as a user would submit it: root, a secret of someone else's,
    a plain env value that must never reach a log."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/run": "r1",
                "dhcore/template": "small",
            },
        },
        "spec": {
            "securityContext": {"runAsUser": 0},
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "env": [
                        {"name": "TOKEN", "value": "s3cr3t-env-value"},
                        {
                            "name": "PASSWORD",
                            "valueFrom": {
                                "secretKeyRef": {"name": "someone-elses-secret", "key": "pw"}
                            },
                        },
                    ],
                }
            ],
        },
    }
    pod["spec"].update(spec)
    return pod


def policy_files(policy: Path | Mapping[str, str] | None) -> dict[str, str]:
    if isinstance(policy, Mapping):
        return dict(policy)
    source = REPO / "policies" if policy is None else policy
    return {
        p.name: p.read_text()
        for p in sorted(source.iterdir())
        if p.suffix in (".yaml", ".yml") and p.is_file()
    }


def write(directory: Path, name: str, text: str) -> None:
    """A policy file, dedented (tests write them as indented string literals)."""
    (directory / name).write_text(textwrap.dedent(text), encoding="utf-8")


def written_policy(directory: Path, files: Mapping[str, str]) -> Policy:
    """The policy of ``files`` (name: text, as for ``write``) written into ``directory``."""
    for name, text in files.items():
        write(directory, name, text)
    return load_policy(directory)
