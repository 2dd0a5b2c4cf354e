"""Trust that survives time and every door (docs/dev/guarantees.md, "Trust over time"), against the
shipped policies.

Each test is an attack chain a user with kubectl create/update rights in a run namespace
has (each succeeded on 474493f), or a controller's legitimate path that must keep working,
judged by the engine as the webhooks judge it: the request's user, the cluster state
(objects' metadata by uid), ``old`` and the subresource for UPDATE. The same attacks go
through the real apiserver in ``tests/e2e/test_trust.py``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import REPO
from harness.cluster_state import Meta, OwnerRef, State, owner
from harness.shipped import (
    ALICE,
    ARGO,
    BUILD,
    CORE,
    CORE_RECORDS,
    DEPLOYMENTS,
    JOBS,
    KCM,
    RS,
    RUN,
    SHIPPED,
    created,
    pod,
    rules,
    update,
    workflow,
)

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import Operator, Policy, build_run_policy

# --- the governing RunPolicy is fixed at CREATE ------------------------------------------


def test_the_governing_policy_is_recorded_and_a_forged_one_overwritten() -> None:
    run = created(pod(), CORE)
    assert run["metadata"]["labels"][POLICY_LABEL] == "digitalhub"
    forged = pod()
    forged["metadata"]["labels"][POLICY_LABEL] = "builds"
    assert created(forged, ALICE)["metadata"]["labels"][POLICY_LABEL] == "digitalhub"
    outside = pod(labels={"app": "web", POLICY_LABEL: "builds"})
    outside["spec"] = {"containers": [{"name": "web", "image": "nginx"}]}
    assert POLICY_LABEL not in created(outside, ALICE)["metadata"]["labels"]


def test_leaving_the_scope_by_relabeling_is_denied() -> None:
    """Removing managed-by (or the run id) took a run out of every webhook's sight."""
    run = created(pod(), CORE)
    for key in ("app.kubernetes.io/managed-by", "dhcore/run"):
        left = copy.deepcopy(run)
        del left["metadata"]["labels"][key]
        _, validation = update(left, run, ALICE)
        assert not validation.allowed and "scope.labels" in rules(validation), key


def test_removing_the_policy_label_is_put_back() -> None:
    run = created(pod(), CORE)
    edited = copy.deepcopy(run)
    del edited["metadata"]["labels"][POLICY_LABEL]
    mutation, validation = update(edited, run, ALICE)
    assert mutation.object["metadata"]["labels"][POLICY_LABEL] == "digitalhub"
    assert validation.allowed, validation.message()
    # a Pod that skipped /mutate on that UPDATE is denied
    bypassed = validate(edited, SHIPPED, namespace="ml", old=run,
                        context=Context(ALICE, State([]), "UPDATE"))  # fmt: skip
    assert "scope.labels" in rules(bypassed)


def test_a_status_update_neither_relabels_nor_forges_records() -> None:
    """pods/status stores labels and annotations (only the spec is put back): judged as
    any UPDATE, the run stays in its RunPolicy and keeps runguard's records; a status
    update that leaves the metadata alone (the kubelet's) goes through untouched."""
    run = created(pod(), CORE)
    left = copy.deepcopy(run)
    del left["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    _, validation = update(left, run, ALICE, subresource="status")
    assert not validation.allowed and "scope.labels" in rules(validation)
    forged = copy.deepcopy(run)
    forged["metadata"]["annotations"][REQUESTED_BY] = "alice"
    forged["metadata"]["labels"][POLICY_LABEL] = "builds"
    mutation, validation = update(forged, run, ALICE, subresource="status")
    assert mutation.object["metadata"] == run["metadata"]
    assert validation.allowed, validation.message()
    reported = copy.deepcopy(run)
    reported["status"] = {"phase": "Failed"}
    kubelet = Requester("system:node:n1", ("system:nodes",))
    mutation, validation = update(reported, run, kubelet, subresource="status")
    assert mutation.patch == [] and validation.allowed, validation.message()


def test_moving_a_run_to_the_lax_build_policy_by_a_label_is_denied() -> None:
    run = created(pod(), CORE)
    moved = copy.deepcopy(run)
    moved["metadata"]["labels"]["dhcore/framework"] = "k8sbuild"
    _, validation = update(moved, run, ALICE)
    assert not validation.allowed and "scope.labels" in rules(validation)


def test_a_users_build_labelled_pod_is_judged_by_the_run_policy() -> None:
    """builds (root allowed, no maximums) names the Core as requester: alice's Pod with the
    build labels gets uid 8877 and the maximums, as any run."""
    greedy = pod(labels=BUILD)
    greedy["spec"]["securityContext"] = {"runAsUser": 0}
    greedy["spec"]["priorityClassName"] = "system-cluster-critical"
    greedy["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "500", "nvidia.com/gpu": "64"}
    }
    decision = evaluate(greedy, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert decision.object["metadata"]["labels"][POLICY_LABEL] == "digitalhub"
    assert decision.object["spec"]["securityContext"]["runAsUser"] != 0
    limits = decision.object["spec"]["containers"][0]["resources"]["limits"]
    assert limits["cpu"] != "500" and limits["nvidia.com/gpu"] != "64"
    assert not decision.allowed and rules(decision) == {"scheduling.priority-class"}
    # the Core's own build is the build policy's
    build = pod(labels=BUILD)
    assert created(build, CORE)["metadata"]["labels"][POLICY_LABEL] == "builds"


def test_a_build_jobs_pods_follow_the_job_to_the_build_policy() -> None:
    """The Core creates the build Job (builds); the job-controller's Pod is a build too,
    through the Job's recorded policy; a user's Job with build labels is not."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "build", "namespace": "ml", "uid": "uid-build"},
           "spec": {"template": {"metadata": {"labels": BUILD},
                                 "spec": pod()["spec"]}}}  # fmt: skip
    stored = created(job, CORE)
    assert stored["metadata"]["labels"][POLICY_LABEL] == "builds"
    state = State([Meta("Job", "ml", "build", "uid-build", stored["metadata"]["labels"],
                        stored["metadata"]["annotations"])])  # fmt: skip
    child = pod(labels=BUILD, ownerReferences=[owner("Job", "build", "uid-build")])
    assert created(child, JOBS, state)["metadata"]["labels"][POLICY_LABEL] == "builds"
    users = created(job, ALICE)
    assert users["metadata"]["labels"][POLICY_LABEL] == "digitalhub"
    state = State([Meta("Job", "ml", "build", "uid-build", users["metadata"]["labels"],
                        users["metadata"]["annotations"])])  # fmt: skip
    assert created(child, JOBS, state)["metadata"]["labels"][POLICY_LABEL] == "digitalhub"


def test_a_cronjobs_template_run_id_cannot_be_changed() -> None:
    cron = {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "ml"},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": {
                "metadata": {"labels": RUN}, "spec": pod()["spec"]}}}}}  # fmt: skip
    stored = created(cron, CORE)
    other = copy.deepcopy(stored)
    other["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]["dhcore/run"] = "r2"
    _, validation = update(other, stored, ALICE)
    assert not validation.allowed and "scope.labels" in rules(validation)


# --- ownership is decided at CREATE ------------------------------------------------------


def test_rewriting_a_pods_owners_is_denied_and_grants_nothing() -> None:
    state = State([Meta("Job", "ml", "train", "uid-platform-job",
                        annotations=CORE_RECORDS)])  # fmt: skip
    mine = created(pod(), ALICE, state)
    assert mine["metadata"]["annotations"][REQUESTED_BY] == "alice"
    assert PLATFORM_RECORD not in mine["metadata"]["annotations"]
    adopted = copy.deepcopy(mine)
    adopted["metadata"]["ownerReferences"] = [owner("Job", "train", "uid-platform-job")]
    _, validation = update(adopted, mine, ALICE, state)
    assert "ownership.owner-changed" in rules(validation)
    # even were it let through, the record read on UPDATE is the old object's
    _, by_job_controller = update(adopted, mine, JOBS, state)
    assert "ownership.owner-changed" not in rules(by_job_controller)
    assert PLATFORM_RECORD not in by_job_controller.object["metadata"]["annotations"]


def test_the_garbage_collector_may_orphan() -> None:
    state = State([Meta("Job", "ml", "train", "uid-job",
                        annotations=CORE_RECORDS)])  # fmt: skip
    child = created(pod(ownerReferences=[owner("Job", "train", "uid-job")]), JOBS, state)
    assert child["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    orphan = copy.deepcopy(child)
    orphan["metadata"]["ownerReferences"] = []
    gc = Requester(f"{KCM}generic-garbage-collector")
    _, validation = update(orphan, child, gc, state)
    assert validation.allowed, validation.message()


def test_a_stamp_that_skipped_mutate_is_denied() -> None:
    """A Pod created past /mutate with a forged stamp: /validate's backstop."""
    forged = pod(annotations={REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"})
    forged["metadata"]["labels"][POLICY_LABEL] = "digitalhub"
    decision = validate(forged, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert not decision.allowed and "ownership.stamp" in rules(decision)


def test_a_user_named_like_a_group_identity_is_not_the_group() -> None:
    run = build_run_policy(
        {"apiVersion": "runguard.io/v1", "kind": "RunPolicy", "metadata": {"name": "p"},
         "spec": {"selector": {"matchLabels": {"app.kubernetes.io/managed-by": "dhcore"}},
                  "secrets": {"allowed": ["sec-*-{labels[dhcore/run]}"]},
                  "volumes": {"platformClaims": ["v-{labels[dhcore/run]}-*"]},
                  "platform": {"identities": ["group:platform-admins"]}}}, [])  # fmt: skip
    policy = Policy.of(run)
    impostor = Requester("group:platform-admins", ("system:authenticated",))
    decision = evaluate(pod(), policy, namespace="ml", context=Context(impostor, State([])))
    assert PLATFORM_RECORD not in decision.object["metadata"]["annotations"]
    assert not decision.object["spec"].get("volumes")
    stored = decision.object
    state = State([Meta("Job", "ml", "j", "uid-j", {}, stored["metadata"]["annotations"])])
    child = pod(ownerReferences=[owner("Job", "j", "uid-j")])
    later = evaluate(child, policy, namespace="ml", context=Context(JOBS, state))
    assert not later.object["spec"].get("volumes")
    member = Requester("bob", ("platform-admins",))
    member_run = evaluate(pod(), policy, namespace="ml", context=Context(member, State([])))
    assert member_run.object["metadata"]["annotations"][PLATFORM_RECORD] == "true"


def test_the_kcm_controller_identities_are_the_real_ones() -> None:
    assert f"{KCM}daemon-set-controller" in SHIPPED.first.platform.controllers
    assert f"{KCM}daemonset-controller" not in SHIPPED.first.platform.controllers
    assert f"{KCM}replication-controller" in SHIPPED.first.platform.controllers


# --- controllers keep working --------------------------------------------------------------


def test_the_deployment_controller_copying_annotations_keeps_the_replicasets_records() -> None:
    """Scaling: the deployment-controller re-copies the Deployment's annotations (its
    stamp, the Core) onto the ReplicaSet; /mutate puts the ReplicaSet's back."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "serve", "namespace": "ml", "uid": "uid-dep"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": RUN},
                           "template": {"metadata": {"labels": RUN},
                                        "spec": pod()["spec"]}}}  # fmt: skip
    dep = created(deployment, CORE)
    state = State([Meta("Deployment", "ml", "serve", "uid-dep", dep["metadata"]["labels"],
                        dep["metadata"]["annotations"])])  # fmt: skip
    replicaset = copy.deepcopy(deployment)
    replicaset.update(kind="ReplicaSet")
    replicaset["metadata"] = {"name": "serve-1", "namespace": "ml", "uid": "uid-rs",
                              "annotations": dict(dep["metadata"]["annotations"]),
                              "ownerReferences": [{**owner("Deployment", "serve", "uid-dep"),
                                                   "apiVersion": "apps/v1"}]}  # fmt: skip
    rs = created(replicaset, DEPLOYMENTS, state)
    assert rs["metadata"]["annotations"][REQUESTED_BY] == DEPLOYMENTS.username
    assert rs["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    scaled = copy.deepcopy(rs)
    scaled["spec"]["replicas"] = 3
    scaled["metadata"]["annotations"][REQUESTED_BY] = CORE.username  # copied from the Deployment
    mutation, validation = update(scaled, rs, DEPLOYMENTS, state)
    assert mutation.object["metadata"]["annotations"][REQUESTED_BY] == DEPLOYMENTS.username
    assert validation.allowed, validation.message()
    # and the ReplicaSet's Pods are the platform's
    meta = rs["metadata"]
    chain = (OwnerRef("Deployment", "serve", "uid-dep", True),)
    state = State([*state.objects, Meta("ReplicaSet", "ml", "serve-1", "uid-rs",
                                        meta["labels"], meta["annotations"], chain)])  # fmt: skip
    child = pod(ownerReferences=[{**owner("ReplicaSet", "serve-1", "uid-rs"),
                                  "apiVersion": "apps/v1"}])  # fmt: skip
    stored = created(child, RS, state)
    assert stored["spec"]["volumes"] and stored["metadata"]["annotations"][PLATFORM_RECORD]


# --- every door ----------------------------------------------------------------------------


def test_a_platform_configmap_read_into_a_users_run_is_denied() -> None:
    run = pod()
    run["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "init-config-map-r1"}}]
    decision = evaluate(run, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert not decision.allowed and "ownership.not-a-run" in rules(decision)
    assert evaluate(run, SHIPPED, namespace="ml", context=Context(CORE, State([]))).allowed


def test_a_platform_claim_cloned_by_an_ephemeral_volume_is_denied() -> None:
    clone = pod(labels={"app": "copy"})
    clone["spec"]["volumes"] = [{"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
        "dataSource": {"kind": "PersistentVolumeClaim", "name": "v-r1-data"}}}}}]  # fmt: skip
    clone["spec"]["containers"][0]["envFrom"] = []
    decision = evaluate(clone, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert not decision.allowed and rules(decision) == {"ownership.not-a-run"}


def test_a_platform_secret_through_a_csi_or_flex_volume_is_denied() -> None:
    for volume in ({"csi": {"driver": "x", "nodePublishSecretRef": {"name": "sec-api-r1"}}},
                   {"flexVolume": {"driver": "x",
                                   "secretRef": {"name": "digitalhub-common-creds"}}}):  # fmt: skip
        other = pod(labels={"app": "copy"})
        other["spec"]["volumes"] = [{"name": "data", **volume}]
        other["spec"]["containers"][0]["envFrom"] = []
        decision = evaluate(other, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
        assert not decision.allowed and rules(decision) == {"ownership.not-a-run"}, volume


def test_an_envfrom_prefix_that_selects_devices_is_removed() -> None:
    run = pod()
    run["spec"]["containers"][0]["envFrom"] = [
        {"prefix": "NVIDIA_VISIBLE_", "configMapRef": {"name": "mine"}},
        {"prefix": "APP_", "configMapRef": {"name": "mine"}},
    ]
    decision = evaluate(run, SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    assert decision.object["spec"]["containers"][0]["envFrom"] == [
        {"prefix": "APP_", "configMapRef": {"name": "mine"}}
    ]
    assert "resources.device-env" in {c.rule for c in decision.mutations}
    bypassed = validate(run, SHIPPED, namespace="ml", context=Context(None, State([])))
    assert "resources.device-env" in rules(bypassed)


def test_the_platforms_service_account_is_not_a_users() -> None:
    mine = pod(labels={"app": "web"})
    mine["metadata"]["namespace"] = "digitalhub"
    mine["spec"] = {"serviceAccountName": "core", "containers": [{"name": "c", "image": "x"}]}
    decision = evaluate(mine, SHIPPED, namespace="digitalhub", context=Context(ALICE, State([])))
    assert not decision.allowed and rules(decision) == {"ownership.service-account"}
    assert evaluate(mine, SHIPPED, namespace="digitalhub",
                    context=Context(CORE, State([]))).allowed  # fmt: skip
    elsewhere = copy.deepcopy(mine)  # another namespace's "core" is another account
    assert evaluate(elsewhere, SHIPPED, namespace="ml", context=Context(ALICE, State([]))).allowed


def test_every_run_policys_names_are_judged() -> None:
    """registry-credentials is only the build policy's: an unlabelled Pod using it is
    denied as it would be for the first policy's names."""
    other = pod(labels={"app": "copy"})
    other["spec"]["volumes"] = []
    other["spec"]["containers"][0]["volumeMounts"] = []
    other["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "registry-credentials"}}]
    decision = evaluate(other, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert not decision.allowed and rules(decision) == {"ownership.not-a-run"}


def test_a_debug_container_in_a_platform_pod_is_the_platforms_to_add() -> None:
    run = created(pod(), CORE)
    debugged = copy.deepcopy(run)
    debugged["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    _, validation = update(debugged, run, ALICE, subresource="ephemeralcontainers")
    assert "ownership.debug" in rules(validation)
    _, by_core = update(debugged, run, CORE, subresource="ephemeralcontainers")
    assert "ownership.debug" not in rules(by_core)


# --- offline sees what online sees ---------------------------------------------------------


def test_cluster_state_reads_any_kinds(tmp_path: Path) -> None:
    """`kubectl get ns,pvc,secret,workflows -A -o yaml`: Namespaces and custom resources
    are read (and ignored where no decision needs them)."""
    state = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "uid": "ns-1",
                                                              "labels": {"team": "a"}}},
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
         "metadata": {"name": "wf", "namespace": "ml", "uid": "wf-1"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ml"},
         "data": {"k": "c2VjcmV0"}},
    ]}  # fmt: skip
    (tmp_path / "state.yaml").write_text(json.dumps(state))
    (tmp_path / "pod.json").write_text(json.dumps(pod()))
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", str(REPO / "policies"), "-o", "json",
         "--cluster-state", str(tmp_path / "state.yaml"), "--as", CORE.username,
         str(tmp_path / "pod.json")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["allowed"] and result["object"]["metadata"]["labels"][POLICY_LABEL]


def test_two_policies_in_any_order_keep_their_scopes() -> None:
    """The policy recorded governs, whichever RunPolicy is tried first."""
    first, second = SHIPPED.run_policies
    swapped = Policy.of(second, first)
    run = evaluate(pod(), swapped, namespace="ml", context=Context(CORE, State([]))).object
    assert run["metadata"]["labels"][POLICY_LABEL] == "digitalhub"


# --- operators are controllers ---------------------------------------------------------------


def operator_policy() -> Any:
    """The shipped digitalhub policy with Argo Workflows' controller as an operator."""
    first, second = SHIPPED.run_policies
    run = second if second.name == "digitalhub" else first
    platform = run.platform.model_copy(
        update={"operators": (Operator(identity=ARGO.username, kinds=("argoproj.io/Workflow",)),)}
    )
    return Policy.of(run.model_copy(update={"platform": platform}))


def test_an_operators_pods_follow_its_custom_resource_by_uid() -> None:
    """The Core creates a Workflow (stamped, recorded as the platform's); the Argo
    controller's step Pod, owned by it by uid, gets the run's claim and secret. A
    Workflow a user created, or a Pod the operator creates for it, gets nothing."""
    policy = operator_policy()
    by_uid = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "pipeline",
              "uid": "wf-1", "controller": True}  # fmt: skip
    step = pod(labels={"workflows.argoproj.io/workflow": "pipeline"}, ownerReferences=[by_uid])
    for creator, platform in ((CORE, True), (ALICE, False)):
        made = evaluate(workflow("wf-1"), policy, namespace="ml", context=Context(creator))
        annotations = made.object["metadata"].get("annotations", {})
        # a user's own Workflow carries no record of runguard's: its updates (Argo's at
        # every step) are never routed to runguard
        assert annotations.get(REQUESTED_BY) == (creator.username if platform else None)
        assert (annotations.get(PLATFORM_RECORD) == "true") is platform
        state = State([Meta("Workflow", "ml", "pipeline", "wf-1", {}, annotations)])
        decision = evaluate(step, policy, namespace="ml", context=Context(ARGO, state))
        assert decision.allowed is platform, decision.message()
        assert (decision.object["metadata"]["annotations"].get(PLATFORM_RECORD) == "true") is (
            platform
        )
    # the Workflow's records cannot be rewritten later
    stored = evaluate(workflow("wf-1"), policy, namespace="ml", context=Context(ALICE)).object
    forged = copy.deepcopy(stored)
    forged["metadata"].setdefault("annotations", {})[PLATFORM_RECORD] = "true"
    context = Context(ALICE, State([]), "UPDATE")
    kept = mutate(forged, policy, namespace="ml", old=stored, context=context).object
    assert PLATFORM_RECORD not in kept["metadata"]["annotations"]
    denied = validate(forged, policy, namespace="ml", old=stored, context=context)
    assert rules(denied) == {"ownership.stamp"}
    # only the operator's identity follows its kinds: the job-controller does not
    decision = evaluate(step, policy, namespace="ml", context=Context(JOBS, State([])))
    assert not decision.allowed


def test_a_platform_run_keeps_the_registry_pull_secret_its_build_pushed_with() -> None:
    """The Core's runs pull the image its Kaniko build pushed, with the chart's registry
    secret; a user's run labelled alike does not get it."""
    run = pod()
    run["spec"]["imagePullSecrets"] = [{"name": "registry-credentials"}]
    mine = evaluate(run, SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert mine.allowed and mine.object["spec"]["imagePullSecrets"] == [
        {"name": "registry-credentials"}
    ]
    theirs = evaluate(run, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert not theirs.object["spec"].get("imagePullSecrets")


def test_an_owner_not_synced_yet_is_a_retryable_denial_not_a_silent_strip() -> None:
    """The job-controller's Pod of a platform Job the cache has not seen yet: /mutate
    leaves the platform's secret and claim for /validate to deny with ownership.unknown
    (the controller retries), instead of stripping them and admitting a broken run."""
    child = pod(ownerReferences=[owner("Job", "train", "uid-unseen")])
    unsynced = State([], synced=False)
    mutation = mutate(child, SHIPPED, namespace="ml", context=Context(JOBS, unsynced))
    assert mutation.object["spec"]["volumes"] == child["spec"]["volumes"]
    assert mutation.object["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "sec-api-r1"}}
    ]
    decision = evaluate(child, SHIPPED, namespace="ml", context=Context(JOBS, unsynced))
    assert not decision.allowed and "ownership.unknown" in rules(decision)
    # outside every selector (an operator's step Pod): the same rule, not not-a-run
    step = pod(labels={"app": "step"}, ownerReferences=[owner("Job", "train", "uid-unseen")])
    decision = evaluate(step, SHIPPED, namespace="ml", context=Context(JOBS, unsynced))
    assert rules(decision) == {"ownership.unknown"}


def test_what_a_platform_deployment_runs_is_the_platforms_to_change() -> None:
    """alice may scale the Core's Deployment, not give its Pods her image: they would run
    her code with the platform's secret, recorded as the platform's."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "serve", "namespace": "ml", "uid": "uid-dep"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": RUN},
                           "template": {"metadata": {"labels": RUN},
                                        "spec": pod()["spec"]}}}  # fmt: skip
    stored = created(deployment, CORE)
    scaled = copy.deepcopy(stored)
    scaled["spec"]["replicas"] = 5
    assert update(scaled, stored, ALICE)[1].allowed
    hers = copy.deepcopy(stored)
    hers["spec"]["template"]["spec"]["containers"][0]["image"] = "alice/miner"
    _, validation = update(hers, stored, ALICE)
    assert rules(validation) == {"ownership.changed"}
    assert update(hers, stored, CORE)[1].allowed  # the platform rolls out what it wants


def test_an_owner_synced_between_the_two_webhooks_is_a_retryable_denial() -> None:
    """The replicaset-controller's Pod reaches /mutate before runguard's cache has its
    ReplicaSet (no platform record written) and /validate after (the ReplicaSet is the
    platform's): refused as ownership.unknown, which the controller retries, never as a
    forged record (ownership.stamp); the retry, with the cache synced, is admitted."""
    synced = State([Meta("ReplicaSet", "ml", "serve-5f", "uid-rs",
                         annotations=CORE_RECORDS)])  # fmt: skip
    sent = pod(ownerReferences=[owner("ReplicaSet", "serve-5f", "uid-rs")])
    early = mutate(sent, SHIPPED, namespace="ml", context=Context(RS, State([])))
    assert PLATFORM_RECORD not in early.object["metadata"].get("annotations", {})
    late = validate(early.object, SHIPPED, namespace="ml", context=Context(RS, synced))
    assert not late.allowed and rules(late) == {"ownership.unknown"}, late.message()
    retried = evaluate(sent, SHIPPED, namespace="ml", context=Context(RS, synced))
    assert retried.allowed, retried.message()
    assert retried.object["metadata"]["annotations"][PLATFORM_RECORD] == "true"


def test_an_excluded_namespace_is_never_touched() -> None:
    """No webhook is called for a Pod in an excluded namespace, and the engine agrees
    offline: no records written, none required, even for one naming the platform's
    objects."""
    sent = pod({"app": "system"})
    sent["metadata"]["namespace"] = "kube-system"
    for who in (ALICE, CORE):
        context = Context(who, State([]))
        mutation = mutate(sent, SHIPPED, namespace="kube-system", context=context)
        assert mutation.patch in (None, []), mutation.patch
        validation = validate(sent, SHIPPED, namespace="kube-system", context=context)
        assert validation.allowed and not validation.violations, validation.message()


class LaggingState(State):  # type: ignore[misc,valid-type]
    """A live cache: synced, but a just-created object may not be delivered yet."""

    may_lag = True


def test_an_owner_the_watch_has_not_delivered_yet_is_a_retryable_denial() -> None:
    """The replicaset-controller creates a new ReplicaSet's Pods within milliseconds of
    the ReplicaSet: a live cache that has synced ReplicaSets may still lack this one.
    Its Pod is refused as ownership.unknown (the controller retries) and keeps, at
    /mutate, what /validate decides on: never admitted with the platform's secret
    silently stripped. A complete state (a --cluster-state file) has no such owner: the
    reference proves nothing and the secret goes."""
    sent = pod(ownerReferences=[owner("ReplicaSet", "serve-6c", "uid-new-rs")])
    live = evaluate(sent, SHIPPED, namespace="ml", context=Context(RS, LaggingState([])))
    assert not live.allowed and "ownership.unknown" in rules(live), live.message()
    offline = evaluate(sent, SHIPPED, namespace="ml", context=Context(RS, State([])))
    assert "ownership.unknown" not in rules(offline)
    env_from = offline.object["spec"]["containers"][0].get("envFrom", [])
    assert {"secretRef": {"name": "sec-api-r1"}} not in env_from
