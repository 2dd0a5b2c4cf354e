"""Attacks through the platform's operators (``rules/operators.py``, the operators'
webhooks of ``webhook/install/manifests.py``): a user rewriting the custom resource that
is an operator's pod template, forging records or owners on her own, an operator's
object naming a platform object (``ownership.reference``), the ``scale`` subresource of
an operator's kind, an operator's Pod created with no owner yet, a label another
webhook reads owners by, and the narrowed routing of the operators' webhooks.

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces (and,
where a chart aggregates them into ``edit``, the operators' custom resources: she may
create and update RayJobs, Models, Workflows and Deployments, and ``kubectl scale``
them). An attack that is stopped is a plain test; each keeps its chain in its
docstring. The same chains go through the real apiserver in
``tests/e2e/test_operator_routing.py``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO
from harness.attack_chains import (
    AUTH,
    DH_NS,
    DIGITALHUB,
    KUBERAY,
    ML_NS,
    MLRUN,
    MLRUN_API,
    NS,
    RUN_SECRET,
    SPARK,
    _hook,
    env_names,
    fixture,
    model,
    owned_by,
    scale_request,
    state,
    step_pod,
    stored,
    update,
)
from harness.cluster_state import Meta, State
from harness.routing import Cel
from harness.shipped import ALICE, ARGO, CORE, RUN, SHIPPED, rules

from webhook.clusterstate import StaticClusterState
from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.engine.rules.operators import selects
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import PolicyError, load_policy
from webhook.policy.model import Operator, OperatorReference, Policy
from webhook.serving import admission

KUBEAI = Requester("system:serviceaccount:digitalhub:digitalhub-kubeai")
PLATFORMS = {REQUESTED_BY: KUBERAY.username, PLATFORM_RECORD: "true"}  # KubeRay's, for the Core


def raycluster(name: str, annotations: dict[str, str], uid: str) -> dict[str, Any]:
    """A RayCluster as ``kubectl get raycluster -o yaml`` prints it."""
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": NS, "uid": uid,
                         "annotations": dict(annotations), "resourceVersion": "7"},
            "spec": {"headGroupSpec": {"template": {"spec": {"containers": []}}}},
            "status": {"state": "ready"}}  # fmt: skip


PLATFORM_CLUSTER = raycluster("r1-raycluster-x7k2p", PLATFORMS, "rc-platform")
HER_CLUSTER = raycluster("mine", {}, "rc-hers")


def cluster_state() -> StaticClusterState:
    return StaticClusterState.from_documents([PLATFORM_CLUSTER, HER_CLUSTER])


def rayjob(cluster: str | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"entrypoint": "python -c 'import os; print(os.environ)'"}
    if cluster is not None:
        spec["clusterSelector"] = {"ray.io/cluster": cluster}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "job", "namespace": NS, **meta}, "spec": spec}  # fmt: skip


def judged(obj: dict[str, Any], who: Requester, state: Any = None, policy: Policy = SHIPPED) -> Any:
    view = cluster_state() if state is None else state
    return evaluate(obj, policy, namespace=NS, context=Context(who, view))


def updated(new: Any, old: Any, who: Requester, state: Any = None, sub: str = "") -> Any:
    context = Context(who, cluster_state() if state is None else state, "UPDATE", sub)
    mutation = mutate(new, SHIPPED, namespace=NS, old=old, context=context)
    return validate(mutation.object, SHIPPED, namespace=NS, old=old, context=context)


def core_workflow() -> dict[str, Any]:
    return stored(fixture("digitalhub/argo-workflow.yaml"), "wf-1", CORE, platform=True)


# --- the platform's custom resources are the operators' pod templates -------------------


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
    platform's objects keep running what the platform asked" (docs/dev/guarantees.md, "Trust over
    time"); for operators the custom resource *is* the pod template.

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


# --- an operator's object naming a platform object --------------------------------------


def test_a_users_rayjob_submitted_to_the_platforms_raycluster_is_refused() -> None:
    """Stopped: alice's RayJob names the platform's RayCluster in ``spec.clusterSelector``
    (KubeRay reads the name at its ``ray.io/cluster`` key): KubeRay would submit her
    entrypoint to the platform's cluster, whose Pods hold the run's secret and claim."""
    decision = judged(rayjob(PLATFORM_CLUSTER["metadata"]["name"]), ALICE)
    assert not decision.allowed and rules(decision) == {"ownership.reference"}
    assert "spec.clusterSelector[ray.io/cluster]" in decision.message()
    assert "r1-raycluster-x7k2p is the platform's" in decision.message()
    # enforcement Warn or Audit does not let an ownership violation through
    lax = Policy.of(*(p.model_copy(update={"enforcement": "Audit"}) for p in SHIPPED.run_policies))
    assert not judged(rayjob("r1-raycluster-x7k2p"), ALICE, policy=lax).allowed


def test_rayjobs_naming_their_own_clusters_keep_working() -> None:
    """Her RayJob naming her own RayCluster, one naming none (KubeRay makes its own), one
    naming a cluster that does not exist, and the Core naming its own cluster, all go
    through; KubeRay's updates of any of them too."""
    for obj, who in ((rayjob("mine"), ALICE), (rayjob(), ALICE), (rayjob("nothing"), ALICE),
                     (rayjob("r1-raycluster-x7k2p"), CORE)):  # fmt: skip
        decision = judged(obj, who)
        assert decision.allowed and "ownership.reference" not in rules(decision), obj
    stored = judged(rayjob("r1-raycluster-x7k2p"), CORE).object
    finalized = copy.deepcopy(stored)
    finalized["metadata"]["finalizers"] = ["ray.io/rayjob-finalizer"]
    assert updated(finalized, stored, KUBERAY).allowed


def test_pointing_an_existing_rayjob_at_the_platforms_cluster_is_refused() -> None:
    """Stopped: an UPDATE that sets the field (KubeRay reads it until it records the
    cluster in the status); a field left as it was is not judged again."""
    hers = judged(rayjob("mine"), ALICE).object
    moved = copy.deepcopy(hers)
    moved["spec"]["clusterSelector"]["ray.io/cluster"] = "r1-raycluster-x7k2p"
    verdict = updated(moved, hers, ALICE)
    assert not verdict.allowed and rules(verdict) == {"ownership.reference"}
    labelled = copy.deepcopy(hers)
    labelled["metadata"]["labels"] = {"team": "a"}
    assert updated(labelled, hers, ALICE).allowed


def test_a_reference_the_cache_cannot_judge_fails_closed() -> None:
    """No cluster state (offline without ``--cluster-state``) or RayClusters not synced
    yet: runguard cannot tell whose the cluster is, so the RayJob waits (retryable)."""
    for view in (None, State([], synced=False)):
        decision = evaluate(rayjob("r1-raycluster-x7k2p"), SHIPPED, namespace=NS,
                            context=Context(ALICE, view))  # fmt: skip
        assert not decision.allowed and rules(decision) == {"ownership.unknown"}
        assert "cannot tell whether RayCluster 'r1-raycluster-x7k2p'" in decision.message()


def test_offline_apply_judges_the_reference_from_the_cluster_state(tmp_path: Path) -> None:
    """``runguard apply --cluster-state`` reads the RayClusters of ``kubectl get -o yaml``."""
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {},
              "items": [PLATFORM_CLUSTER, HER_CLUSTER]}  # fmt: skip
    (tmp_path / "state.yaml").write_text(yaml.safe_dump(listed))
    outcomes = {}
    for cluster in ("r1-raycluster-x7k2p", "mine"):
        (tmp_path / "job.json").write_text(json.dumps(rayjob(cluster)))
        done = subprocess.run(
            [sys.executable, "-m", "webhook", "apply", "-p", str(REPO / "policies"), "-o",
             "json", "--cluster-state", str(tmp_path / "state.yaml"), "--as", "alice",
             str(tmp_path / "job.json")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.stdout, done.stderr
        outcomes[cluster] = (done.returncode, json.dumps(json.loads(done.stdout)))
    assert outcomes["r1-raycluster-x7k2p"][0] == 1
    assert "ownership.reference" in outcomes["r1-raycluster-x7k2p"][1]
    assert outcomes["mine"][0] == 0


def selector_policy() -> Policy:
    """The shipped digitalhub policy with an operator that selects its clusters by label."""
    run = SHIPPED.named("digitalhub")
    assert run is not None
    reference = OperatorReference(kind="ray.io/RayJob", path="spec.clusterSelector",
                                  names="ray.io/RayCluster", by="selector")  # fmt: skip
    operator = Operator(identity=KUBERAY.username, kinds=("ray.io/RayJob", "ray.io/RayCluster"),
                        references=(reference,))  # fmt: skip
    platform = run.platform.model_copy(update={"operators": (operator,)})
    return Policy.of(run.model_copy(update={"platform": platform}))


def test_a_selector_picking_a_platform_object_is_refused() -> None:
    """``by: selector``: any platform object of the kind, in the namespace, the selector
    picks (a plain map of labels, or matchLabels/matchExpressions)."""
    policy = selector_policy()
    state = State([Meta("RayCluster", NS, "p", "u1", {"team": "core"}, PLATFORMS),
                   Meta("RayCluster", NS, "h", "u2", {"team": "alice"}, {}),
                   Meta("RayCluster", "other", "o", "u3", {"team": "x"}, PLATFORMS)])  # fmt: skip
    state.in_namespace = lambda kind, ns: [  # type: ignore[attr-defined]
        o for o in state.objects if o.kind == kind and o.namespace == ns
    ]

    def job(selector: Any) -> dict[str, Any]:
        obj = rayjob()
        obj["spec"]["clusterSelector"] = selector
        return obj

    for selector, refused in (({"team": "core"}, True), ({"team": "alice"}, False),
                              ({"team": "x"}, False),
                              ({"matchExpressions": [{"key": "team", "operator": "In",
                                                      "values": ["core", "y"]}]}, True),
                              ({"matchLabels": {"team": "alice"}}, False),
                              ({"matchExpressions": "garbage"}, True)):  # fmt: skip
        decision = judged(job(selector), ALICE, state, policy)
        assert ("ownership.reference" in rules(decision)) is refused, selector


def test_what_a_selector_picks_is_read_widest() -> None:
    assert selects({"a": "1"}, {"a": "1", "b": "2"}) and not selects({"a": "1"}, {"a": "2"})
    assert selects({}, {"a": "1"})  # the empty selector picks everything, as in Kubernetes
    assert selects({"matchLabels": {"a": "1"}}, {"a": "1"})
    assert selects("not a selector", {}) and selects({"matchExpressions": [{"op": 1}]}, {})
    assert selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""})
    assert not selects({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]},
                       {"a": ""})  # fmt: skip


def test_a_reference_must_be_in_its_operators_kind_and_name_a_recorded_kind(
    tmp_path: Path,
) -> None:
    text = (REPO / "policies" / "platform.yaml").read_text(encoding="utf-8")
    for name in ("profiles.yaml", "runpolicy.yaml"):
        (tmp_path / name).write_text((REPO / "policies" / name).read_text(encoding="utf-8"))
    for wrong, message in (
        ("kind: ray.io/RayJob", "is not one of this operator's kinds"),
        ("names: ray.io/RayCluster", "is no kind of the platform's"),
    ):
        key, _, _ = wrong.partition(":")
        broken = text.replace(wrong, f"{key}: argoproj.io/WorkflowTemplate")
        (tmp_path / "platform.yaml").write_text(broken)
        with pytest.raises(PolicyError, match=message):
            load_policy(tmp_path)  # fmt: skip
    # a path is keys, [KEY] and [*]: anything else is refused where it is written
    broken = text.replace("spec.clusterSelector[ray.io/cluster]", "spec..clusterSelector")
    (tmp_path / "platform.yaml").write_text(broken)
    with pytest.raises(PolicyError, match=r"platform.yaml:\d+: .*references\[0\]\.path"):
        load_policy(tmp_path)


def test_a_users_spark_application_naming_the_platforms_driver_is_refused() -> None:
    """Stopped: the spark-operator takes the Pod named by ``spec.driver.podName`` (or the
    ``spark.kubernetes.driver.pod.name`` conf) as the application's driver: it reports its
    state as hers and deletes it with her application. MLRun's driver Pod is the
    platform's; only MLRun names it there."""
    driver = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "spark-etl-4c1d8e2a-driver", "namespace": "default-tenant",
                           "uid": "p-1", "labels": {"runguard.io/policy": "mlrun"},
                           "annotations": {PLATFORM_RECORD: "true"}}}  # fmt: skip
    state = StaticClusterState.from_documents([driver])
    api = Requester("system:serviceaccount:mlrun:mlrun-api")
    for spec in (
        {"driver": {"podName": "spark-etl-4c1d8e2a-driver"}},
        {"sparkConf": {"spark.kubernetes.driver.pod.name": "spark-etl-4c1d8e2a-driver"}},
    ):
        app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
               "metadata": {"name": "mine", "namespace": "default-tenant"},
               "spec": {"type": "Python", **spec}}  # fmt: skip
        decision = evaluate(app, MLRUN, namespace="default-tenant", context=Context(ALICE, state))
        assert not decision.allowed and rules(decision) == {"ownership.reference"}, spec
        mine = evaluate(app, MLRUN, namespace="default-tenant", context=Context(api, state))
        assert "ownership.reference" not in rules(mine), spec


# --- the scale subresource of an operator's kind ----------------------------------------


CORES_MODEL = model({REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"})


def answer(request: dict[str, Any], state: Any, endpoint: str = "validate") -> dict[str, Any]:
    outcome = admission.review(endpoint, request, SHIPPED, state)  # type: ignore[arg-type]
    assert outcome.error is None
    return outcome.response["response"]


def test_kubectl_scale_of_the_platforms_model_is_refused() -> None:
    """Stopped: ``kubectl scale model`` through ``models/scale`` was not routed, and a Scale
    carries no record: the Model it scales is read from the cache."""
    state = StaticClusterState.from_documents([CORES_MODEL])
    denied = answer(scale_request(ALICE), state)
    assert denied["allowed"] is False
    assert "[ownership.changed]" in denied["status"]["message"]
    assert "scaling it is the platform's" in denied["status"]["message"]
    # KubeAI's autoscaler and the Core scale it; scaling to the same size is nothing
    assert answer(scale_request(KUBEAI), state)["allowed"] is True
    assert answer(scale_request(CORE), state)["allowed"] is True
    assert answer(scale_request(ALICE, replicas=1), state)["allowed"] is True
    # her own Model she scales as she likes; the mutating webhook changes nothing
    hers = StaticClusterState.from_documents([model({})])
    assert answer(scale_request(ALICE), hers)["allowed"] is True
    assert "patch" not in answer(scale_request(ALICE), state, "mutate")


def test_a_scale_the_cache_cannot_judge_fails_closed() -> None:
    for view in (None, State([], synced=False)):
        denied = answer(scale_request(ALICE), view)
        assert denied["allowed"] is False and "[ownership.unknown]" in denied["status"]["message"]


def test_an_update_of_the_platforms_model_spec_is_refused_as_its_scale() -> None:
    """The same change through the object itself (``kubectl edit``) was already refused."""
    state = StaticClusterState.from_documents([CORES_MODEL])
    bigger = copy.deepcopy(CORES_MODEL)
    bigger["spec"]["replicas"] = 4
    verdict = updated(bigger, CORES_MODEL, ALICE, state)
    assert not verdict.allowed and rules(verdict) == {"ownership.changed"}


# --- the undecided operator Pod ----------------------------------------------------------


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
    deny = Policy.of(run.model_copy(update={"enforcement": "Deny"}))
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


# --- an owner another webhook adds, chosen by a label the user writes --------------------


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


# --- the operators' webhooks, narrowed by CEL -------------------------------------------


class Routing(Cel):
    """Evaluates a webhook's matchConditions as the apiserver does, with the whole
    request (its user, kind and subresource): all must hold, none may fail."""

    def sent(self, policy: Policy, name: str, request: dict[str, Any]) -> bool:
        hooks = [h for c in manifests.webhook_configurations(policy) for h in c["webhooks"]
                 if h["name"] == name]  # fmt: skip
        assert len(hooks) == 1, name
        data = {"object": request.get("object"), "oldObject": request.get("oldObject"),
                "request": {k: v for k, v in request.items()
                            if k not in ("object", "oldObject")}}  # fmt: skip
        for condition in hooks[0].get("matchConditions", ()):
            expression = condition["expression"]
            if expression not in self.programs:
                self.programs[expression] = self.env.compile(expression)
            value = self.programs[expression].eval(data=data)
            assert value.type() == self.cel.Type.BOOL, (condition, value)
            if not value.value():
                return False
        return True


@pytest.fixture(scope="module")
def routing() -> Routing:
    return Routing()


HOOKS = (manifests.MUTATING_OPERATORS_WEBHOOK, manifests.OPERATORS_WEBHOOK)


def request_of(obj: dict[str, Any], who: Requester, old: dict[str, Any] | None = None,
               sub: str = "") -> dict[str, Any]:  # fmt: skip
    group, _, version = obj["apiVersion"].rpartition("/")
    request = {"uid": "u", "operation": "UPDATE" if old is not None else "CREATE",
               "kind": {"group": group, "version": version, "kind": obj["kind"]},
               "resource": {"group": group, "version": version,
                            "resource": manifests.plural(obj["kind"])},
               "namespace": NS, "name": obj["metadata"]["name"],
               "object": obj, "oldObject": old,
               "userInfo": {"username": who.username, "groups": list(who.groups)}}  # fmt: skip
    if sub:
        request["subResource"] = sub
    return request


def workflow(labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "mine", "namespace": NS, "labels": dict(labels or {}), **meta},
            "spec": {"entrypoint": "main",
                     "templates": [{"name": "main",
                                    "container": {"image": "busybox"}}]}}  # fmt: skip


def test_the_operators_kinds_are_routed_on_every_create_and_update() -> None:
    """Stopped: every operator kind of the shipped policies reaches both operator webhooks,
    with its ``/status`` and ``/scale``, narrowed by the same conditions: what the platform
    creates (recorded), what carries or claims a record, runs and references reach
    runguard; a user's own object does not (the routing tests below evaluate them)."""
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


def test_a_users_own_workflow_and_argos_updates_never_wait_on_runguard(routing: Routing) -> None:
    """Stopped: every Workflow write outside the excluded namespaces waited on runguard,
    fail closed, whoever owned it. Her plain Workflow: its CREATE, Argo's updates (of the
    object, at every step) and its status never reach runguard, and runguard records
    nothing on it that would route it later."""
    mine = workflow()
    stored = judged(mine, ALICE).object
    assert REQUESTED_BY not in stored["metadata"].get("annotations", {})
    stepped = copy.deepcopy(stored)
    stepped["status"] = {"phase": "Running", "nodes": {"mine": {"phase": "Running"}}}
    stepped["metadata"]["labels"]["workflows.argoproj.io/phase"] = "Running"
    for name in HOOKS:
        assert not routing.sent(SHIPPED, name, request_of(mine, ALICE)), name
        assert not routing.sent(SHIPPED, name, request_of(stepped, ARGO, stored)), name
        assert not routing.sent(SHIPPED, name, request_of(stepped, ALICE, stored)), name
        assert not routing.sent(SHIPPED, name, request_of(stepped, ARGO, stored, "status"))


def test_what_runguard_judges_on_an_operators_objects_reaches_it(routing: Routing) -> None:
    """Routing covers judgment for the operators' kinds: every request below that the
    engine would change (mutate) or refuse (validate) is routed to both webhooks. The
    requests are the chains of this file and the operators' legitimate paths."""
    state = cluster_state()
    cores = judged(workflow(RUN), CORE).object
    forged = workflow(annotations={PLATFORM_RECORD: "true"})
    users = judged(workflow(), ALICE).object
    claims = copy.deepcopy(users)
    claims["metadata"]["annotations"] = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}
    rewritten = copy.deepcopy(cores)
    rewritten["spec"]["templates"][0]["container"]["image"] = "evil"
    unlabelled = copy.deepcopy(cores)
    unlabelled["metadata"]["labels"] = {}
    cluster_of_hers = {
        **HER_CLUSTER,
        "metadata": {
            **HER_CLUSTER["metadata"],
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayJob",
                    "name": "job",
                    "uid": "rj-9",
                    "controller": True,
                }
            ],
        },
    }
    cases = [
        request_of(workflow(), ALICE),
        request_of(workflow(RUN), ALICE),
        request_of(workflow(RUN), CORE),
        request_of(workflow(), CORE),
        request_of(forged, ALICE),
        request_of(claims, ALICE, users),
        request_of(rewritten, ALICE, cores),
        request_of(unlabelled, ALICE, cores),
        request_of(rewritten, ARGO, cores),
        request_of(rayjob("r1-raycluster-x7k2p"), ALICE),
        request_of(rayjob("mine"), ALICE),
        request_of(rayjob(), ALICE),
        request_of(cluster_of_hers, KUBERAY),
        request_of(PLATFORM_CLUSTER, KUBERAY),
    ]  # fmt: skip
    checked = 0
    for request in cases:
        context = admission.context_of(request, state)  # type: ignore[arg-type]
        obj, old = request["object"], request["oldObject"]
        mutation = mutate(obj, SHIPPED, namespace=NS, old=old, context=context)
        validation = validate(mutation.object, SHIPPED, namespace=NS, old=old, context=context)
        if mutation.patch or not validation.allowed:
            checked += 1
            for name in HOOKS:
                assert routing.sent(SHIPPED, name, request), (name, request["userInfo"], obj)
    assert checked >= 7  # the chains above are judged, not only routed


PLATFORM_RAYJOB = {**rayjob(), "metadata": {"name": "r1", "namespace": NS, "uid": "rj-1",
                                            "annotations": dict(PLATFORMS)}}  # fmt: skip
ADMIN = Requester("admin", ("system:masters",))


# metadata variants: nothing, a forged record, run labels, a forged RunPolicy label
METADATA = ({}, {"annotations": {PLATFORM_RECORD: "true"}}, {"labels": dict(RUN)},
            {"labels": {"runguard.io/policy": "digitalhub"}})  # fmt: skip
OLD = (None, {}, {"annotations": {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}})


def variants(kind: str) -> list[dict[str, Any]]:
    """The objects of ``kind`` judged below: its references and owners, each way."""
    if kind == "RayJob":
        return [rayjob(c) for c in (None, "r1-raycluster-x7k2p", "mine")]
    if kind == "RayCluster":
        owned = copy.deepcopy(HER_CLUSTER)
        owned["metadata"]["ownerReferences"] = [
            {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "r1", "uid": "rj-1",
             "controller": True}
        ]  # fmt: skip
        return [copy.deepcopy(HER_CLUSTER), owned]
    return [model({}) if kind == "Model" else workflow()]


def dressed(obj: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["labels"] = dict(metadata.get("labels", {}))
    out["metadata"]["annotations"] = dict(metadata.get("annotations", {}))
    return out


def test_routing_covers_judgment_for_the_operators_kinds(routing: Routing) -> None:
    """Every object of the operators' kinds, each of its references and owners, with each
    metadata (nothing, a forged record, run labels), created or updated (from nothing,
    from the platform's records, the spec changed) by a user, the platform, the operator
    or an admin: when the engine would change it (mutate) or refuse it (validate), both
    operators' webhooks are sent the request."""
    state = StaticClusterState.from_documents([PLATFORM_CLUSTER, HER_CLUSTER, PLATFORM_RAYJOB])
    judged_requests = 0
    for kind in ("Workflow", "Model", "RayJob", "RayCluster"):
        for base in variants(kind):
            for who in (ALICE, CORE, KUBERAY, ADMIN):
                for metadata in METADATA:
                    for before in OLD:
                        obj = dressed(base, metadata)
                        old = None if before is None else dressed(base, before)
                        if old is not None:
                            obj["spec"]["changed"] = True
                        request = request_of(obj, who, old)
                        context = admission.context_of(request, state)  # type: ignore[arg-type]
                        mutation = mutate(obj, SHIPPED, namespace=NS, old=old, context=context)
                        validation = validate(mutation.object, SHIPPED, namespace=NS, old=old,
                                              context=context)  # fmt: skip
                        assert mutation.error is None and validation.error is None
                        if not mutation.patch and validation.allowed:
                            continue
                        judged_requests += 1
                        for name in HOOKS:
                            assert routing.sent(SHIPPED, name, request), (
                                name, who.username, obj["metadata"], old, rules(validation)
                            )  # fmt: skip
    assert judged_requests > 100  # most of them are judged: the check is not vacuous


def test_a_scale_of_the_platforms_model_reaches_runguard_unless_its_platform_asks(
    routing: Routing,
) -> None:
    # (the platform's own requests are routed, judged and allowed, as any of its writes)
    for who, routed in ((ALICE, True), (KUBEAI, False), (CORE, True)):
        assert routing.sent(SHIPPED, manifests.OPERATORS_WEBHOOK, scale_request(who)) is routed


def test_every_spark_application_reaches_runguard(routing: Routing) -> None:
    """The spark-operator keys on labels anywhere in a SparkApplication (reservedLabels):
    CEL cannot look everywhere, so each one is judged."""
    app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
           "metadata": {"name": "mine", "namespace": NS}, "spec": {"type": "Python"}}  # fmt: skip
    assert routing.sent(MLRUN, manifests.OPERATORS_WEBHOOK, request_of(app, ALICE))
    mpi = {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob",
           "metadata": {"name": "mine", "namespace": NS}, "spec": {}}  # fmt: skip
    assert not routing.sent(MLRUN, manifests.OPERATORS_WEBHOOK, request_of(mpi, ALICE))
