"""``webhook/engine/rules/ownership.py`` on its own: the checks ``review`` and
``trust.OBJECT_CHECKS`` call (reserved names, claim clones and snapshots, token Secrets,
``check_not_a_run``, ``check_ownership``, ``check_stamp``), called directly on objects,
a ``Pod`` built for the test and a requester. The attacks end to end are
``tests/engine/test_ownership.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness.pods import NOT_PLATFORM, container, pod_of, policy_of

from webhook.engine.context import Context, Ownership, Requester
from webhook.engine.rules.not_a_run import (
    OWNERSHIP_NOT_A_RUN,
    OWNERSHIP_UNKNOWN,
    check_not_a_run,
    check_ownership,
)
from webhook.engine.rules.ownership import TOKEN_ACCOUNT_ANNOTATION, TOKEN_SECRET_TYPE
from webhook.engine.rules.reserved import (
    OWNERSHIP_RESERVED_NAME,
    OWNERSHIP_SERVICE_ACCOUNT,
    check_claim_clones,
    check_claim_snapshots,
    check_reserved_name,
    check_token_secret,
)
from webhook.engine.rules.stamp import OWNERSHIP_STAMP, check_stamp
from webhook.keys import REQUESTED_BY
from webhook.policy.model import Policy

CORE = Requester("system:serviceaccount:digitalhub:core")
ALICE = Requester("alice", ("developers",))
CHART = Requester("system:serviceaccount:digitalhub:installer")
RUN = {"dhcore/run": "r1"}


@pytest.fixture
def root(tmp_path: Path) -> Policy:
    return policy_of(
        tmp_path,
        {
            "volumes": {
                "platformClaims": ["v-{labels[dhcore/run]}-*"],
                "platformConfigMaps": ["init-{labels[dhcore/run]}", "platform-settings"],
            },
            "secrets": {"allowed": ["sec-*-{labels[dhcore/run]}"]},
            "platform": {"identities": [CORE.username], "installers": [CHART.username]},
        },
    )


def by(who: Requester, operation: str = "CREATE") -> Context:
    return Context(who, operation=operation)


def named(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ml"}}


def test_a_user_creating_an_object_with_a_platform_name_is_denied(root: Policy) -> None:
    found = check_reserved_name(named("PersistentVolumeClaim", "v-r9-data"), root, by(ALICE))
    assert [(v.rule, v.path) for v in found] == [(OWNERSHIP_RESERVED_NAME, "metadata.name")]


def test_the_platform_or_an_installer_or_another_name_passes(root: Policy) -> None:
    assert check_reserved_name(named("PersistentVolumeClaim", "v-r9-data"), root, by(CORE)) == []
    assert check_reserved_name(named("PersistentVolumeClaim", "mine"), root, by(ALICE)) == []
    # an installation-wide name (no labels in it) is also the installers'; a run's is not
    assert check_reserved_name(named("ConfigMap", "platform-settings"), root, by(CHART)) == []
    assert check_reserved_name(named("ConfigMap", "init-r1"), root, by(CHART)) != []
    update = by(ALICE, "UPDATE")
    assert check_reserved_name(named("PersistentVolumeClaim", "v-r9-data"), root, update) == []


def clone(source: str) -> dict[str, Any]:
    pvc = named("PersistentVolumeClaim", "copy")
    pvc["spec"] = {"dataSource": {"kind": "PersistentVolumeClaim", "name": source}}
    return pvc


def test_a_user_cloning_the_platforms_claim_is_denied(root: Policy) -> None:
    found = check_claim_clones(clone("v-r1-data"), root, by(ALICE))
    assert [(v.rule, v.path) for v in found] == [(OWNERSHIP_NOT_A_RUN, "spec")]
    stateful = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "s"},
        "spec": {"volumeClaimTemplates": [{"spec": clone("v-r1-data")["spec"]}]},
    }
    assert [v.path for v in check_claim_clones(stateful, root, by(ALICE))] == [
        "spec.volumeClaimTemplates[0].spec"
    ]


def test_cloning_her_own_claim_or_by_the_platform_passes(root: Policy) -> None:
    assert check_claim_clones(clone("mine"), root, by(ALICE)) == []
    assert check_claim_clones(clone("v-r1-data"), root, by(CORE)) == []


def snapshot(source: str) -> dict[str, Any]:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "snap"},
        "spec": {"source": {"persistentVolumeClaimName": source}},
    }


def test_a_user_snapshotting_the_platforms_claim_is_denied(root: Policy) -> None:
    found = check_claim_snapshots(snapshot("v-r1-data"), root, by(ALICE))
    assert [(v.rule, v.path) for v in found] == [
        (OWNERSHIP_NOT_A_RUN, "spec.source.persistentVolumeClaimName")
    ]
    assert check_claim_snapshots(snapshot("mine"), root, by(ALICE)) == []
    assert check_claim_snapshots(snapshot("v-r1-data"), root, by(CORE)) == []


def token(account: str) -> dict[str, Any]:
    secret = named("Secret", "tok")
    secret["type"] = TOKEN_SECRET_TYPE
    secret["metadata"]["annotations"] = {TOKEN_ACCOUNT_ANNOTATION: account}
    return secret


def test_a_user_making_a_token_for_the_platforms_account_is_denied(root: Policy) -> None:
    found = check_token_secret(token("core"), root, "digitalhub", None, by(ALICE))
    assert [(v.rule, v.path) for v in found] == [
        (OWNERSHIP_SERVICE_ACCOUNT, f"metadata.annotations[{TOKEN_ACCOUNT_ANNOTATION}]")
    ]


def test_a_token_for_another_account_or_by_the_platform_passes(root: Policy) -> None:
    assert check_token_secret(token("core"), root, "digitalhub", None, by(CORE)) == []
    assert check_token_secret(token("core"), root, "ml", None, by(ALICE)) == []  # not its ns
    assert check_token_secret(token("mine"), root, "digitalhub", None, by(ALICE)) == []
    kept = token("core")
    assert check_token_secret(kept, root, "digitalhub", kept, by(ALICE, "UPDATE")) == []


PLATFORM_SPEC = {
    "containers": [container(envFrom=[{"configMapRef": {"name": "init-r1"}}])],
    "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "v-r1-data"}}],
}


def test_a_pod_outside_every_selector_using_the_platforms_objects_is_not_a_run(
    root: Policy,
) -> None:
    found = check_not_a_run(PLATFORM_SPEC, "spec", NOT_PLATFORM, root.first)
    assert {v.rule for v in found} == {OWNERSHIP_NOT_A_RUN}
    assert {v.path for v in found} == {"spec.containers[0].envFrom[0]", "spec.volumes[0]"}
    assert check_not_a_run({"containers": [container()]}, "spec", NOT_PLATFORM, root.first) == []
    assert check_not_a_run(PLATFORM_SPEC, "spec", Ownership(True), root.first) == []


def test_while_the_creator_is_unknown_such_a_pod_is_retried(root: Policy) -> None:
    unknown = Ownership(False, unknown="the owner Job is not synced")
    assert [
        (v.rule, v.path) for v in check_not_a_run(PLATFORM_SPEC, "spec", unknown, root.first)
    ] == [(OWNERSHIP_UNKNOWN, "metadata.ownerReferences")]


def test_a_run_reading_the_platforms_config_map_into_its_env_must_be_the_platforms(
    root: Policy,
) -> None:
    users = pod_of(root, PLATFORM_SPEC, labels=RUN, ownership=NOT_PLATFORM)
    assert [(v.rule, v.path) for v in check_ownership(users)] == [
        (OWNERSHIP_NOT_A_RUN, "spec.containers[0].envFrom[0]")
    ]  # the claim is volumes.pre-existing's
    assert check_ownership(pod_of(root, PLATFORM_SPEC, labels=RUN)) == []
    unknown = Ownership(False, unknown="the owner Job is not synced")
    waiting = pod_of(root, PLATFORM_SPEC, labels=RUN, ownership=unknown)
    assert [(v.rule, v.path) for v in check_ownership(waiting)] == [
        (OWNERSHIP_UNKNOWN, "metadata.ownerReferences")
    ]


def test_the_stamp_cannot_change_on_update(root: Policy) -> None:
    old = {"annotations": {REQUESTED_BY: CORE.username}}
    new = {"annotations": {REQUESTED_BY: "alice"}}
    found = check_stamp(new, old, True, root.first, by(ALICE, "UPDATE"))
    assert [(v.rule, v.path) for v in found] == [
        (OWNERSHIP_STAMP, f"metadata.annotations[{REQUESTED_BY}]")
    ]
    assert check_stamp(old, old, True, root.first, by(ALICE, "UPDATE")) == []
    assert check_stamp(new, old, True, root.first, by(ALICE)) == []  # CREATE: check_records'


def test_an_object_cannot_enter_the_scope_by_an_update_but_the_platforms(root: Policy) -> None:
    meta: dict[str, Any] = {"annotations": {}}
    found = check_stamp(meta, meta, False, root.first, by(ALICE, "UPDATE"))
    assert [(v.rule, v.path) for v in found] == [(OWNERSHIP_STAMP, "metadata")]
    assert check_stamp(meta, meta, False, root.first, by(CORE, "UPDATE")) == []
