"""Ownership (docs/dev/guarantees.md, "Ownership"): the platform's volumes and secrets only for the
platform's runs.

Each test is one of the attacks a user with kubectl has, or the platform's legitimate path,
judged by the engine with a requester and a cluster state (objects' metadata by uid)."""

from __future__ import annotations

import copy
from typing import Any

from harness import REPO, TESTS
from harness.cluster_state import Meta, OwnerRef, State, owner

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import REQUESTED_BY
from webhook.policy.loader import load_policy

POLICY = load_policy(TESTS / "cases" / "_policies" / "owned")
CORE = Requester("system:serviceaccount:digitalhub:core")
ALICE = Requester("alice", ("developers",))
JOBS = Requester("system:serviceaccount:kube-system:job-controller")
RS = Requester("system:serviceaccount:kube-system:replicaset-controller")
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}


def run_pod(labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    """A run using the run's own claim and secret (platform names for run r1)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "labels": dict(labels or RUN), **meta},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "env": [
                        {
                            "name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "sec-api-r1", "key": "t"}},
                        }
                    ],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "v-r1-data"}}],
        },
    }


def kept(decision: Any) -> tuple[bool, bool]:
    """(claim kept, secret kept) in the mutated pod."""
    assert decision.error is None, decision.message()
    spec = decision.object["spec"]
    claims = [v for v in spec.get("volumes", []) if "persistentVolumeClaim" in v]
    env = spec["containers"][0].get("env", [])
    return bool(claims), any(e["name"] == "TOKEN" for e in env)


def test_a_run_the_platform_creates_keeps_its_claim_and_secret() -> None:
    decision = evaluate(run_pod(), POLICY, context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    assert kept(decision) == (True, True)
    assert decision.object["metadata"]["annotations"][REQUESTED_BY] == CORE.username


def test_a_platform_group_member_is_the_platform() -> None:
    admin = Requester("bob", ("platform-admins",))
    assert kept(evaluate(run_pod(), POLICY, context=Context(admin, State([])))) == (True, True)


def test_a_user_labelling_a_pod_with_a_run_id_gets_nothing_of_that_run() -> None:
    decision = evaluate(run_pod(), POLICY, context=Context(ALICE, State([])))
    assert decision.allowed  # stripped, as for any pre-existing reference
    assert kept(decision) == (False, False)
    assert any("only runs the platform creates" in w for w in decision.warnings) or any(
        "removed" in w for w in decision.warnings
    )
    denied = validate(run_pod(), POLICY, context=Context(ALICE, State([])))
    assert {"volumes.pre-existing", "secrets.forbidden"} <= {v.rule for v in denied.violations}
    assert "only runs the platform creates may use it" in denied.message()


def test_a_forged_stamp_is_overwritten_with_the_requester() -> None:
    pod = run_pod(annotations={REQUESTED_BY: CORE.username})
    decision = mutate(pod, POLICY, context=Context(ALICE, State([])))
    assert decision.object["metadata"]["annotations"][REQUESTED_BY] == "alice"
    assert kept(decision) == (False, False)


def job(stamp: str, uid: str = "uid-job") -> Meta:
    return Meta("Job", "ml", "train", uid, annotations={REQUESTED_BY: stamp})


def test_pods_of_a_platform_job_created_by_the_job_controller_are_the_platforms() -> None:
    pod = run_pod(ownerReferences=[owner("Job", "train", "uid-job")])
    state = State([job(CORE.username)])
    assert kept(evaluate(pod, POLICY, context=Context(JOBS, state))) == (True, True)


def test_pods_of_a_users_job_are_not_the_platforms() -> None:
    pod = run_pod(ownerReferences=[owner("Job", "train", "uid-job")])
    state = State([job("alice")])
    assert kept(evaluate(pod, POLICY, context=Context(JOBS, state))) == (False, False)


def test_ownerreferences_a_user_writes_prove_nothing() -> None:
    """alice points her Pod at the platform's Job: she is not the job-controller."""
    pod = run_pod(ownerReferences=[owner("Job", "train", "uid-job")])
    state = State([job(CORE.username)])
    assert kept(evaluate(pod, POLICY, context=Context(ALICE, state))) == (False, False)


def test_a_deployment_chain_reaches_the_platform_stamp() -> None:
    stamp = {REQUESTED_BY: CORE.username}
    deployment = Meta("Deployment", "ml", "serve", "uid-dep", annotations=stamp)
    replicaset = Meta(
        "ReplicaSet",
        "ml",
        "serve-1",
        "uid-rs",
        annotations={REQUESTED_BY: "system:serviceaccount:kube-system:deployment-controller"},
        owners=(OwnerRef("Deployment", "serve", "uid-dep", True),),
    )
    pod = run_pod(ownerReferences=[owner("ReplicaSet", "serve-1", "uid-rs")])
    state = State([deployment, replicaset])
    assert kept(evaluate(pod, POLICY, context=Context(RS, state))) == (True, True)


def test_an_owner_the_cache_has_not_synced_fails_closed_with_a_message() -> None:
    pod = run_pod(ownerReferences=[owner("Job", "train", "uid-job")])
    decision = validate(pod, POLICY, context=Context(JOBS, State([], synced=False)))
    assert not decision.allowed
    assert "ownership.unknown" in {v.rule for v in decision.violations}
    assert "not synced Job" in decision.message()


def test_reserved_names_only_for_the_platform() -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "v-r9-data", "namespace": "ml"},
        "spec": {"volumeName": "pv-of-my-choice"},
    }
    denied = validate(claim, POLICY, context=Context(ALICE, State([])))
    assert not denied.allowed
    assert [v.rule for v in denied.violations] == ["ownership.reserved-name"]
    assert validate(claim, POLICY, context=Context(CORE, State([]))).allowed
    other = copy.deepcopy(claim)
    other["metadata"]["name"] = "my-data"
    assert validate(other, POLICY, context=Context(ALICE, State([]))).allowed


def test_an_unlabelled_copy_of_a_run_is_denied() -> None:
    """kubectl debug --copy-to drops the run labels and keeps the volumes and secrets."""
    copy_ = run_pod(labels={"app": "debug"})
    decision = evaluate(copy_, POLICY, context=Context(ALICE, State([])))
    assert not decision.allowed
    assert {v.rule for v in decision.violations} == {"ownership.not-a-run"}
    assert evaluate(copy_, POLICY, context=Context(CORE, State([]))).allowed
    # at /validate without /mutate's stamp, the copy is also a bypass (docs/dev/guarantees.md,
    # "Trust over time")
    decision = validate(copy_, POLICY, context=Context(ALICE, State([])))
    assert {v.rule for v in decision.violations} == {"ownership.not-a-run", "ownership.stamp"}
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ml"}}
    plain["spec"] = {"containers": [{"name": "web", "image": "nginx"}]}
    assert validate(plain, POLICY, context=Context(ALICE, State([]))).applies is False


def test_a_project_shared_claim_for_the_projects_platform_runs_only() -> None:
    pod = run_pod()
    pod["spec"]["volumes"].append(
        {"name": "shared", "persistentVolumeClaim": {"claimName": "team-datasets"}}
    )
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "shared", "mountPath": "/s"})
    mine = Meta(
        "PersistentVolumeClaim", "ml", "team-datasets", "u1", labels={"dhcore/project": "p1"}
    )
    theirs = Meta(
        "PersistentVolumeClaim", "ml", "team-datasets", "u1", labels={"dhcore/project": "p2"}
    )

    def shared_kept(state: State, requester: Requester = CORE) -> bool:
        spec = evaluate(pod, POLICY, context=Context(requester, state)).object["spec"]
        return any(v["name"] == "shared" for v in spec.get("volumes", []))

    assert shared_kept(State([mine]))
    assert not shared_kept(State([theirs]))
    assert not shared_kept(State([mine]), ALICE)
    waiting = validate(pod, POLICY, context=Context(CORE, State([], synced=False)))
    assert "ownership.unknown" in {v.rule for v in waiting.violations}


def test_the_stamp_cannot_change_and_nothing_enters_scope_by_update() -> None:
    created = mutate(run_pod(), POLICY, context=Context(CORE, State([]))).object
    edited = copy.deepcopy(created)
    edited["metadata"]["annotations"][REQUESTED_BY] = "alice"
    update = Context(ALICE, State([]), operation="UPDATE")
    decision = validate(edited, POLICY, old=created, context=update)
    assert "ownership.stamp" in {v.rule for v in decision.violations}
    outside = run_pod(labels={"app": "x"}, annotations={REQUESTED_BY: CORE.username})
    outside["spec"] = {"containers": [{"name": "main", "image": "python:3.11"}]}
    entering = copy.deepcopy(outside)
    entering["metadata"]["labels"] = dict(RUN)
    decision = validate(entering, POLICY, old=outside, context=update)
    assert {v.rule for v in decision.violations} == {"scope.labels"}


def test_without_platform_identities_names_decide_as_before() -> None:
    plain = load_policy(TESTS / "cases" / "_policies" / "platform")
    decision = evaluate(run_pod(), plain, context=Context(ALICE, State([])))
    assert kept(decision) == (True, True)
    assert REQUESTED_BY not in (decision.object["metadata"].get("annotations") or {})


def test_a_controller_may_update_the_pod_it_created_outside_the_selector() -> None:
    """The job-controller removing its finalizer from a Pod of a platform Job (not a run by
    labels) that uses a platform secret: the reference was admitted, the update is not new."""
    state = State([job(CORE.username)])
    created = run_pod(labels={"app": "etl"}, ownerReferences=[owner("Job", "train", "uid-job")])
    created = mutate(created, POLICY, context=Context(JOBS, state)).object
    assert created["metadata"]["annotations"][REQUESTED_BY] == JOBS.username
    updated = copy.deepcopy(created)
    updated["metadata"]["finalizers"] = []
    assert validate(updated, POLICY, old=created, context=Context(JOBS, state, "UPDATE")).allowed
    # a new platform reference by update is still refused for a user's pod
    mine = run_pod(labels={"app": "etl"})
    mine["spec"]["volumes"] = []
    mine["spec"]["containers"][0]["volumeMounts"] = []
    mine["spec"]["containers"][0]["env"] = []
    more = copy.deepcopy(mine)
    more["spec"]["imagePullSecrets"] = [{"name": "sec-api-r1"}]
    decision = validate(more, POLICY, old=mine, context=Context(ALICE, state, "UPDATE"))
    assert {v.rule for v in decision.violations} >= {"ownership.not-a-run"}


def test_every_platform_name_is_reserved_installation_wide_ones_for_installers_too() -> None:
    """A user cannot squat the platform-wide secret before the chart creates it
    (docs/dev/guarantees.md, "Trust over time"); the admin's chart (``platform.installers``, default
    group system:masters) can."""
    from webhook.engine.rules.ownership import platform_named, reserved_name
    from webhook.engine.rules.reserved import check_reserved_name

    shipped = load_policy(REPO / "policies")
    assert reserved_name(shipped.first, "Secret", "digitalhub-common-creds") is not None
    assert platform_named(shipped.first, "Secret", "digitalhub-common-creds")
    assert reserved_name(shipped.first, "PersistentVolumeClaim", "v-r9-data") is not None
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "digitalhub-common-creds"}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "v-r9-x"}}
    admin = Requester("kubernetes-admin", ("system:masters", "system:authenticated"))
    assert [v.rule for v in check_reserved_name(secret, shipped, Context(ALICE))] == [
        "ownership.reserved-name"
    ]
    assert check_reserved_name(secret, shipped, Context(admin)) == []
    assert check_reserved_name(secret, shipped, Context(CORE)) == []
    # a per-run name is the platform's alone, installers included
    assert [v.rule for v in check_reserved_name(claim, shipped, Context(admin))] == [
        "ownership.reserved-name"
    ]
