"""``webhook/engine/rules/podclaims.py`` on its own: a claim a controller made for one Pod
(its ephemeral volume's PVC, a ResourceClaim from its template) is that Pod's; the checks
called directly on a ``Review`` or an object with a fixed cluster state. The attacks end
to end are ``tests/engine/test_pod_claims.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness.pods import NOT_PLATFORM, container, policy_of

from webhook.clusterstate.static import StaticClusterState
from webhook.engine.context import Context, Ownership, Requester
from webhook.engine.rules.not_a_run import OWNERSHIP_NOT_A_RUN, OWNERSHIP_UNKNOWN
from webhook.engine.rules.podclaims import (
    check_pod_claim_clones,
    check_pod_claim_snapshots,
    check_pod_claims,
    pod_owner,
)
from webhook.engine.subject import review
from webhook.policy.model import Policy

CORE = Requester("system:serviceaccount:digitalhub:core")
ALICE = Requester("alice", ("developers",))
SCRATCH = "train-scratch"  # the ephemeral volume's PVC of Pod train


@pytest.fixture
def root(tmp_path: Path) -> Policy:
    return policy_of(tmp_path, {"platform": {"identities": [CORE.username]}})


def state() -> StaticClusterState:
    def pvc(name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": name, "ownerReferences": owners},
        }

    train = {"apiVersion": "v1", "kind": "Pod", "name": "train", "uid": "p1", "controller": True}
    return StaticClusterState.from_documents([pvc(SCRATCH, [train]), pvc("shared", [])])


def by(who: Requester, operation: str = "CREATE") -> Context:
    return Context(who, state(), operation)


def mounting(claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine", "namespace": "ml"},
        "spec": {
            "containers": [container()],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def test_the_owner_of_a_pods_claim_is_that_pod() -> None:
    assert pod_owner(by(ALICE), "PersistentVolumeClaim", "ml", SCRATCH) == "train"
    assert pod_owner(by(ALICE), "PersistentVolumeClaim", "ml", "shared") is None
    assert pod_owner(by(ALICE), "PersistentVolumeClaim", "ml", "absent") is None
    assert pod_owner(Context(ALICE), "PersistentVolumeClaim", "ml", SCRATCH) is None  # no view


def test_another_pod_naming_a_pods_claim_is_denied(root: Policy) -> None:
    r = review(mounting(SCRATCH), root, "ml", None, by(ALICE))
    found = check_pod_claims(r, root.first, NOT_PLATFORM)
    assert [(v.rule, v.path) for v in found] == [(OWNERSHIP_NOT_A_RUN, "spec.volumes[0]")]


def test_a_plain_claim_or_the_platforms_pod_passes(root: Policy) -> None:
    plain = review(mounting("shared"), root, "ml", None, by(ALICE))
    assert check_pod_claims(plain, root.first, NOT_PLATFORM) == []
    platforms = review(mounting(SCRATCH), root, "ml", None, by(CORE))
    assert check_pod_claims(platforms, root.first, Ownership(True)) == []


def test_a_claim_the_old_spec_named_already_is_not_new(root: Policy) -> None:
    r = review(mounting(SCRATCH), root, "ml", mounting(SCRATCH), by(ALICE, "UPDATE"))
    assert check_pod_claims(r, root.first, NOT_PLATFORM) == []


def test_while_the_creator_is_unknown_a_pods_claim_is_retried(root: Policy) -> None:
    r = review(mounting(SCRATCH), root, "ml", None, by(ALICE))
    unknown = Ownership(False, unknown="the owner Job is not synced")
    assert [(v.rule, v.path) for v in check_pod_claims(r, root.first, unknown)] == [
        (OWNERSHIP_UNKNOWN, "spec.volumes[0]")
    ]


def clone(source: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "copy"},
        "spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": source}},
    }


def test_a_user_cloning_a_pods_claim_is_denied(root: Policy) -> None:
    found = check_pod_claim_clones(clone(SCRATCH), root, by(ALICE), "ml")
    assert [(v.rule, v.path) for v in found] == [(OWNERSHIP_NOT_A_RUN, "spec.dataSource")]
    assert check_pod_claim_clones(clone("shared"), root, by(ALICE), "ml") == []
    assert check_pod_claim_clones(clone(SCRATCH), root, by(CORE), "ml") == []


def snapshot(source: str) -> dict[str, Any]:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "snap"},
        "spec": {"source": {"persistentVolumeClaimName": source}},
    }


def test_a_user_snapshotting_a_pods_claim_is_denied(root: Policy) -> None:
    found = check_pod_claim_snapshots(snapshot(SCRATCH), root, by(ALICE), "ml")
    assert [(v.rule, v.path) for v in found] == [
        (OWNERSHIP_NOT_A_RUN, "spec.source.persistentVolumeClaimName")
    ]
    assert check_pod_claim_snapshots(snapshot("shared"), root, by(ALICE), "ml") == []
    assert check_pod_claim_snapshots(snapshot(SCRATCH), root, by(CORE), "ml") == []
