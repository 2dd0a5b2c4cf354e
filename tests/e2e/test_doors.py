"""Device claims through the real apiserver: a run naming an existing ResourceClaim (the
platform run's GPU, shared with every Pod naming it) loses it, or is refused.

Dynamic resource allocation is served by default from Kubernetes 1.34 (GA); on a release
where it is off, the apiserver drops a Pod's ``resourceClaims`` before admission (no
claim reaches a container, so there is nothing to judge) and these tests skip, saying so.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from webhook.policy.loader import load_policy

from .cluster import Cluster
from .runs import Webhook, apply, get, kubectl_warnings, pod, rule_ids, run_pod

pytestmark = pytest.mark.e2e

SHARED = "train-gpu-x7k2p"  # the claim the controller made from the platform run's template


def claims_reach_admission(cluster: Cluster, namespace: str) -> bool:
    """Whether the apiserver keeps a Pod's ``resourceClaims`` (a Pod runguard is not
    called for, created with ``--dry-run=server``)."""
    probe = pod("probe", resourceClaims=[{"name": "c", "resourceClaimTemplateName": "t"}])
    done = apply(cluster, namespace, probe, "--dry-run=server", "-o", "json")
    assert done.returncode == 0, done.stderr
    return "resourceClaims" in json.loads(done.stdout)["spec"]


def sharing_run(name: str) -> dict[str, Any]:
    """A run asking for a GPU of its own (a template) and naming another Pod's claim."""
    container = {
        "name": "main",
        "image": "python:3.11",
        "resources": {"claims": [{"name": "shared"}, {"name": "own"}]},
    }
    return run_pod(
        name,
        containers=[container],
        resourceClaims=[
            {"name": "shared", "resourceClaimName": SHARED},
            {"name": "own", "resourceClaimTemplateName": "one-gpu"},
        ],
    )


@pytest.fixture
def dra(cluster: Cluster, namespace: str) -> str:
    if not claims_reach_admission(cluster, namespace):
        pytest.skip("this release drops Pods' resourceClaims (dynamic resource allocation off)")
    return namespace


def test_a_run_naming_an_existing_device_claim_keeps_only_its_own(
    cluster: Cluster, runguard: Webhook, dra: str
) -> None:
    done = apply(cluster, dra, sharing_run("mine"))
    assert done.returncode == 0, done.stderr
    removed = f"runguard: existing device claims removed (use resourceClaimTemplateName): {SHARED}"
    assert removed in kubectl_warnings(done.stderr)
    spec = get(cluster, dra, "pod", "mine")["spec"]
    assert spec["resourceClaims"] == [{"name": "own", "resourceClaimTemplateName": "one-gpu"}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "own"}]


def test_with_deny_a_run_naming_an_existing_device_claim_is_refused(
    cluster: Cluster, runguard: Webhook, dra: str
) -> None:
    documents = runguard.policy()
    documents[0]["spec"]["volumes"]["onPreExisting"] = "Deny"
    runguard.write_policy(documents)
    runguard.wait_for_policy(load_policy(runguard.policy_dir).digest)
    done = apply(cluster, dra, sharing_run("mine"))
    assert done.returncode != 0
    assert "resources.device-claim" in rule_ids(done.stderr), done.stderr
    assert SHARED in done.stderr
    own = sharing_run("own")
    own["spec"]["resourceClaims"] = [{"name": "own", "resourceClaimTemplateName": "one-gpu"}]
    own["spec"]["containers"][0]["resources"]["claims"] = [{"name": "own"}]
    assert apply(cluster, dra, own).returncode == 0
