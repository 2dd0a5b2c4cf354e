"""Attacks (SPEC sections 6, 7, 8) on operators as controllers (``platform.operators``, the
undecided state of an operator's Pod, the operators' ServiceAccounts),
``volumes.allowedHostPaths``, status subresources routed only when they change metadata,
the trust checks in ``rules/trust.py``, the DigitalHub and MLRun operators of the
shipped policies, and RunPolicy/Profile as CRDs.

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces (and,
where a chart aggregates them into ``edit``, the operators' custom resources). Each test
judges objects as the webhooks would: ``mutate``/``validate``/``evaluate`` with the
request's user, the cluster state (metadata by uid), ``old`` and the subresource, or the
rendered matchConditions evaluated by CEL. An attack that is stopped is a plain test (it
guards the property); one that gets through is ``xfail(strict=True)`` with the chain, why
it matters and the fix proposed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_manifests import Cel

from webhook import engine
from webhook.clusterstate.static import StaticClusterState
from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

REPO = Path(__file__).resolve().parents[1]
DIGITALHUB = load_policy(REPO / "policies")
MLRUN = load_policy(REPO / "policies" / "examples" / "mlrun")
ALICE = Requester("alice", ("developers", "system:authenticated"))
CORE = Requester("system:serviceaccount:digitalhub:core", ("system:serviceaccounts",))
ARGO = Requester("system:serviceaccount:digitalhub:argo-workflow-controller")
KUBERAY = Requester("system:serviceaccount:digitalhub:kuberay-operator")
MLRUN_API = Requester("system:serviceaccount:mlrun:mlrun-api")
MPI = Requester("system:serviceaccount:mlrun:mpi-operator")
SPARK = Requester("system:serviceaccount:mlrun:spark-operator")
KCM = "system:serviceaccount:kube-system:"
RS = Requester(f"{KCM}replicaset-controller")
DH_NS = "digitalhub"
ML_NS = "default-tenant"
RUN_SECRET = "sec-herapipeline-5e1d7a2c9b0f4c3e8a6d1b2c3d4e5f60"
AUTH = "mlrun-auth-secrets.c29a30e28e4a11b58caac2394aaac55767ddf697862cd15298f2354a"


def fixture(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "tests" / "platforms" / name).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def stored(obj: dict[str, Any], uid: str, creator: Requester, platform: bool) -> dict[str, Any]:
    """``obj`` as the cluster holds it after runguard recorded its CREATE."""
    out = copy.deepcopy(obj)
    annotations = out["metadata"].setdefault("annotations", {})
    annotations[REQUESTED_BY] = creator.username
    if platform:
        annotations[PLATFORM_RECORD] = "true"
    out["metadata"]["uid"] = uid
    return out


def owned_by(pod: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    meta = owner["metadata"]
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
         "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    return pod


def state(*objects: dict[str, Any]) -> StaticClusterState:
    return StaticClusterState.from_documents(list(objects))


def rules(decision: Any) -> set[str]:
    return {v.rule for v in decision.violations}


def update(
    new: dict[str, Any],
    old: dict[str, Any],
    policy: Policy,
    who: Requester,
    view: StaticClusterState | None = None,
    subresource: str = "",
) -> Any:
    """The validating webhook's decision on an UPDATE (after /mutate put records back)."""
    context = Context(who, view or state(), "UPDATE", subresource)
    ns = old["metadata"]["namespace"]
    mutated = mutate(new, policy, namespace=ns, old=old, context=context).object
    return validate(mutated, policy, namespace=ns, old=old, context=context)


def core_workflow() -> dict[str, Any]:
    return stored(fixture("digitalhub/argo-workflow.yaml"), "wf-1", CORE, platform=True)


def step_pod(workflow: dict[str, Any]) -> dict[str, Any]:
    return owned_by(fixture("digitalhub/argo-step.yaml"), workflow)


def env_names(decision: Any, index: int = 0) -> list[str]:
    return [e["name"] for e in decision.object["spec"]["containers"][index].get("env") or ()]


# --- 1. The platform's custom resources are the operators' pod templates -----------------


def test_a_user_rewrites_the_cores_workflow_and_argo_runs_her_code_as_the_platforms() -> None:
    """Chain: Argo's chart aggregates ``workflows`` into ``edit`` (its aggregate-to-edit
    ClusterRole), so a data scientist may UPDATE the Workflow the Core created for a run.
    She changes the step's image (and its ``serviceAccountName`` to
    ``argo-workflow-controller``). runguard's operators webhook routes the UPDATE, but no
    trust check looks at a custom resource's spec: ``check_platform_change`` only compares
    a *pod controller's* template (``r.target``), which a Workflow has not. Argo then
    creates the step Pod for the Core's Workflow: its owner by uid is the platform's, so
    the Pod is the platform's, keeps the run's secret and the common credentials, and may
    run as the Argo controller's ServiceAccount (an operator's account is allowed to the
    platform's own Pods). Her code now holds the platform's secrets and the controller's
    token, with which it can create Pods "as Argo" owned by any of the Core's Workflows.
    The same holds for KubeAI's Model and KubeRay's RayJob/RayCluster (DigitalHub) and for
    the mpi-operator's MPIJob and the spark-operator's SparkApplication (MLRun, where the
    operators also grant IPC_LOCK, their ConfigMaps and the V3IO node directories).

    Why it matters: ownership is decided at CREATE "and cannot be gained later" and "the
    platform's objects keep running what the platform asked" (SPEC 8); for operators the
    custom resource *is* the pod template.

    Fix: extend ``check_platform_change`` to operator objects
    (``ownership.is_operator_object``): on UPDATE of an object recorded as the platform's,
    a requester that is not a platform identity, installer, controller or operator may not
    change ``spec`` (metadata, e.g. annotations and scaling fields named per kind, may
    stay writable). Argo's ``templateRef``/``workflowTemplateRef`` to WorkflowTemplates in
    the namespace are the same door one step removed: the Core should inline them, or the
    policy should reserve their names.
    """
    workflow = core_workflow()
    # the consequence, by design once the Workflow is the platform's: her step keeps it all
    pod = step_pod(workflow)
    pod["spec"]["serviceAccountName"] = "argo-workflow-controller"
    main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
    main["image"] = "ghcr.io/alice/exfiltrate:latest"
    decision = evaluate(pod, DIGITALHUB, namespace=DH_NS, context=Context(ARGO, state(workflow)))
    assert decision.allowed, decision.message()
    assert decision.object["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    kept = next(c for c in decision.object["spec"]["containers"] if c["name"] == "main")
    assert kept["image"] == "ghcr.io/alice/exfiltrate:latest"
    assert {"secretRef": {"name": RUN_SECRET}} in kept.get("envFrom", [])
    # the door: her UPDATE of the Core's Workflow
    edited = copy.deepcopy(workflow)
    train = next(t for t in edited["spec"]["templates"] if t["name"] == "train")
    train["container"]["image"] = "ghcr.io/alice/exfiltrate:latest"
    train["serviceAccountName"] = "argo-workflow-controller"
    verdict = update(edited, workflow, DIGITALHUB, ALICE, state(workflow))
    assert not verdict.allowed and "ownership.changed" in rules(verdict), verdict.message()


def test_a_user_rewrites_the_platforms_mpijob() -> None:
    """The MLRun side of the attack above: the MPIJob the MLRun API created is recorded as
    the platform's; a user UPDATE of its worker template (image, command) is not refused,
    and the workers the mpi-operator builds from it are the platform's (secrets, IPC_LOCK,
    ``<job>-config``). Fix: as above, ``ownership.changed`` for operator objects."""
    mpijob = {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob",
              "metadata": {"name": "train-1", "namespace": ML_NS},
              "spec": {"slotsPerWorker": 1, "mpiReplicaSpecs": {"Worker": {"replicas": 2,
                       "template": {"spec": {"containers": [
                           {"name": "base", "image": "mlrun/mlrun-gpu:1.7.0"}]}}}}}}  # fmt: skip
    old = stored(mpijob, "mpi-1", MLRUN_API, platform=True)
    new = copy.deepcopy(old)
    template = new["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    template["containers"][0]["image"] = "alice/miner:latest"
    verdict = update(new, old, MLRUN, ALICE, state(old))
    assert "ownership.changed" in rules(verdict), verdict.message()


def test_a_user_cannot_forge_runguards_records_on_her_own_operator_object() -> None:
    """Stopped: a user's Workflow created with the Core's records copied is recorded as
    hers (the operators webhook routes every CREATE and UPDATE of the operators' kinds);
    adding the record later, or an owner in the platform's chain, is refused."""
    forged = fixture("digitalhub/argo-workflow.yaml")
    forged["metadata"]["annotations"] = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}
    context = Context(ALICE, state())
    created = mutate(forged, DIGITALHUB, namespace=DH_NS, context=context).object
    assert created["metadata"]["annotations"][REQUESTED_BY] == "alice"
    assert PLATFORM_RECORD not in created["metadata"]["annotations"]
    assert validate(created, DIGITALHUB, namespace=DH_NS, context=context).allowed
    # validation alone (mutation bypassed) refuses the forged records
    bypass = validate(forged, DIGITALHUB, namespace=DH_NS, context=context)
    assert not bypass.allowed and "ownership.stamp" in rules(bypass)
    hers = stored(created, "wf-2", ALICE, platform=False)
    relabelled = copy.deepcopy(hers)
    relabelled["metadata"]["annotations"][PLATFORM_RECORD] = "true"
    sent = Context(ALICE, state(hers), "UPDATE")
    raw = validate(relabelled, DIGITALHUB, namespace=DH_NS, old=hers, context=sent)
    assert not raw.allowed and "ownership.stamp" in rules(raw)
    adopted = owned_by(hers, core_workflow())
    verdict = update(adopted, hers, DIGITALHUB, ALICE, state(hers, core_workflow()))
    assert not verdict.allowed and "ownership.owner-changed" in rules(verdict)
    # and her Workflow's step Pod gets nothing of the platform's
    pod = step_pod(hers)
    decision = evaluate(pod, DIGITALHUB, namespace=DH_NS, context=Context(ARGO, state(hers)))
    assert not decision.allowed and "ownership.not-a-run" in rules(decision)


def test_a_users_raycluster_naming_the_cores_rayjob_as_owner_is_hers() -> None:
    """Stopped: KubeRay trusts a RayCluster's owner chain; a user creates a RayCluster
    whose controller owner is the Core's RayJob (by its real uid). Only KubeRay itself
    creating it would make the owner count: hers is recorded as not the platform's, and the
    head Pod KubeRay makes from it gets no secret."""
    rayjob = stored({"apiVersion": "ray.io/v1", "kind": "RayJob",
                     "metadata": {"name": "r1", "namespace": DH_NS}},
                    "rj-1", CORE, True)  # fmt: skip
    cluster = owned_by({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                        "metadata": {"name": "r1-raycluster", "namespace": DH_NS}},
                       rayjob)  # fmt: skip
    context = Context(ALICE, state(rayjob))
    created = mutate(cluster, DIGITALHUB, namespace=DH_NS, context=context).object
    assert created["metadata"].get("annotations", {}).get(PLATFORM_RECORD) is None
    hers = stored(created, "rc-1", ALICE, platform=False)
    head = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "r1-head", "namespace": DH_NS, "labels": {"ray.io/node-type": "head"}},
        "spec": {
            "containers": [
                {
                    "name": "ray-head",
                    "image": "rayproject/ray:2.9.0",
                    "envFrom": [{"secretRef": {"name": RUN_SECRET}}],
                }
            ]
        },
    }
    decision = evaluate(
        owned_by(head, hers), DIGITALHUB, namespace=DH_NS, context=Context(KUBERAY, state(hers))
    )
    assert not decision.allowed and "ownership.not-a-run" in rules(decision)


# --- 2. The undecided operator Pod ----------------------------------------------------------


def spark_driver() -> dict[str, Any]:
    """The driver as spark-submit (inside the spark-operator, as its account) creates it,
    naming MLRun's auth secret and adding IPC_LOCK, before any owner is set."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "etl-1-driver", "namespace": ML_NS,
                     "labels": {"mlrun/class": "spark", "mlrun/project": "fraud",
                                "spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "alice/spark:evil",
                                 "env": [{"name": "V3IO_ACCESS_KEY", "valueFrom": {
                                     "secretKeyRef": {"name": AUTH, "key": "accessKey"}}}]}],
                 "volumes": [{"name": "conf", "configMap": {
                     "name": "spark-drv-0123456789abcdef-conf-map"}}]},
    }  # fmt: skip


def users_spark_application() -> dict[str, Any]:
    app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
           "metadata": {"name": "etl-1", "namespace": ML_NS}}  # fmt: skip
    return stored(app, "app-1", ALICE, platform=False)


def test_an_ownerless_driver_from_a_users_spark_application_keeps_mlruns_secret_under_warn() -> (
    None
):
    """Chain: the user creates her own SparkApplication (sparkoperator.k8s.io is in the
    MLRun CE users' roles) whose driver spec names MLRun's auth secret (``secretKeyRef``
    through ``spark.kubernetes.driver.secretKeyRef.*`` or the driver's env). spark-submit,
    inside the spark-operator and as its account, creates the driver with no owner: the
    spark-operator's own mutating webhook is what adds the SparkApplication as owner, and
    it is skipped when it is down or times out (its failurePolicy is Ignore unless
    ``webhook.failOnError``), or when the driver lacks the label its objectSelector wants.
    runguard's /mutate sees an operator's Pod with no controller owner: undecided, so it
    strips nothing (secret, operator ConfigMaps). /validate reports ``ownership.unknown``,
    but the MLRun example enforces ``Warn``, and under Warn that only warns: the driver
    starts with MLRun's access key. Under Warn a user's own Pod naming the secret is
    stripped by mutation, so the property held there before the undecided state existed.

    Fix: ``ownership.unknown`` on a Pod that mutation left undecided must deny whatever the
    enforcement (treat it like ``input.invalid`` in ``_finish``: runguard could not judge
    it, so it fails closed), or under Warn/Audit /mutate must not keep anything undecided.
    """
    view = state(users_spark_application())
    decision = evaluate(spark_driver(), MLRUN, namespace=ML_NS, context=Context(SPARK, view))
    assert "ownership.unknown" in rules(decision)  # judged, but only as a warning
    assert not decision.allowed or env_names(decision) == [], decision.message()


def test_an_ownerless_driver_is_refused_under_deny() -> None:
    """Stopped: the same driver under a Deny policy fails closed (ownership.unknown)."""
    run = MLRUN.named("mlrun")
    assert run is not None
    deny = run.model_copy(update={"enforcement": "Deny", "alternatives": ()})
    view = state(users_spark_application())
    decision = evaluate(spark_driver(), deny, namespace=ML_NS, context=Context(SPARK, view))
    assert not decision.allowed and "ownership.unknown" in rules(decision)


def test_an_owner_of_another_kind_decides_at_once() -> None:
    """Stopped: the operator's Pod naming an owner of a kind it does not own (a user's
    ConfigMap as ``controller: true``) is decided (not the platform's) and stripped by the
    mutation itself, not left for /validate."""
    pod = spark_driver()
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm-1", "controller": True}
    ]
    view = state(users_spark_application())
    decision = evaluate(pod, MLRUN, namespace=ML_NS, context=Context(SPARK, view))
    assert env_names(decision) == []
    assert "ownership.unknown" not in rules(decision)


# --- 3. The operators' accounts ---------------------------------------------------------


def test_a_users_workflow_running_as_the_argo_controllers_account_is_refused() -> None:
    """Stopped: Argo's step Pods run as the Workflow's ``serviceAccountName``; a user's
    Workflow naming ``argo-workflow-controller`` yields a step Pod refused as
    ``ownership.service-account`` (Argo creates it, but for an owner that is not the
    platform's)."""
    hers = stored(fixture("digitalhub/argo-workflow.yaml"), "wf-2", ALICE, platform=False)
    pod = step_pod(hers)
    pod["spec"]["serviceAccountName"] = "argo-workflow-controller"
    for container in pod["spec"]["containers"]:
        container.pop("env", None)
        container.pop("envFrom", None)
    decision = evaluate(pod, DIGITALHUB, namespace=DH_NS, context=Context(ARGO, state(hers)))
    assert not decision.allowed and "ownership.service-account" in rules(decision)


def deny(policy: Policy, name: str) -> Policy:
    """RunPolicy ``name`` of ``policy`` with ``enforcement: Deny``, alone."""
    run = policy.named(name)
    assert run is not None
    return run.model_copy(update={"enforcement": "Deny", "alternatives": ()})


def operator_account_pod(ns: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "nb-7d9-x", "namespace": ns, "labels": {"app": "nb"}},
           "spec": {"serviceAccountName": "mpi-operator",
                    "containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    return owned_by(pod, owner) if owner is not None else pod


def test_under_the_mlrun_examples_warn_a_user_runs_as_the_mpi_operator() -> None:
    """Chain: MLRun CE runs users' notebooks in the operators' namespace ``mlrun``, and a
    Pod may use any ServiceAccount of its namespace without RBAC. Alice creates a Pod
    with ``serviceAccountName: mpi-operator``. runguard finds ``ownership.service-account``
    (today's protection of the operators' accounts), but the shipped MLRun example is
    ``enforcement: Warn`` and the violation is not one mutation can strip (a Pod's account
    is not patched), so it is admitted with a warning. With the operator's token she
    creates, as ``system:serviceaccount:mlrun:mpi-operator``, a Pod whose controller owner
    is the MLRun API's MPIJob (by its uid, readable with ``edit``): it is the platform's,
    keeps MLRun's auth secret, ``IPC_LOCK`` and the operator's ConfigMap (shown below).
    The same Warn admits a user's ``kubectl debug`` of a platform Pod (``ownership.debug``)
    and a user's edit of a platform Deployment's template (``ownership.changed``).

    Why it matters: the commit that protected the operators' accounts (004d492) names
    exactly this chain for MLRun CE, but the MLRun policy it ships does not enforce it;
    SPEC 1 says Warn turns denials into warnings, so the engine is per spec, the shipped
    example is not safe as shipped.

    Fix: ``ownership.*`` trust violations that mutation cannot repair
    (``service-account``, ``debug``, ``changed``, ``owner-changed``, ``stamp``) deny
    under Warn too (Warn is for rolling out the run rules, not for handing out the
    platform's identity), or the MLRun example ships Deny for them, and ``runguard
    lint`` errors on an operator policy under Warn.
    """
    mpijob = stored({"apiVersion": "kubeflow.org/v1", "kind": "MPIJob",
                     "metadata": {"name": "train-1", "namespace": ML_NS}},
                    "mpi-1", MLRUN_API, platform=True)  # fmt: skip
    # what the operator's token gives, by design
    worker = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "w", "namespace": ML_NS,
                           "labels": {"mlrun/class": "mpijob", "mlrun/project": "fraud",
                                      "mlrun/job": "train-1"}},
              "spec": {"containers": [{"name": "base", "image": "alice/miner",
                        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {
                            "name": AUTH, "key": "accessKey"}}}]}]}}  # fmt: skip
    forged = evaluate(owned_by(worker, mpijob), MLRUN, namespace=ML_NS,
                      context=Context(MPI, state(mpijob)))  # fmt: skip
    assert forged.allowed and not rules(forged), forged.message()
    assert env_names(forged) == ["K"]
    # the door: her Pod as the operator's account
    decision = evaluate(operator_account_pod("mlrun"), MLRUN, namespace="mlrun",
                        context=Context(ALICE, state()))  # fmt: skip
    assert "ownership.service-account" in rules(decision)
    assert not decision.allowed, "admitted with a warning only"


def test_a_deployment_switched_to_an_operators_account_yields_refused_pods() -> None:
    """Stopped (under Deny): ``check_service_account`` skips every UPDATE (a Pod's account
    never changes), so a user's existing Deployment may be updated to run as
    ``mpi-operator``; but the ReplicaSet and each Pod created from it are judged at their
    CREATE (the Pod routed by the references webhook, which matches the account) and
    refused: their chain is the user's."""
    ns = "mlrun"
    policy = deny(MLRUN, "mlrun")
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "nb-7d9", "namespace": ns, "uid": "rs-1",
                       "annotations": {REQUESTED_BY: f"{KCM}deployment-controller"}}}  # fmt: skip
    pod = operator_account_pod(ns, rs)
    decision = evaluate(pod, policy, namespace=ns, context=Context(RS, state(rs)))
    assert not decision.allowed and "ownership.service-account" in rules(decision)
    (hook,) = [h for c in manifests.webhook_configurations(MLRUN) for h in c["webhooks"]
               if h["name"] == manifests.VALIDATING_REFERENCES_WEBHOOK]  # fmt: skip
    request = {"operation": "CREATE", "resource": {"resource": "pods"}, "namespace": ns}
    data = {"object": pod, "oldObject": None, "request": request}
    assert all(_holds(Cel(), c["expression"], data) for c in hook["matchConditions"])


IMAGE = "kuberay/operator:v1.1.0"


def operator_deployment(record: str | None) -> dict[str, Any]:
    """KubeRay's operator Deployment (the kuberay-operator chart), as stored."""
    dep: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "kuberay-operator", "namespace": DH_NS, "uid": "d-1"},
        "spec": {
            "selector": {"matchLabels": {"app": "kuberay"}},
            "template": {
                "metadata": {"labels": {"app": "kuberay"}},
                "spec": {
                    "serviceAccountName": "kuberay-operator",
                    "containers": [{"name": "op", "image": IMAGE}],
                },
            },
        },
    }
    if record is not None:
        dep["metadata"]["annotations"] = {REQUESTED_BY: "helm", PLATFORM_RECORD: record}
    return dep


def test_a_user_cannot_swap_the_image_of_an_operator_the_chart_installed() -> None:
    """Stopped: the operator's Deployment created by the chart (``platform.installers``,
    recorded "installer") runs as the operator's account; a user's UPDATE of its image is
    ``ownership.changed``, the installer's goes through."""
    old = operator_deployment("installer")
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "alice/operator:evil"
    verdict = update(new, old, DIGITALHUB, ALICE, state(old))
    assert not verdict.allowed and "ownership.changed" in rules(verdict), verdict.message()


HELM = Requester("helm", ("system:masters",))  # platform.installers' default group
DEPLOYMENTS = Requester(f"{KCM}deployment-controller")


def test_the_deployment_controller_can_record_a_rollout_of_an_installed_operator() -> None:
    """SPEC 8, "controllers keep working". The deployment-controller records a rollout's
    revision (``deployment.kubernetes.io/revision``) on the Deployment through
    ``deployments/status``. For KubeRay's operator Deployment, created by the chart and
    recorded "installer", that status update changes an annotation, so the status
    condition routes it (today's routing), and /validate refuses it as ``ownership.stamp``
    ("an existing object cannot become a run or use the platform's objects by an
    update"): ``_outside_selector`` calls ``check_stamp`` because the template names a
    platform ServiceAccount (``names_platform_objects``), while ``subject.in_scope`` only
    counts platform names (``platform_references``), so the old object is "not in scope"
    and only a platform identity may update it. Every rollout of the operators (and of the
    Core itself) fails at the controller's status update; the chart's ``helm upgrade`` and
    a ``kubectl rollout restart`` by an admin are refused too (next test).

    Fix: ``subject.in_scope`` also counts an old template that runs as a platform
    ServiceAccount (``names_platform_objects(old)``), so check_stamp refuses only an
    object *entering* the platform's accounts by an update; ``check_service_account``
    then judges the UPDATE of a controller's template (today it skips every UPDATE)."""
    old = operator_deployment("installer")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "2"
    assert _status_routed(_hook(DIGITALHUB, manifests.CONTROLLERS_WEBHOOK), new, old,
                          "deployments")  # fmt: skip
    verdict = update(new, old, DIGITALHUB, DEPLOYMENTS, state(old), subresource="status")
    assert verdict.allowed, verdict.message()


def test_the_chart_can_upgrade_the_operator_it_installed() -> None:
    """``helm upgrade`` of KubeRay (a new operator image), by ``platform.installers``, is
    refused as ``ownership.stamp`` for the reason above. Fix: as above."""
    old = operator_deployment("installer")
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "kuberay/operator:v1.2.0"
    verdict = update(new, old, DIGITALHUB, HELM, state(old))
    assert verdict.allowed, verdict.message()


@pytest.mark.xfail(
    strict=True,
    reason="an operator installed before runguard (no records): the Pod its ReplicaSet "
    "recreates after an eviction is refused as ownership.service-account",
)
def test_an_operator_installed_before_runguard_survives_a_node_drain() -> None:
    """runguard is usually installed on a running platform: KubeRay's Deployment and
    ReplicaSet exist without runguard's records. When the operator's Pod is evicted, the
    Pod the replicaset-controller creates runs as ``kuberay-operator``, a platform
    account now; its chain has no record, so it is neither the platform's nor the
    installer's: ``ownership.service-account``. The operator is gone until an admin
    recreates its Deployment (and, per the previous tests, cannot even update it).

    Remedy (next test, and docs/operations.md): an installer's or the platform's update
    of such a Deployment (``kubectl rollout restart``) records it as theirs, and the new
    ReplicaSet's Pods run as the operator. Still open, hence the xfail: with no such
    update, the first eviction after installing runguard loses the operator's Pod. A
    fix without an admin's action would trust a chain with no record anywhere whose top
    owner was created before runguard (``creationTimestamp`` before the policy's install,
    or an admin's list of such Deployments)."""
    dep = operator_deployment(None)
    rs = owned_by({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "kuberay-operator-5f", "namespace": DH_NS,
                                "uid": "rs-1"}}, dep)  # fmt: skip
    pod = owned_by({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "kuberay-operator-5f-x", "namespace": DH_NS,
                                 "labels": {"app": "kuberay"}},
                    "spec": copy.deepcopy(dep["spec"]["template"]["spec"])}, rs)  # fmt: skip
    decision = evaluate(pod, DIGITALHUB, namespace=DH_NS, context=Context(RS, state(dep, rs)))
    assert decision.allowed, decision.message()


def test_an_installers_rollout_restart_adopts_an_operator_installed_before_runguard() -> None:
    """The remedy for the xfail above, without recreating anything: the platform or an
    installer (``platform.installers``: the chart, cluster admins by default) updates the
    Deployment runguard never recorded, e.g. ``kubectl rollout restart``. runguard records
    it then as theirs (they vouch for it, as they could create it anew), the
    deployment-controller's new ReplicaSet follows it, and that ReplicaSet's Pods run as
    the operator's account, after a drain too. A user's update records nothing."""
    dep = operator_deployment(None)
    restarted = copy.deepcopy(dep)
    restarted["spec"]["template"]["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/restartedAt": "2026-11-27T16:00:00Z"
    }
    context = Context(HELM, state(dep), "UPDATE")
    mutation = mutate(restarted, DIGITALHUB, namespace=DH_NS, old=dep, context=context)
    adopted = mutation.object
    assert adopted["metadata"]["annotations"][REQUESTED_BY] == "helm"
    assert adopted["metadata"]["annotations"][PLATFORM_RECORD] == "installer"
    verdict = validate(adopted, DIGITALHUB, namespace=DH_NS, old=dep, context=context)
    assert verdict.allowed, verdict.message()
    # the deployment-controller's new ReplicaSet, then the Pod its controller makes
    rs = owned_by({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "kuberay-operator-6c", "namespace": DH_NS},
                   "spec": copy.deepcopy(adopted["spec"])}, adopted)  # fmt: skip
    made = evaluate(rs, DIGITALHUB, namespace=DH_NS, context=Context(DEPLOYMENTS, state(adopted)))
    assert made.allowed, made.message()
    rs_stored = {**made.object, "metadata": {**made.object["metadata"], "uid": "rs-2"}}
    assert rs_stored["metadata"]["annotations"][PLATFORM_RECORD] == "installer"
    pod = owned_by({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "kuberay-operator-6c-x", "namespace": DH_NS,
                                 "labels": {"app": "kuberay"}},
                    "spec": copy.deepcopy(dep["spec"]["template"]["spec"])}, rs_stored)  # fmt: skip
    decision = evaluate(pod, DIGITALHUB, namespace=DH_NS,
                        context=Context(RS, state(adopted, rs_stored)))  # fmt: skip
    assert decision.allowed, decision.message()
    # a user's update of the same Deployment adopts nothing
    user = Context(ALICE, state(dep), "UPDATE")
    theirs = mutate(restarted, DIGITALHUB, namespace=DH_NS, old=dep, context=user).object
    assert REQUESTED_BY not in theirs["metadata"].get("annotations", {})
    forged = copy.deepcopy(restarted)
    forged["metadata"]["annotations"] = {REQUESTED_BY: "alice", PLATFORM_RECORD: "installer"}
    refused = validate(forged, DIGITALHUB, namespace=DH_NS, old=dep, context=user)
    assert not refused.allowed and "ownership.stamp" in rules(refused), refused.message()


def _holds(cel: Cel, expression: str, data: dict[str, Any]) -> bool:
    program = cel.env.compile(expression)
    value = program.eval(data=data)
    assert value.type() == cel.cel.Type.BOOL, (expression, value)
    return bool(value.value())


# --- 4. Node directories --------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        f"/var/run/iguazio/dayman/{ML_NS}/..",
        f"/var/run/iguazio/dayman/{ML_NS}/.",
        f"/var/run/iguazio/dayman/{ML_NS}/../other-tenant",
        f"/var/run/iguazio/dayman//{ML_NS}/..",
        f"/var/run/iguazio/dayman/{ML_NS}\n",
        f"/var/run/iguazio/dayman/{ML_NS}\x00/x",
        f"/var/run/iguazio/dayman/{ML_NS.upper()}",
        f"//var/run/iguazio/dayman/{ML_NS}/../../../..",
        "/var/run/iguazio/dayman/{namespace}",
        "/var/run/iguazio/dayman/*",
    ],
)
def test_no_spelling_of_an_allowed_node_path_reaches_another_directory(path: str) -> None:
    """Stopped: ``allowedHostPaths`` compare the path exactly (trailing "/" aside), so no
    step, NUL, newline, case or literal placeholder reaches another node directory, even
    for a platform run."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "etl", "namespace": ML_NS,
                        "labels": {"mlrun/class": "remote-spark", "mlrun/project": "fraud"}},
           "spec": {"containers": [{"name": "base", "image": "iguazio/shell:3.6.2"}],
                    "volumes": [{"name": "d", "hostPath": {"path": path}}]}}  # fmt: skip
    decision = evaluate(pod, MLRUN, namespace=ML_NS, context=Context(MLRUN_API))
    assert "volumes.forbidden-type" in rules(decision), decision.message()


def test_the_run_namespace_placeholder_is_the_requests_namespace_not_the_objects() -> None:
    """Stopped: a Pod sent to namespace A whose metadata says B is judged with A's path."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "etl", "namespace": "other-tenant",
                        "labels": {"mlrun/class": "remote-spark", "mlrun/project": "fraud"}},
           "spec": {"containers": [{"name": "base", "image": "iguazio/shell:3.6.2"}],
                    "volumes": [{"name": "d", "hostPath": {
                        "path": "/var/run/iguazio/dayman/other-tenant"}}]}}  # fmt: skip
    decision = evaluate(pod, MLRUN, namespace=ML_NS, context=Context(MLRUN_API))
    assert "volumes.forbidden-type" in rules(decision), decision.message()


# --- 5. Status subresources ---------------------------------------------------------------


def _status_routed(hook: dict[str, Any], new: dict[str, Any], old: dict[str, Any],
                   resource: str) -> bool:  # fmt: skip
    cel = Cel()
    request = {"operation": "UPDATE", "subResource": "status", "resource": {"resource": resource},
               "namespace": new["metadata"]["namespace"]}  # fmt: skip
    data = {"object": new, "oldObject": old, "request": request}
    return all(_holds(cel, c["expression"], data) for c in hook.get("matchConditions", []))


def _hook(policy: Policy, name: str) -> dict[str, Any]:
    (found,) = [h for c in manifests.webhook_configurations(policy) for h in c["webhooks"]
                if h["name"] == name]  # fmt: skip
    return dict(found)


def test_a_status_update_adding_a_record_to_a_users_job_reaches_runguard_and_is_undone() -> None:
    """Stopped: ``jobs/status`` stores labels and annotations; a user's unrouted Job (no
    run labels, no platform names, never stamped) given ``runguard.io/platform: "true"``
    and the Core's stamp through ``jobs/status`` would make every Pod the job-controller
    creates for it the platform's. The records condition routes it; /mutate puts the
    records back as they were, and /validate alone (mutation bypassed) refuses them."""
    old: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "j", "namespace": "ml", "uid": "j-1"},
           "spec": {"template": {"metadata": {"labels": {"app": "x"}},
                                 "spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}},
           "status": {"active": 1}}  # fmt: skip
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}
    for name in (manifests.MUTATING_CONTROLLERS_WEBHOOK, manifests.CONTROLLERS_WEBHOOK):
        assert _status_routed(_hook(DIGITALHUB, name), new, old, "jobs"), name
    # /mutate puts the records back as they were (none); /validate alone refuses them
    verdict = update(new, old, DIGITALHUB, ALICE, subresource="status")
    assert verdict.allowed, verdict.message()
    assert not verdict.object["metadata"].get("annotations", {}).get(PLATFORM_RECORD)
    assert not verdict.object["metadata"].get("annotations", {}).get(REQUESTED_BY)
    context = Context(ALICE, state(), "UPDATE", "status")
    raw = validate(new, DIGITALHUB, namespace="ml", old=old, context=context)
    assert not raw.allowed and "ownership.stamp" in rules(raw), raw.message()


def test_a_status_update_moving_a_run_pod_out_of_its_policy_reaches_runguard() -> None:
    """Stopped: ``pods/status`` relabelling a run out of every selector and dropping
    runguard's policy label is routed (the old object matches the objectSelector, and the
    labels changed) and refused as ``scope.labels``."""
    run = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}
    old: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ml", "uid": "p-1",
                        "labels": {**run, POLICY_LABEL: "digitalhub"},
                        "annotations": {REQUESTED_BY: "alice"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"app": "free"}
    hook = _hook(DIGITALHUB, manifests.VALIDATING_WEBHOOK)
    assert _status_routed(hook, new, old, "pods")
    context = Context(ALICE, state(), "UPDATE", "status")
    verdict = validate(new, DIGITALHUB, namespace="ml", old=old, context=context)
    assert not verdict.allowed and "scope.labels" in rules(verdict), verdict.message()


def test_the_operators_kinds_are_routed_on_every_create_and_update() -> None:
    """Stopped: every operator kind of the shipped policies reaches both operator webhooks,
    with its ``/status`` and ``/scale``, narrowed by the same conditions: what the platform
    creates (recorded), what carries or claims a record, runs and references reach
    runguard; a user's own object does not (tests/test_attacks_operators.py evaluates
    them)."""
    for policy, kinds in ((DIGITALHUB, {"workflows", "models", "rayjobs", "rayclusters"}),
                          (MLRUN, {"mpijobs", "sparkapplications"})):  # fmt: skip
        for name in (manifests.MUTATING_OPERATORS_WEBHOOK, manifests.OPERATORS_WEBHOOK):
            hook = _hook(policy, name)
            assert [c["name"] for c in hook["matchConditions"]] == [
                "run-records-platform-or-references",
                "status-changes-metadata",
            ]
            routed = {r for rule in hook["rules"] for r in rule["resources"]}
            assert kinds | {f"{k}/scale" for k in kinds} <= routed, (name, routed)
            assert all(set(rule["operations"]) == {"CREATE", "UPDATE"} for rule in hook["rules"])


# --- 6. RunPolicy and Profile as custom resources -------------------------------------------


def test_policy_objects_are_cluster_scoped_and_not_aggregated_to_edit() -> None:
    """Stopped: a user with ``edit`` (a RoleBinding in her namespace) cannot create or
    change a RunPolicy or Profile: both CRDs are cluster-scoped and no ClusterRole of the
    component aggregates them anywhere; the watch's own role only reads them and patches
    their status. The one aggregated role that writes is a project's own profiles
    (ProjectProfile, namespaced), and only to ``admin``; ``view`` (so ``edit``) reads
    them."""
    directory = REPO / "manifests" / "policy-objects"
    for name in ("runguard.io_runpolicies.yaml", "runguard.io_profiles.yaml"):
        crd = yaml.safe_load((directory / name).read_text(encoding="utf-8"))
        assert crd["spec"]["scope"] == "Cluster", name
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    for path in directory.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            labels = ((doc or {}).get("metadata") or {}).get("labels") or {}
            to = {k.removeprefix(aggregate) for k in labels if k.startswith(aggregate)}
            if not to:
                continue
            assert to <= {"admin", "view"}, (path, doc["metadata"]["name"])
            for rule in doc["rules"]:
                assert set(rule["resources"]) == {"projectprofiles"}, rule
                if to != {"admin"}:
                    assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    for doc in yaml.safe_load_all((directory / "rbac.yaml").read_text(encoding="utf-8")):
        for rule in (doc or {}).get("rules", ()):
            if set(rule["resources"]) & {"runpolicies", "profiles"}:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


TRAINING = Requester("system:serviceaccount:kubeflow:training-operator")


def edited_policies(tmp_path: Path) -> Policy:
    """The shipped policies as an admin edits them live (``kubectl edit platform``): one
    more operator, Kubeflow's training-operator for PyTorchJobs."""
    for path in (REPO / "policies").glob("*.yaml"):
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        for doc in docs:
            if doc.get("kind") == "Platform":  # every RunPolicy names it, as the shipped do
                doc["spec"]["operators"].append(
                    {"identity": TRAINING.username, "kinds": ["kubeflow.org/PyTorchJob"]}
                )
        (tmp_path / path.name).write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    return load_policy(tmp_path)


def test_a_live_policy_edit_is_routed_before_it_is_relied_on(tmp_path: Path) -> None:
    """Chain: with RunPolicy and Profile as objects watched live, an admin adds an operator
    (Kubeflow's training-operator, ``kubeflow.org/PyTorchJob``) with ``kubectl edit
    platform digitalhub``. The policy watch mirrors it and the server serves it within
    seconds; nothing renders the webhook configurations again (``runguard manifests
    --check`` compares them with ``policies/`` in Git, not with the objects). The
    operators webhooks still list only the old kinds, so a user's PyTorchJob created with
    the Core's records (``runguard.io/requested-by: ...core``, ``runguard.io/platform:
    "true"``) is never stamped and keeps them. Once runguard watches the new kind (after
    the ``rollout restart`` docs/operations.md asks for when a kind is added; until then
    such Pods fail closed), the training-operator's Pod for her PyTorchJob is judged the
    platform's: the run's secret, as the platform's. The same drift leaves a
    new secret or claim pattern unreserved (the reserved-names condition is rendered from
    the old patterns: a user creates the platform's future secret first) and a new
    RunPolicy's Pods unrouted (objectSelector per RunPolicy).

    Why it matters: "what the engine judges and what reaches it cannot drift" (SPEC 8,
    every door by construction); with live objects the two now come from different
    sources.

    Closed: the policy watch renders the webhook configurations from the edited policy
    and compares them with the cluster's; an edit whose routing differs is held (its
    status says so, the policy before it is served) until an admin applies them.
    """
    live = edited_policies(tmp_path)
    forged = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "steal", "namespace": DH_NS, "uid": "pt-1",
                        "annotations": forged}}  # fmt: skip
    pod = owned_by(
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "steal-master-0", "namespace": DH_NS},
         "spec": {"containers": [{"name": "pytorch", "image": "alice/miner",
                                  "envFrom": [{"secretRef": {"name": RUN_SECRET}}]}]}},
        job,
    )  # fmt: skip
    decision = evaluate(pod, live, namespace=DH_NS, context=Context(TRAINING, state(job)))
    assert decision.allowed and decision.object["metadata"]["annotations"][PLATFORM_RECORD]
    # the engine would have stamped her PyTorchJob as hers, had it reached runguard
    sent = copy.deepcopy(job)
    stamped = mutate(sent, live, namespace=DH_NS, context=Context(ALICE, state())).object
    assert PLATFORM_RECORD not in stamped["metadata"]["annotations"]
    # Closed: the policy watch holds an edit that changes what the webhooks route until
    # the cluster's configurations route it, and serves the policy before it meanwhile.
    from webhook.policy.mirror.watch import held_because, policy_routing

    ns = manifests.DEFAULT_NAMESPACE
    before = policy_routing(DIGITALHUB, ns)
    held = held_because(DIGITALHUB, live, lambda: (before, ns))
    assert held is not None and "mutate-operators.runguard.io" in held, held
    assert held_because(DIGITALHUB, live, lambda: (policy_routing(live, ns), ns)) is None


# --- 7. A shell in the operator's Pod ---------------------------------------------------------


def test_a_user_cannot_debug_the_operators_pod_for_its_token() -> None:
    """Stopped, but by ``ownership.stamp``, not ``ownership.debug``. KubeRay's operator
    runs in the platform's namespace as ``kuberay-operator``, a platform account since
    today; a user with ``edit`` there adds an ephemeral container to the operator's Pod
    (``kubectl debug --target``, the Pod's token volume mounted): the operator's token
    would let her create Pods "as KubeRay" owned by the Core's RayJobs. The request is
    routed (the references condition matches the account) and refused, because
    ``check_stamp`` sees an old object that "names" a platform account but is not in
    scope. ``check_debug_container`` itself only looks at the platform record ("true")
    and platform names, so the fix proposed for the keep-working tests (``in_scope``
    counting accounts) must also make ``ownership.debug`` cover a Pod running as a
    platform or operator account."""
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "kuberay-operator-5f-x", "namespace": DH_NS,
                        "labels": {"app": "kuberay"},
                        "annotations": {REQUESTED_BY: RS.username, PLATFORM_RECORD: "installer"}},
           "spec": {"serviceAccountName": "kuberay-operator",
                    "containers": [{"name": "op", "image": IMAGE}]}}  # fmt: skip
    debugged = copy.deepcopy(pod)
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "debugger", "image": "busybox", "targetContainerName": "op",
         "volumeMounts": [{"name": "kube-api-access", "mountPath": "/t"}]}
    ]  # fmt: skip
    hook = _hook(DIGITALHUB, manifests.VALIDATING_REFERENCES_WEBHOOK)
    cel = Cel()
    request = {"operation": "UPDATE", "subResource": "ephemeralcontainers",
               "resource": {"resource": "pods"}, "namespace": DH_NS}  # fmt: skip
    data = {"object": debugged, "oldObject": pod, "request": request}
    assert all(_holds(cel, c["expression"], data) for c in hook["matchConditions"])
    verdict = update(debugged, pod, DIGITALHUB, ALICE, subresource="ephemeralcontainers")
    assert not verdict.allowed, verdict.message()


def test_a_shell_in_a_platform_pod_by_exec_is_judged_like_a_debug_container() -> None:
    """Chain: ``ownership.debug`` refuses a user's ephemeral container in a Pod the
    platform created ("a shell in the run, with its secrets"). The ``edit`` ClusterRole
    also grants ``create pods/exec`` and ``pods/attach``: ``kubectl exec`` into the same
    Pod (an Argo step of the Core's Workflow, the Core's run, KubeRay's head, or an
    operator's own Pod for its token) is the same shell, and no webhook of runguard had a
    rule for CONNECT. Why it matters: the property ownership.debug protects held only
    against the harder of two equivalent doors.

    Closed: the cluster-state component routes CONNECT of ``pods/exec`` and
    ``pods/attach`` (no objectSelector: the object is PodExecOptions) to ``/validate``,
    runguard reads the Pod with that component's credentials and judges it as it judges
    a debug container (``tests/test_shells.py``; through the real apiserver and kubectl
    in ``tests/e2e/test_trust.py``)."""
    operations = {
        (resource, op)
        for h in manifests.shells_webhook_configuration(DIGITALHUB)["webhooks"]
        for rule in h["rules"]
        for resource in rule["resources"]
        for op in rule["operations"]
    }
    assert {("pods/exec", "CONNECT"), ("pods/attach", "CONNECT")} <= operations
    run = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "step-1", "namespace": DH_NS},
           "spec": {"serviceAccountName": "core",
                    "containers": [{"name": "main", "image": "python:3.11"}]}}  # fmt: skip
    user = Context(Requester("mallory", ("developers",)), None, "CONNECT", "exec")
    decision = engine.connect(run, DIGITALHUB, namespace=DH_NS, context=user)
    assert not decision.allowed and {v.rule for v in decision.violations} == {"ownership.debug"}


# --- 8. An owner another webhook adds, chosen by a label the user writes ---------------------


def platform_spark_application() -> dict[str, Any]:
    app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
           "metadata": {"name": "etl-1", "namespace": ML_NS}}  # fmt: skip
    return stored(app, "app-1", MLRUN_API, platform=True)


def test_a_users_spark_application_may_not_write_the_label_the_operator_finds_owners_by() -> None:
    """Chain (the spark-operator's side as read in its v1beta2 sources,
    ``pkg/controller/sparkapplication/submission.go`` and ``pkg/webhook/webhook.go``): the
    user creates her own SparkApplication whose ``spec.driver.labels`` (or ``sparkConf``
    ``spark.kubernetes.driver.label.sparkoperator.k8s.io/app-name``) set
    ``sparkoperator.k8s.io/app-name: etl-1``, the name of the MLRun API's application.
    spark-submit, run by the operator as ``spark-operator``, creates her driver with that
    label; the spark-operator's mutating webhook looks the application up by it and makes
    the MLRun API's SparkApplication the controller owner. runguard, trusting an owner by
    uid of the operator's kind recorded as the platform's, would make her driver the
    platform's (MLRun's auth secret, the V3IO node directories) even under Deny: the
    operator's webhook turned "ownership by uid" back into "ownership by label".

    Closed at the door: the MLRun example reserves the spark-operator's labels
    (``reservedLabels: [sparkoperator.k8s.io/]``), so a SparkApplication that writes one,
    by anyone but the MLRun API or the operator, is ``ownership.reserved-label``, at
    CREATE and UPDATE, whatever the enforcement mode."""
    mine = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
            "metadata": {"name": "mine", "namespace": ML_NS},
            "spec": {"driver": {"labels": {"sparkoperator.k8s.io/app-name": "etl-1"}},
                     "executor": {"labels": {"team": "a"}}}}  # fmt: skip
    created = evaluate(mine, MLRUN, namespace=ML_NS, context=Context(ALICE, state()))
    assert not created.allowed and rules(created) == {"ownership.reserved-label"}
    by_conf = copy.deepcopy(mine)
    by_conf["spec"] = {"sparkConf": {
        "spark.kubernetes.driver.label.sparkoperator.k8s.io/app-name": "etl-1"}}  # fmt: skip
    created = evaluate(by_conf, MLRUN, namespace=ML_NS, context=Context(ALICE, state()))
    assert not created.allowed and rules(created) == {"ownership.reserved-label"}
    # her own application without it is hers, as before; adding it later is refused too
    clean = copy.deepcopy(mine)
    clean["spec"]["driver"]["labels"] = {"team": "a"}
    created = evaluate(clean, MLRUN, namespace=ML_NS, context=Context(ALICE, state()))
    assert created.allowed, created.message()
    old = stored(clean, "app-9", ALICE, platform=False)
    verdict = update({**copy.deepcopy(old), "spec": mine["spec"]}, old, MLRUN, ALICE, state(old))
    assert not verdict.allowed and "ownership.reserved-label" in rules(verdict)
    # the MLRun API and the operator itself may write them
    for who in (MLRUN_API, SPARK):
        created = evaluate(mine, MLRUN, namespace=ML_NS, context=Context(who, state()))
        assert "ownership.reserved-label" not in rules(created), who
