"""What MLRun's operators' Pods get with the example MLRun policy, and what nobody else gets.

- ``volumes.allowedHostPaths``: the V3IO daemon's two node directories of the run's own
  namespace (``mount_v3iod``), for runs the platform created; nothing beside, below or
  above them, nothing in another namespace, nothing for a user's Pod.
- ``platform.operators[].configMaps`` and ``allowedCapabilities``: the mpi-operator's
  ``<job>-config`` ConfigMap and MLRun's ``IPC_LOCK``, for the Pods the operator creates
  for an MPIJob the platform created (directly, or through a Job it created, as
  mpi-operator v2beta1 does for the launcher); not for a user's MPIJob, not for a Pod the
  platform's own identity submits, not for a debug container.

The fixtures in tests/platforms/mlrun/ cover the same from the platforms' side (a Pod
exactly as the operator builds it); these tests pin the edges one at a time.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO
from pydantic import ValidationError

from webhook.clusterstate.static import StaticClusterState
from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, RunPolicySpec

EXAMPLE = load_policy(REPO / "policies" / "examples" / "mlrun")
NS = "default-tenant"
MLRUN_API = Requester("system:serviceaccount:mlrun:mlrun-api")
MPI = "system:serviceaccount:mlrun:mpi-operator"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
ALICE = Requester("alice", ("system:authenticated",))
LABELS = {"mlrun/class": "mpijob", "mlrun/project": "fraud", "mlrun/uid": "u1",
          "mlrun/job": "train-1", "mpi-job-name": "train-1", "mpi-job-role": "worker"}  # fmt: skip
AUTH = "mlrun-auth-secrets.c29a30e28e4a11b58caac2394aaac55767ddf697862cd15298f2354a"


def recorded(api_version: str, kind: str, name: str, uid: str, creator: str) -> dict[str, Any]:
    """A custom resource as the cluster state holds it: recorded by runguard at its CREATE."""
    annotations = {REQUESTED_BY: creator}
    if creator == MLRUN_API.username:
        annotations[PLATFORM_RECORD] = "true"
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": NS, "uid": uid,
                         "annotations": annotations}}  # fmt: skip


def mpijob(uid: str, creator: str) -> dict[str, Any]:
    return recorded("kubeflow.org/v1", "MPIJob", "train-1", uid, creator)


def worker(owner_uid: str = "mpi-1", owner_kind: str = "MPIJob") -> dict[str, Any]:
    """A worker Pod as mpi-operator v0.3.0 builds it from MLRun's template (newWorker)."""
    container = {
        "name": "base",
        "image": "mlrun/mlrun-gpu:1.7.0",
        "command": ["sleep"],
        "args": ["365d"],
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        "env": [{"name": "V3IO_ACCESS_KEY",
                 "valueFrom": {"secretKeyRef": {"name": AUTH, "key": "accessKey"}}}],
        "volumeMounts": [{"name": "mpi-job-config", "mountPath": "/etc/mpi"}],
    }  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-1-worker-0",
            "namespace": NS,
            "labels": dict(LABELS),
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": owner_kind,
                    "name": "train-1",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },  # fmt: skip
        "spec": {
            "containers": [container],
            "volumes": [
                {
                    "name": "mpi-job-config",
                    "configMap": {
                        "name": "train-1-config",
                        "items": [{"key": "kubexec.sh", "path": "kubexec.sh", "mode": 365}],
                    },
                }
            ],
        },  # fmt: skip
    }


def judged(pod: dict[str, Any], requester: Requester, *objects: dict[str, Any]) -> Any:
    state = StaticClusterState.from_documents(list(objects))
    return evaluate(pod, EXAMPLE, namespace=NS, context=Context(requester, state))


def rules(decision: Any) -> set[str]:
    return {v.rule for v in decision.violations}


def added_capabilities(decision: Any) -> list[str]:
    container = decision.object["spec"]["containers"][0]
    return list(container["securityContext"]["capabilities"].get("add") or [])


def env_names(decision: Any) -> list[str]:
    return [e["name"] for e in decision.object["spec"]["containers"][0].get("env") or ()]


# --- the mpi-operator's Pods --------------------------------------------------------------


def test_the_operators_pod_for_the_platforms_mpijob_keeps_what_mlrun_gave_it() -> None:
    decision = judged(worker(), Requester(MPI), mpijob("mpi-1", MLRUN_API.username))
    assert decision.applies and decision.allowed, decision.message()
    assert not rules(decision), decision.message()
    assert added_capabilities(decision) == ["IPC_LOCK"]
    assert env_names(decision) == ["V3IO_ACCESS_KEY"]
    assert decision.object["spec"]["volumes"][0]["configMap"]["name"] == "train-1-config"


def test_a_users_mpijob_gets_nothing_of_the_platforms() -> None:
    decision = judged(worker(), Requester(MPI), mpijob("mpi-1", "alice"))
    assert added_capabilities(decision) == []  # stripped (onRoot: Strip)
    assert env_names(decision) == []  # the auth secret stripped (onForbidden: Strip)
    assert "volumes.pre-existing" in rules(decision)
    assert "configMap train-1-config" in decision.message()


def test_the_grants_are_the_operators_not_every_platform_pods() -> None:
    """The platform's own identity submitting the same Pod is a platform run, but not one
    the mpi-operator made: MLRun's API never mounts the operator's ConfigMap itself."""
    decision = judged(worker(), MLRUN_API, mpijob("mpi-1", MLRUN_API.username))
    assert env_names(decision) == ["V3IO_ACCESS_KEY"]
    assert added_capabilities(decision) == []
    assert "volumes.pre-existing" in rules(decision)


def test_a_pod_a_user_submits_naming_the_operators_configmap_is_refused() -> None:
    pod = worker()
    del pod["metadata"]["ownerReferences"]
    decision = judged(pod, ALICE)
    assert added_capabilities(decision) == []
    assert "volumes.pre-existing" in rules(decision)


def test_a_forged_owner_of_another_kind_or_uid_grants_nothing() -> None:
    platform_job = mpijob("mpi-1", MLRUN_API.username)
    for pod in (worker(owner_uid="mpi-2"), worker(owner_kind="TFJob")):
        decision = judged(pod, Requester(MPI), platform_job)
        assert added_capabilities(decision) == [], pod["metadata"]["ownerReferences"]
        assert env_names(decision) == []  # decided, not left undecided: stripped at once
        assert "volumes.pre-existing" in rules(decision)
        assert "ownership.unknown" not in rules(decision)


def test_another_jobs_configmap_is_not_the_operators_for_this_one() -> None:
    pod = worker()
    pod["spec"]["volumes"][0]["configMap"]["name"] = "train-2-config"
    decision = judged(pod, Requester(MPI), mpijob("mpi-1", MLRUN_API.username))
    assert "volumes.pre-existing" in rules(decision)
    assert added_capabilities(decision) == ["IPC_LOCK"]


def test_a_debug_container_gets_no_operator_capability() -> None:
    pod = worker()
    pod["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox",
         "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}
    ]  # fmt: skip
    decision = judged(pod, Requester(MPI), mpijob("mpi-1", MLRUN_API.username))
    paths = {v.path for v in decision.violations if v.rule == "security.capabilities"}
    assert paths == {"spec.ephemeralContainers[0].securityContext.capabilities.add"}


def test_through_a_job_the_operator_created_as_mpi_operator_v2_makes_the_launcher() -> None:
    """mpi-operator v2beta1: the launcher is a Job the operator creates for the MPIJob, and
    the job-controller creates its Pod: the grant follows the chain by uid."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train-1-launcher", "namespace": NS, "uid": "job-1",
                        "labels": {POLICY_LABEL: "mlrun"},
                        "annotations": {REQUESTED_BY: MPI, PLATFORM_RECORD: "true"},
                        "ownerReferences": [{"apiVersion": "kubeflow.org/v2beta1",
                                             "kind": "MPIJob", "name": "train-1",
                                             "uid": "mpi-1", "controller": True}]}}  # fmt: skip
    pod = worker(owner_uid="job-1", owner_kind="Job")
    pod["metadata"]["ownerReferences"][0].update(apiVersion="batch/v1", name="train-1-launcher")
    decision = judged(pod, Requester(JOB_CONTROLLER), job, mpijob("mpi-1", MLRUN_API.username))
    assert not rules(decision), decision.message()
    assert added_capabilities(decision) == ["IPC_LOCK"]
    # a Job someone else made for the platform's MPIJob is not the operator's
    job["metadata"]["annotations"][REQUESTED_BY] = "alice"
    other = judged(pod, Requester(JOB_CONTROLLER), job, mpijob("mpi-1", MLRUN_API.username))
    assert added_capabilities(other) == []


def test_on_update_the_grant_is_read_from_the_stamp_recorded_at_create() -> None:
    created = judged(worker(), Requester(MPI), mpijob("mpi-1", MLRUN_API.username)).object
    assert created["metadata"]["annotations"][REQUESTED_BY] == MPI
    updated = copy.deepcopy(created)
    updated["metadata"]["labels"]["mpi-job-role"] = "worker"
    updated["metadata"]["annotations"]["note"] = "status"
    state = StaticClusterState.from_documents([mpijob("mpi-1", MLRUN_API.username)])
    context = Context(Requester(MPI), state, operation="UPDATE")
    decision = validate(updated, EXAMPLE, namespace=NS, old=created, context=context)
    assert decision.allowed and not rules(decision), decision.message()


# --- the V3IO daemon's node directories ------------------------------------------------------


def daemon_pod(path: str, namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "etl", "namespace": namespace,
                     "labels": {"mlrun/class": "remote-spark", "mlrun/project": "fraud"}},
        "spec": {
            "containers": [{"name": "base", "image": "iguazio/shell:3.6.2",
                            "volumeMounts": [{"name": "v3iod-comm",
                                              "mountPath": "/var/run/iguazio/dayman"}]}],
            "volumes": [{"name": "v3iod-comm", "hostPath": {"path": path, "type": ""}}],
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (f"/var/run/iguazio/dayman/{NS}", True),
        (f"/var/run/iguazio/dayman-shm/{NS}", True),
        (f"/var/run/iguazio/dayman/{NS}/", True),  # the same directory
        ("/var/run/iguazio/dayman/other-tenant", False),  # another namespace's daemon
        (f"/var/run/iguazio/dayman/{NS}/sub", False),  # below: not the daemon's directory
        ("/var/run/iguazio/dayman", False),  # above: every namespace's
        ("/var/run/iguazio", False),
        ("/", False),
        (f"/var/run/iguazio/dayman/{NS}/../../../../etc", False),
        ("/var/lib/kubelet", False),
    ],
)
def test_only_the_daemons_directories_of_the_runs_namespace(path: str, allowed: bool) -> None:
    decision = judged(daemon_pod(path), MLRUN_API)
    assert ("volumes.forbidden-type" not in rules(decision)) is allowed, decision.message()


def test_a_users_pod_gets_no_node_directory() -> None:
    decision = judged(daemon_pod(f"/var/run/iguazio/dayman/{NS}"), ALICE)
    assert "volumes.forbidden-type" in rules(decision)
    assert "only runs the platform creates may use it" in decision.message()


def test_without_allowed_host_paths_every_host_path_is_refused_as_before() -> None:
    run = EXAMPLE.named("mlrun")
    assert run is not None
    volumes = run.volumes.model_copy(update={"allowed_host_paths": ()})
    bare = Policy.of(run.model_copy(update={"volumes": volumes}))
    pod = daemon_pod(f"/var/run/iguazio/dayman/{NS}")
    decision = evaluate(pod, bare, namespace=NS, context=Context(MLRUN_API))
    assert "volumes.forbidden-type" in rules(decision)
    assert "of type hostPath is not allowed" in decision.message()


@pytest.mark.parametrize(
    ("path", "problem"),
    [("var/run/x", "not an absolute path"), ("/", "not an absolute path"),
     ("/var/run/../etc", '".." step'), ("/var/./run", '"." or ".." step'), ("/var/run/", "empty"),
     ("/var//run", "empty"), ("/var/*/x", "no wildcard"), ("/{ns}", "no wildcard")],
)  # fmt: skip
def test_an_allowed_host_path_is_one_absolute_path_without_steps_back(
    path: str, problem: str
) -> None:
    spec = {"selector": {"matchLabels": {"a": "b"}}, "volumes": {"allowedHostPaths": [path]}}
    with pytest.raises(ValidationError, match=re.escape(problem)):
        RunPolicySpec.model_validate(spec)
    ok = {**spec, "volumes": {"allowedHostPaths": ["/var/run/iguazio/dayman/{namespace}"]}}
    assert RunPolicySpec.model_validate(ok).volumes.allowed_host_paths


# --- an owner another webhook adds: the spark-operator's ------------------------------------

SPARK = "system:serviceaccount:mlrun:spark-operator"


def spark_application(uid: str, creator: str) -> dict[str, Any]:
    return recorded("sparkoperator.k8s.io/v1beta2", "SparkApplication", "etl-1", uid, creator)


def driver() -> dict[str, Any]:
    """The driver Pod as spark-submit creates it, before the spark-operator's webhook."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "etl-1-driver", "namespace": NS,
                     "labels": {"mlrun/class": "spark", "mlrun/project": "fraud",
                                "spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:3.2.3",
                                 "env": [{"name": "V3IO_ACCESS_KEY", "valueFrom": {
                                     "secretKeyRef": {"name": AUTH, "key": "accessKey"}}}]}]},
    }  # fmt: skip


def spark_webhook(pod: dict[str, Any]) -> dict[str, Any]:
    """What the spark-operator's mutating webhook adds (patchSparkPod): the
    SparkApplication as the driver's controller owner, and its volumes."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
         "name": "etl-1", "uid": "app-1", "controller": True}
    ]  # fmt: skip
    pod["spec"]["volumes"] = [
        {"name": "v3iod-comm", "hostPath": {"path": f"/var/run/iguazio/dayman/{NS}", "type": ""}}
    ]
    return pod


def test_runguard_before_the_operators_webhook_strips_nothing_the_whole_chain_keeps() -> None:
    """runguard's mutating webhook is called before the spark-operator's ("runguard" sorts
    first): the driver has no owner yet, so its ownership is undecided and the secret
    stays; reinvoked after the operator's webhook, it finds the SparkApplication the
    platform created, and the validating webhook admits the whole."""
    state = StaticClusterState.from_documents([spark_application("app-1", MLRUN_API.username)])
    context = Context(Requester(SPARK), state)
    first = mutate(driver(), EXAMPLE, namespace=NS, context=context)
    assert env_names(first) == ["V3IO_ACCESS_KEY"]
    again = mutate(spark_webhook(first.object), EXAMPLE, namespace=NS, context=context)
    final = again.object
    assert final["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    decision = validate(final, EXAMPLE, namespace=NS, context=context)
    assert decision.allowed and not rules(decision), decision.message()
    assert env_names(decision) == ["V3IO_ACCESS_KEY"]


def test_a_policy_that_strips_keeps_the_operators_configmap_until_the_owner_is_known() -> None:
    """With ``onPreExisting: Strip``, the first mutation (no owner yet) must not drop the
    ConfigMap spark-submit made for the driver: reinvoked, runguard could not put it back."""
    run = EXAMPLE.named("mlrun")
    assert run is not None
    volumes = run.volumes.model_copy(update={"on_pre_existing": "Strip"})
    stripping = Policy.of(run.model_copy(update={"volumes": volumes}))
    pod = driver()
    conf = {"name": "spark-conf-volume-driver",
            "configMap": {"name": "spark-drv-8f2e4a6c1b3d5e7f-conf-map"}}  # fmt: skip
    pod["spec"]["volumes"] = [conf]
    state = StaticClusterState.from_documents([spark_application("app-1", MLRUN_API.username)])
    context = Context(Requester(SPARK), state)
    first = mutate(pod, stripping, namespace=NS, context=context).object
    assert first["spec"]["volumes"] == [conf]
    whole = spark_webhook(first)
    whole["spec"]["volumes"] = [conf, *whole["spec"]["volumes"]]
    final = mutate(whole, stripping, namespace=NS, context=context).object
    decision = validate(final, stripping, namespace=NS, context=context)
    assert decision.allowed and not rules(decision), decision.message()
    assert final["spec"]["volumes"][0] == conf
    # a user's Pod naming the operator's ConfigMap loses it at once
    users = mutate(pod, stripping, namespace=NS, context=Context(ALICE, state)).object
    assert users["spec"].get("volumes") in (None, [])


def test_a_driver_that_never_gets_an_owner_is_not_admitted_with_the_platforms_secret() -> None:
    """The operator's webhook disabled: the driver reaches validation with no owner;
    runguard cannot tell whose it is and fails closed, naming the kind."""
    state = StaticClusterState.from_documents([spark_application("app-1", MLRUN_API.username)])
    context = Context(Requester(SPARK), state)
    mutated = mutate(driver(), EXAMPLE, namespace=NS, context=context).object
    decision = validate(mutated, EXAMPLE, namespace=NS, context=context)
    assert "ownership.unknown" in rules(decision)
    assert "named no owner of kind sparkoperator.k8s.io/SparkApplication" in decision.message()


def test_the_driver_of_a_users_spark_application_gets_nothing() -> None:
    state = StaticClusterState.from_documents([spark_application("app-1", "alice")])
    context = Context(Requester(SPARK), state)
    decision = evaluate(spark_webhook(driver()), EXAMPLE, namespace=NS, context=context)
    assert env_names(decision) == []
    assert "volumes.forbidden-type" in rules(decision)


# --- Spark executors: Pods a Pod creates ----------------------------------------------------

SPARKAPP = Requester(f"system:serviceaccount:{NS}:sparkapp")


def driver_pod(creator: str, *, governed: bool = True) -> dict[str, Any]:
    """The driver as the cluster state holds it: recorded by runguard at its CREATE (the
    platform's when the spark-operator created it for the MLRun API's SparkApplication),
    labelled with the RunPolicy that governs it."""
    pod = driver()
    annotations = {REQUESTED_BY: creator}
    if creator == SPARK:
        annotations[PLATFORM_RECORD] = "true"
    pod["metadata"].update(uid="drv-1", annotations=annotations)
    if governed:
        pod["metadata"]["labels"][POLICY_LABEL] = "mlrun"
    return pod


def executor(owner_uid: str | None = "drv-1") -> dict[str, Any]:
    """Executor 1 as the driver creates it (BasicExecutorFeatureStep): owned by the driver
    Pod, running as sparkapp, with MLRun's secret, the V3IO daemon's directory and the
    ConfigMap the driver made for its executors."""
    pod = spark_webhook(driver())
    pod["metadata"]["name"] = "etl-1-exec-1"
    pod["metadata"]["labels"]["spark-role"] = "executor"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "etl-1-driver", "uid": owner_uid,
         "controller": True}
    ] if owner_uid else []  # fmt: skip
    pod["spec"]["serviceAccountName"] = "sparkapp"
    pod["spec"]["volumes"].append(
        {"name": "spark-conf-volume-exec", "configMap": {"name": "spark-exec-9c3e5a7b-conf-map"}}
    )
    return pod


def test_an_executor_of_the_platforms_driver_keeps_what_the_driver_has() -> None:
    decision = judged(executor(), SPARKAPP, driver_pod(SPARK))
    assert decision.allowed and not rules(decision), decision.message()
    assert env_names(decision) == ["V3IO_ACCESS_KEY"]
    assert decision.object["spec"]["volumes"] == executor()["spec"]["volumes"]
    assert decision.object["metadata"]["annotations"][PLATFORM_RECORD] == "true"


@pytest.mark.parametrize(
    ("objects", "why"),
    [
        ([driver_pod("alice")], "a driver the user created"),
        ([driver_pod(SPARK, governed=False)], "a Pod runguard does not govern: not kept"),
        ([], "no such driver"),
    ],
)
def test_an_executor_of_any_other_driver_gets_nothing(
    objects: list[dict[str, Any]], why: str
) -> None:
    decision = judged(executor(), SPARKAPP, *objects)
    assert env_names(decision) == [], why
    assert {"ownership.service-account", "volumes.forbidden-type"} <= rules(decision), why
    assert not decision.allowed
    assert PLATFORM_RECORD not in decision.object["metadata"]["annotations"]


def test_a_pod_created_as_sparkapp_for_no_driver_gets_nothing() -> None:
    """Anything running as sparkapp could create "executors": with no owner, or one of
    another kind, they are not the platform's (the account itself is refused to Pods the
    platform did not create, so only its drivers and executors hold that token)."""
    no_owner = judged(executor(owner_uid=None), SPARKAPP, driver_pod(SPARK))
    assert not no_owner.allowed
    assert {"ownership.unknown", "ownership.service-account"} <= rules(no_owner)
    other = executor()
    other["metadata"]["ownerReferences"][0].update(kind="ReplicaSet", apiVersion="apps/v1")
    decision = judged(other, SPARKAPP, driver_pod(SPARK))
    assert env_names(decision) == [] and not decision.allowed
    # a user's Pod running as sparkapp, owning nothing, is refused the account
    users = judged(executor(owner_uid=None), ALICE)
    assert "ownership.service-account" in rules(users)


def test_the_watch_keeps_governed_pods_for_the_sparkapp_account_and_rbac_grants_pods() -> None:
    from webhook.clusterstate.process import operator_kinds
    from webhook.install.manifests import operators_watch_rbac

    assert "Pod" in operator_kinds(EXAMPLE)
    role, _ = operators_watch_rbac(EXAMPLE)
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in (
        role["rules"]
    )
    spec = {"selector": {"matchLabels": {"a": "b"}},
            "platform": {"operators": [{"identity": "x", "kinds": ["Service"]}]}}  # fmt: skip
    with pytest.raises(ValidationError, match="kinds"):
        RunPolicySpec.model_validate(spec)


# --- offline, as online -----------------------------------------------------------------


@pytest.mark.parametrize("creator", [MLRUN_API.username, "alice"])
def test_runguard_apply_follows_the_worker_to_the_mpijob_in_kubectl_get_output(
    tmp_path: Path, creator: str
) -> None:
    """``runguard apply --cluster-state`` with the MPIJob as ``kubectl get -o yaml`` lists
    it (records included) decides as the webhooks do."""
    listed = {"apiVersion": "v1", "kind": "List", "items": [
        {**mpijob("mpi-1", creator), "spec": {"slotsPerWorker": 1}}]}  # fmt: skip
    (tmp_path / "state.yaml").write_text(yaml.safe_dump(listed))
    (tmp_path / "pod.json").write_text(json.dumps(worker()))
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", str(REPO / "policies/examples/mlrun"),
         "--cluster-state", str(tmp_path / "state.yaml"), "--as", MPI, "-o", "json",
         str(tmp_path / "pod.json")],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # the example's Warn admits both
    (result,) = json.loads(done.stdout)
    online = judged(worker(), Requester(MPI), mpijob("mpi-1", creator))
    assert result["object"] == online.object
    assert sorted({v["rule"] for v in result["violations"]}) == sorted(rules(online))


@pytest.mark.parametrize("creator", [SPARK, "alice"])
def test_runguard_apply_follows_the_executor_to_its_driver_in_kubectl_get_output(
    tmp_path: Path, creator: str
) -> None:
    """The driver Pod as ``kubectl get pods -o yaml`` lists it, beside other Pods runguard
    does not govern (which the watch would not keep either)."""
    bystander = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": NS, "uid": "web-1"},
        "spec": {},
    }
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [{**driver_pod(creator), "status": {"phase": "Running"}}, bystander],
    }
    (tmp_path / "state.yaml").write_text(yaml.safe_dump(listed))
    (tmp_path / "pod.json").write_text(json.dumps(executor()))
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", str(REPO / "policies/examples/mlrun"),
         "--cluster-state", str(tmp_path / "state.yaml"), "--as", SPARKAPP.username,
         "-o", "json", str(tmp_path / "pod.json")],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    (result,) = json.loads(done.stdout)
    online = judged(executor(), SPARKAPP, driver_pod(creator))
    assert (done.returncode == 0) is online.allowed, done.stderr
    assert result["object"] == online.object
    assert sorted({v["rule"] for v in result["violations"]}) == sorted(rules(online))


# --- the operators' own accounts ------------------------------------------------------------


def test_a_pod_running_as_an_operators_account_is_the_platforms_only() -> None:
    """Pods use any ServiceAccount of their namespace without asking RBAC: a user's Pod
    running as the mpi-operator's account (MLRun CE runs users' notebooks in the same
    namespace) could create Pods as the operator. Like the platform's own accounts, an
    operator's is refused to anything the platform or its installers did not create."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "pretender", "namespace": "mlrun"},
           "spec": {"serviceAccountName": "mpi-operator",
                    "containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    users = evaluate(pod, EXAMPLE, namespace="mlrun", context=Context(ALICE))
    assert "ownership.service-account" in rules(users)
    chart = Requester("helm", ("system:masters",))  # platform.installers' default
    installed = evaluate(pod, EXAMPLE, namespace="mlrun", context=Context(chart))
    assert "ownership.service-account" not in rules(installed)
    # another namespace's account of that name is not the operator's
    elsewhere = evaluate(pod, EXAMPLE, namespace=NS, context=Context(ALICE))
    assert "ownership.service-account" not in rules(elsewhere)
