"""The shipped policies and who asks them: the requesters (``CORE``, ``ALICE``, the
kube-controller-manager's ``JOBS``, ``RS``, ``DEPLOYMENTS``, the Core's ``ARGO``), a run Pod
(``pod``), and the engine called as the webhooks call it (``created``, ``update``, ``rules``)."""

from __future__ import annotations

from typing import Any

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import load_policy

from .cluster_state import State
from .inputs import REPO

SHIPPED = load_policy(REPO / "policies")

CORE = Requester("system:serviceaccount:digitalhub:core", ("system:serviceaccounts",))

CORE_RECORDS = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}

ALICE = Requester("alice", ("developers", "system:authenticated"))

KCM = "system:serviceaccount:kube-system:"

JOBS = Requester(f"{KCM}job-controller")

RS = Requester(f"{KCM}replicaset-controller")

DEPLOYMENTS = Requester(f"{KCM}deployment-controller")

RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}

BUILD = {**RUN, "dhcore/framework": "k8sbuild"}


def pod(labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    """A run reading its own claim and secret (platform names for run r1)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "labels": dict(RUN if labels is None
                                                                        else labels), **meta},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "envFrom": [{"secretRef": {"name": "sec-api-r1"}}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "v-r1-data"}}],
        },
    }  # fmt: skip


def created(obj: dict[str, Any], who: Requester, state: State | None = None) -> dict[str, Any]:
    """The object as the apiserver stores it: mutated, then admitted, at CREATE."""
    decision = evaluate(obj, SHIPPED, namespace="ml", context=Context(who, state or State([])))
    assert decision.allowed, decision.message()
    return decision.object


def update(new: Any, old: Any, who: Requester, state: State | None = None,
           subresource: str = "") -> tuple[Any, Any]:  # fmt: skip
    """(the mutating webhook's decision, the validating one's on what it patched)."""
    context = Context(who, state or State([]), "UPDATE", subresource)
    mutation = mutate(new, SHIPPED, namespace="ml", old=old, context=context)
    validation = validate(mutation.object, SHIPPED, namespace="ml", old=old, context=context)
    return mutation, validation


def rules(decision: Any) -> set[str]:
    assert decision.error is None, decision.message()
    return {v.rule for v in decision.violations}


ARGO = Requester("system:serviceaccount:digitalhub:argo-workflow-controller")


def workflow(uid: str) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": "pipeline", "namespace": "ml", "uid": uid},
            "spec": {"entrypoint": "main"}}  # fmt: skip
