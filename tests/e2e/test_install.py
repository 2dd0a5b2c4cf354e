"""The install path against a real apiserver: the webhook configurations ``runguard
manifests`` renders are the ones the apiserver stores and calls, and the kustomize
base in ``manifests/`` passes the apiserver's server-side dry run."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import Cluster
from .devcluster import runguard_command
from .runs import REPO, Webhook, is_subset, picked

pytestmark = pytest.mark.e2e

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def ca_bundles(configuration: dict[str, Any]) -> list[bytes]:
    """Each webhook's caBundle, decoded, and removed from the configuration."""
    out = []
    for hook in configuration["webhooks"]:
        out.append(base64.b64decode(hook["clientConfig"].pop("caBundle")))
    return out


def test_registered_configurations_are_the_rendered_ones(
    cluster: Cluster, runguard: Webhook
) -> None:
    rendered = {item["kind"]: item for item in json.loads(runguard.manifests("json"))["items"]}
    assert set(rendered) == set(WEBHOOK_KINDS)
    ca = runguard.ca_file.read_bytes()
    for kind, want in rendered.items():
        stored = json.loads(cluster.kubectl("get", kind, "runguard", "-o", "json").stdout)
        assert ca_bundles(stored) == ca_bundles(want) == [ca] * len(want["webhooks"])
        assert picked(stored["webhooks"], want["webhooks"]) == want["webhooks"]
        assert is_subset(want["metadata"]["labels"], stored["metadata"]["labels"])
    names = [h["name"] for h in rendered["ValidatingWebhookConfiguration"]["webhooks"]]
    assert names == ["validate.runguard.io", "validate-controllers.runguard.io"]


def test_kustomize_base_passes_server_dry_run(
    cluster: Cluster, runguard: Webhook, tmp_path: Path
) -> None:
    base = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", base, ignore=shutil.ignore_patterns("certs"))
    subprocess.run(
        [runguard_command(), "certs", "--service", "runguard", "--namespace", "runguard",
         "--out", str(base / "certs")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    # Objects in a namespace a dry run does not create are refused: create it first.
    cluster.kubectl("create", "namespace", "runguard", check=False)
    before = {
        kind: json.loads(cluster.kubectl("get", kind, "runguard", "-o", "json").stdout)
        for kind in WEBHOOK_KINDS
    }

    done = cluster.kubectl("apply", "-k", str(base), "--dry-run=server", "-o", "json")
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    built = cluster.kubectl("kustomize", str(base), check=True).stdout
    expected = {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(built)}
    assert {(item["kind"], item["metadata"]["name"]) for item in items} == expected
    assert {
        ("Deployment", "runguard"),
        ("Secret", "runguard-tls"),
        ("ConfigMap", "runguard-policies"),
        ("MutatingWebhookConfiguration", "runguard"),
        ("ValidatingWebhookConfiguration", "runguard"),
    } <= expected
    ca = (base / "certs" / "ca.crt").read_bytes()
    for item in items:
        if item["kind"] in WEBHOOK_KINDS:
            assert ca_bundles(item) == [ca] * len(item["webhooks"])
            assert {h["clientConfig"]["service"]["name"] for h in item["webhooks"]} == {"runguard"}

    # Nothing was created or changed.
    assert cluster.kubectl("get", "deployment", "runguard", "-n", "runguard").returncode != 0
    for kind, was in before.items():
        now = json.loads(cluster.kubectl("get", kind, "runguard", "-o", "json").stdout)
        assert now == was
