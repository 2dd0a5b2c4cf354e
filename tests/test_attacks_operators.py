"""Attacks through the platform's operators and the profile annotation, against the shipped
policies: an operator's object naming a platform object (``ownership.reference``), the
``scale`` subresource of an operator's kind, the narrowed routing of the operators'
webhooks, and the profile named by an annotation instead of the label.

The attacker is a user with the ``edit`` ClusterRole in a run namespace (she may create
and update RayJobs, Models, Workflows and Deployments, and ``kubectl scale`` them). Each
test keeps the chain it stops in its docstring. The same chains go through the real
apiserver in ``tests/e2e/test_operator_routing.py``.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_attacks_operators_and_records import ALICE, ARGO, CORE, KUBERAY, MLRUN, REPO
from test_manifests import Cel
from test_ownership import Meta, State

from webhook.clusterstate import StaticClusterState
from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.engine.rules.operators import selects
from webhook.install import manifests
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import PolicyError, load_policy
from webhook.policy.model import Operator, OperatorReference, Policy
from webhook.serving import admission

SHIPPED = load_policy(REPO / "policies")
KUBEAI = Requester("system:serviceaccount:digitalhub:digitalhub-kubeai")
NS = "digitalhub"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}
PLATFORMS = {REQUESTED_BY: KUBERAY.username, PLATFORM_RECORD: "true"}  # KubeRay's, for the Core


def rules(decision: Any) -> set[str]:
    assert decision.error is None, decision.message()
    return {v.rule for v in decision.violations}


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


# --- 1. an operator's object naming a platform object ---------------------------------------


def test_a_users_rayjob_submitted_to_the_platforms_raycluster_is_refused() -> None:
    """Stopped: alice's RayJob names the platform's RayCluster in ``spec.clusterSelector``
    (KubeRay reads the name at its ``ray.io/cluster`` key): KubeRay would submit her
    entrypoint to the platform's cluster, whose Pods hold the run's secret and claim."""
    decision = judged(rayjob(PLATFORM_CLUSTER["metadata"]["name"]), ALICE)
    assert not decision.allowed and rules(decision) == {"ownership.reference"}
    assert "spec.clusterSelector[ray.io/cluster]" in decision.message()
    assert "r1-raycluster-x7k2p is the platform's" in decision.message()
    # enforcement Warn or Audit does not let an ownership violation through
    lax = SHIPPED.model_copy(update={"enforcement": "Audit"})
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
    return run.model_copy(update={"platform": platform, "alternatives": ()})


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


# --- 2. the scale subresource of an operator's kind -----------------------------------------


def model(annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "kubeai.org/v1", "kind": "Model",
            "metadata": {"name": "llama-r1", "namespace": NS, "uid": "m-1",
                         "annotations": annotations},
            "spec": {"replicas": 1, "url": "hf://meta-llama/Llama-3.2-1B-Instruct"}}  # fmt: skip


CORES_MODEL = model({REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"})


def scale_request(who: Requester, replicas: int = 4, name: str = "llama-r1") -> dict[str, Any]:
    """What the apiserver sends for ``kubectl scale model llama-r1 --replicas=4``."""

    def scale(n: int) -> dict[str, Any]:
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": NS, "uid": "m-1"},
                "spec": {"replicas": n}, "status": {"replicas": 1}}  # fmt: skip

    return {"uid": "u-1", "operation": "UPDATE",
            "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
            "resource": {"group": "kubeai.org", "version": "v1", "resource": "models"},
            "subResource": "scale", "namespace": NS, "name": name,
            "object": scale(replicas), "oldObject": scale(1),
            "userInfo": {"username": who.username, "groups": list(who.groups)}}  # fmt: skip


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


# --- 3. the operators' webhooks, narrowed by CEL --------------------------------------------


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


# --- 4. the profile, by annotation ----------------------------------------------------------


def deployment(annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": "ml", "uid": "d-1"},
            "spec": {"replicas": 1, "selector": {"matchLabels": RUN},
                     "template": {"metadata": {"labels": dict(RUN),
                                               "annotations": dict(annotations)},
                                  "spec": {"containers": [{"name": "main",
                                                           "image": "python:3.11"}]}}}}  # fmt: skip


def test_the_profile_annotation_of_the_platforms_deployment_is_frozen() -> None:
    """Stopped: the profile label was frozen on a run, not its annotation form (the policy
    reads the label, else the annotation): alice moved the Core's Deployment to a GPU
    profile by annotating its template, and its next Pods got it."""
    label = SHIPPED.profiles_config.label
    stored = evaluate(deployment({label: "cpu-large"}), SHIPPED, namespace="ml",
                      context=Context(CORE, State([]))).object  # fmt: skip
    for written in ({label: "2xa100"}, {}):
        moved = copy.deepcopy(stored)
        moved["spec"]["template"]["metadata"]["annotations"] = written
        context = Context(ALICE, State([]), "UPDATE")
        verdict = validate(moved, SHIPPED, namespace="ml", old=stored, context=context)
        assert not verdict.allowed and rules(verdict) == {"scope.labels"}, written
        assert f"spec.template.metadata.annotations[{label}]" in verdict.message()
    # adding one where the run named no profile is refused too; other annotations are not
    plain = evaluate(deployment({}), SHIPPED, namespace="ml",
                     context=Context(CORE, State([]))).object  # fmt: skip
    added = copy.deepcopy(plain)
    added["spec"]["template"]["metadata"]["annotations"] = {label: "2xa100"}
    context = Context(ALICE, State([]), "UPDATE")
    assert "scope.labels" in rules(validate(added, SHIPPED, namespace="ml", old=plain,
                                            context=context))  # fmt: skip
    other = copy.deepcopy(stored)
    other["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = (
        "2026-11-28T09:00:00Z"
    )
    assert validate(other, SHIPPED, namespace="ml", old=stored, context=context).allowed


def test_the_profile_annotation_of_a_run_pod_is_frozen() -> None:
    label = SHIPPED.profiles_config.label
    run = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train", "namespace": "ml", "labels": dict(RUN),
                        "annotations": {label: "cpu-large"}},
           "spec": {"containers": [{"name": "main", "image": "python:3.11"}]}}  # fmt: skip
    stored = evaluate(run, SHIPPED, namespace="ml", context=Context(CORE, State([]))).object
    moved = copy.deepcopy(stored)
    moved["metadata"]["annotations"][label] = "1xt4"
    verdict = validate(moved, SHIPPED, namespace="ml", old=stored,
                       context=Context(ALICE, State([]), "UPDATE"))  # fmt: skip
    assert not verdict.allowed and rules(verdict) == {"scope.labels"}


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


def test_another_platforms_model_is_not_scaled_through_the_first_platforms_exemption(
    tmp_path: Path,
) -> None:
    """Two platforms declaring KubeAI: the first RunPolicy's exemption (its own identity,
    or none applying) once decided for both, so a user, or the Core, scaled the second
    platform's Model. Each platform's Model is judged by its own RunPolicy."""
    shutil.copytree(REPO / "policies", tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "examples")
    other = yaml.safe_load((REPO / "policies" / "runpolicy.yaml").read_text())
    other["metadata"]["name"] = other["spec"]["platform"] = "other"
    other_platform = yaml.safe_load((REPO / "policies" / "platform.yaml").read_text())
    other_platform["metadata"]["name"] = "other"
    other_platform["spec"]["identities"] = ["system:serviceaccount:other:api"]
    (tmp_path / "other.yaml").write_text(yaml.safe_dump_all([other, other_platform]))
    two = load_policy(tmp_path)
    others_model = model({REQUESTED_BY: "system:serviceaccount:other:api", PLATFORM_RECORD: "true",
                          PLATFORM_POLICY: "other"})  # fmt: skip
    state = StaticClusterState.from_documents([others_model])
    for who in (ALICE, CORE):
        outcome = admission.review("validate", scale_request(who), two, state)  # type: ignore[arg-type]
        assert outcome.response["response"]["allowed"] is False, who
        assert "[ownership.changed]" in outcome.response["response"]["status"]["message"]
    other_api = Requester("system:serviceaccount:other:api")
    outcome = admission.review("validate", scale_request(other_api), two, state)  # type: ignore[arg-type]
    assert outcome.response["response"]["allowed"] is True
