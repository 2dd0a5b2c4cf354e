"""What the attack chains (``tests/engine/attacks/test_*.py``) share: the policies and requesters
they judge with, and the engine called as the webhooks call it.

The chains are filed by the concern they attack; a helper used by one file stays there.
``rules`` is ``harness.shipped.rules`` (it asserts the engine judged without an error) and
``update`` here is the validating webhook's decision on an UPDATE under any policy
(``harness.shipped.update`` returns both webhooks' under the shipped one).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from webhook.clusterstate.static import StaticClusterState
from webhook.engine import connect, evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

from .cluster_state import Meta, State
from .inputs import REPO
from .references import NAMESPACE, STRIP
from .routing import Cel, calls
from .shipped import ALICE, CORE, RUN, SHIPPED, created, pod

DIGITALHUB = SHIPPED
MLRUN = load_policy(REPO / "policies" / "examples" / "mlrun")
DH_NS = "digitalhub"
ML_NS = "default-tenant"
NS = DH_NS  # the operators' objects of the Core


# --- the policies and requesters ---------------------------------------------------------


MLRUN_API = Requester("system:serviceaccount:mlrun:mlrun-api", ("system:serviceaccounts",))
# A run Pod's own token (its account, bound to it): what a user's code in a Pod holds.
LAUNCHER = Requester("system:serviceaccount:ml:launcher", ("system:serviceaccounts",))
KUBERAY = Requester("system:serviceaccount:digitalhub:kuberay-operator")
MPI = Requester("system:serviceaccount:mlrun:mpi-operator")
SPARK = Requester("system:serviceaccount:mlrun:spark-operator")
NUCLIO = Requester("system:serviceaccount:mlrun:nuclio", ("system:serviceaccounts",))
SECRET = "digitalhub-common-creds"  # the Core's credentials, given to its runs only
RUN_SECRET = "sec-herapipeline-5e1d7a2c9b0f4c3e8a6d1b2c3d4e5f60"
AUTH = "mlrun-auth-secrets.c29a30e28e4a11b58caac2394aaac55767ddf697862cd15298f2354a"
HER_RUN = {**RUN, "dhcore/run": "r2"}


TWO = Policy.of(*SHIPPED.run_policies, *MLRUN.run_policies)


# --- the engine, as the webhooks call it ------------------------------------------------


def admitted(obj: dict[str, Any], policy: Policy, who: Requester) -> dict[str, Any]:
    decision = evaluate(obj, policy, namespace="ml", context=Context(who, State([])))
    assert decision.allowed, decision.message()
    return decision.object


def door(target: Any, policy: Policy, who: Requester, by: Any = None, how: str = "exec") -> Any:
    context = Context(who, State([]), "CONNECT", how)
    return connect(target, policy, namespace="ml", context=context, by=by)


def judged(obj: dict[str, Any], who: Requester, policy: Any = STRIP) -> Any:
    decision = evaluate(obj, policy, namespace=NAMESPACE, context=Context(who, State([])))
    assert decision.error is None, decision.message()
    return decision


def judged_by(obj: dict[str, Any], who: Requester, policy: Any = SHIPPED, ns: str = "ml",
              state: State | None = None) -> Any:  # fmt: skip
    context = Context(who, state if state is not None else State([]))
    decision = evaluate(obj, policy, namespace=ns, context=context)
    assert decision.error is None, decision.message()
    return decision


def routed(obj: dict[str, Any], old: dict[str, Any] | None = None, op: str = "CREATE",
           sub: str = "") -> list[str]:  # fmt: skip
    """The runguard webhooks (mutating and validating) the apiserver calls for it."""
    mutating, validating = manifests.webhook_configurations(SHIPPED)
    cel = Cel()
    return [*calls(cel, mutating, obj, old, "ml", op, ALICE, sub),
            *calls(cel, validating, obj, old, "ml", op, ALICE, sub)]  # fmt: skip


def state(*objects: dict[str, Any]) -> StaticClusterState:
    return StaticClusterState.from_documents(list(objects))


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


def _updated(new: dict[str, Any], old: dict[str, Any], who: Requester) -> dict[str, Any]:
    new = copy.deepcopy(new)
    new["metadata"] = copy.deepcopy(old["metadata"])
    context = Context(who, State([]), "UPDATE")
    mutation = mutate(new, TWO, namespace="ml", old=old, context=context)
    assert validate(mutation.object, TWO, namespace="ml", old=old, context=context).allowed
    stored: dict[str, Any] = mutation.object
    return stored


def mlrun_run() -> dict[str, Any]:
    """MLRun's run Pod in ml, created by its API: MLRun's."""
    labels = {"mlrun/class": "job", "mlrun/project": "p1", "mlrun/uid": "u1"}
    made = copy.deepcopy(pod(labels=labels))
    made["spec"] = {"serviceAccountName": "launcher",
                    "containers": [{"name": "main", "image": "python:3.11"}]}  # fmt: skip
    return admitted(made, TWO, MLRUN_API)


def nuclio_function() -> dict[str, Any]:
    """A Nuclio function's Pod in ml (the user's serving code), created by Nuclio's
    controller: Nuclio's."""
    function = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "fn", "namespace": "ml",
                             "labels": {"mlrun/class": "serving",
                                        "nuclio.io/project-name": "p1"}},
                "spec": {"serviceAccountName": "launcher",
                         "containers": [{"name": "main", "image": "python:3.11"}]}}  # fmt: skip
    return admitted(function, TWO, NUCLIO)


def platform_run() -> dict[str, Any]:
    return created(pod(), CORE)


# --- objects ----------------------------------------------------------------------------


def run(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(RUN)
                     if labels is None else labels},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec},
    }  # fmt: skip


def plain(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod of hers outside every RunPolicy's selector (``app: x``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": labels or {"app": "x"}},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec},
    }


def deployment(labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mine", "namespace": "ml", "labels": dict(labels)},
        "spec": {"selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": spec}},
    }  # fmt: skip


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


def step_pod(workflow: dict[str, Any]) -> dict[str, Any]:
    return owned_by(fixture("digitalhub/argo-step.yaml"), workflow)


def env_names(decision: Any, index: int = 0) -> list[str]:
    return [e["name"] for e in decision.object["spec"]["containers"][index].get("env") or ()]


def model(annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "kubeai.org/v1", "kind": "Model",
            "metadata": {"name": "llama-r1", "namespace": NS, "uid": "m-1",
                         "annotations": annotations},
            "spec": {"replicas": 1, "url": "hf://meta-llama/Llama-3.2-1B-Instruct"}}  # fmt: skip


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


def _controller_ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def _meta(kind: str, obj: dict[str, Any], uid: str) -> Meta:
    m = obj["metadata"]
    return Meta(kind, "ml", m["name"], uid, m.get("labels") or {}, m.get("annotations") or {})


def _role_binding(namespace: str, rules_: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "r", "namespace": namespace},
         "rules": rules_},
        {"apiVersion": rbac, "kind": "RoleBinding",
         "metadata": {"name": "b", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
         "subjects": [{"kind": "User", "name": "alice"}]},
    ]  # fmt: skip


# --- routing: the rendered webhooks and their matchConditions ---------------------------


def _holds(cel: Cel, expression: str, data: dict[str, Any]) -> bool:
    program = cel.env.compile(expression)
    value = program.eval(data=data)
    assert value.type() == cel.cel.Type.BOOL, (expression, value)
    return bool(value.value())


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


def _routes(configs: list[dict[str, Any]], resource: str, operation: str) -> bool:
    return any(
        resource in rule["resources"] and operation in rule["operations"]
        for config in configs
        for hook in config["webhooks"]
        for rule in hook["rules"]
    )
