"""Attacks on the platform's records (``rules/ownership.py``, ``rules/trust.py``): a user
rewriting what a platform object runs after its CREATE (a Pod's image, a Deployment's or
a build CronJob's template), and a record forged onto a controller of hers by an update.

The attacker is ``alice``, a user with kubectl create/update/patch rights in the run
namespace; the platform is the Core (``system:serviceaccount:digitalhub:core``). Judged
by the engine as the webhooks judge it (``harness.shipped``'s helpers); where
routing matters, the rendered matchConditions are evaluated with ``harness.routing.Cel``.
Each test keeps the chain and the fix made.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.attack_chains import _controller_ref, _meta, routed
from harness.cluster_state import State, owner
from harness.routing import RESOURCES
from harness.shipped import (
    ALICE,
    BUILD,
    CORE,
    DEPLOYMENTS,
    JOBS,
    RS,
    RUN,
    SHIPPED,
    created,
    pod,
    rules,
    update,
)

from webhook.engine import mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY

CRONJOBS = Requester("system:serviceaccount:kube-system:cronjob-controller")


# --- what a platform object runs, rewritten by a user -----------------------------------


def test_a_user_cannot_swap_the_image_of_a_platform_pod() -> None:
    """Chain: the Core creates run Pod ``train`` (record ``runguard.io/platform: true``,
    ``envFrom: sec-api-r1``, claim ``v-r1-data``); alice runs ``kubectl set image
    pod/train main=evil`` (``spec.containers[*].image`` is mutable on a Pod). The kubelet
    restarts the container with her image, which now reads the run's secret and volume.

    Why it matters: the same result ``ownership.debug`` forbids for an ephemeral
    container (a shell in a platform Pod, with its secrets), through another door; alice
    could never mount ``sec-api-r1`` in a Pod of her own.

    Fix: on UPDATE of an object whose record is the platform's, any change to its pod
    spec (containers' and init containers' ``image``; for controllers, the template) by a
    requester that is neither a platform identity nor a platform controller of its kind
    is denied (e.g. ``ownership.platform-object``); equivalently, the ownership used on
    UPDATE is the old record AND the updater's own right."""
    run = created(pod(), CORE)
    hijacked = copy.deepcopy(run)
    hijacked["spec"]["containers"][0]["image"] = "evil.example/steal:latest"
    _, validation = update(hijacked, run, ALICE)
    assert not validation.allowed


def test_a_users_edit_of_a_platform_deployment_grants_nothing() -> None:
    """Chain: the Core creates Deployment ``serve`` (record platform); alice edits its
    template (image ``evil``, ``envFrom: digitalhub-common-creds``) -- allowed, since
    ``ownership_of`` on UPDATE reads only the old record. The deployment-controller
    creates a new ReplicaSet, recorded platform through the Deployment by uid; the
    replicaset-controller's Pod is recorded platform and keeps the platform-wide secret,
    running alice's image.

    Why it matters: docs/dev/guarantees.md, "Trust over time": "no later change grants it": alice
    gains the platform's common credentials (stripped from any run of her own) by editing an object
    after its CREATE. Same for StatefulSets, DaemonSets, ReplicaSets and CronJobs (whose
    templates are mutable).

    Fix: as for Pods, a template change of a platform-recorded controller by anyone but a
    platform identity is denied (scale, annotations, finalizers stay open)."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "serve", "namespace": "ml"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": RUN},
                           "template": {"metadata": {"labels": RUN},
                                        "spec": pod()["spec"]}}}  # fmt: skip
    dep = created(deployment, CORE)
    edited = copy.deepcopy(dep)
    container = edited["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "evil.example/steal"
    container["envFrom"].append({"secretRef": {"name": "digitalhub-common-creds"}})
    mutation, validation = update(edited, dep, ALICE)
    state = State([_meta("Deployment", mutation.object, "uid-dep")])
    rs = copy.deepcopy(edited)
    rs["kind"] = "ReplicaSet"
    rs["metadata"] = {
        "name": "serve-2",
        "namespace": "ml",
        "labels": dict(RUN),
        "annotations": dict(mutation.object["metadata"]["annotations"]),
        "ownerReferences": [_controller_ref("Deployment", "serve", "uid-dep")],
    }
    rs = created(rs, DEPLOYMENTS, state)
    state.objects.append(_meta("ReplicaSet", rs, "uid-rs"))
    child = pod(ownerReferences=[_controller_ref("ReplicaSet", "serve-2", "uid-rs")])
    child["spec"] = copy.deepcopy(rs["spec"]["template"]["spec"])
    stored = created(child, RS, state)
    gained = {"secretRef": {"name": "digitalhub-common-creds"}} in stored["spec"]["containers"][0][
        "envFrom"
    ]
    assert not validation.allowed or not gained


def test_a_users_edit_of_a_platform_build_cronjob_grants_nothing() -> None:
    """Chain: the Core creates a build CronJob (policy ``builds``: baseline, root allowed,
    ``registry-credentials``). alice edits its job template: image ``evil``,
    ``runAsUser: 0``, her own command. The cronjob-controller's Job follows the CronJob to
    ``builds`` (owner label by uid), the job-controller's Pod too: alice's code runs as
    root with the registry's push credentials (supply-chain: she can push any image the
    platform later pulls).

    Why it matters: ``requesters`` says the lax policy is the Core's alone; the
    CronJob's recorded policy is reused for content the Core never wrote.

    Fix: deny template changes of a platform-recorded (or ``requesters``-governed)
    controller by anyone but a platform identity; at least, a policy with ``requesters``
    must also require the *updater* to be one of them."""
    spec = pod()["spec"]
    spec["containers"][0]["envFrom"] = [{"secretRef": {"name": "registry-credentials"}}]
    cron = {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "build", "namespace": "ml"},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": {
                "metadata": {"labels": BUILD}, "spec": spec}}}}}  # fmt: skip
    stored = created(cron, CORE)
    assert stored["metadata"]["labels"][POLICY_LABEL] == "builds"
    edited = copy.deepcopy(stored)
    container = edited["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    container.update(image="evil.example/push", command=["sh", "-c", "id; cat /root/.docker/*"])
    container["securityContext"] = {"runAsUser": 0}
    mutation, validation = update(edited, stored, ALICE)
    state = State([_meta("CronJob", mutation.object, "uid-cj")])
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "build-1", "namespace": "ml", "labels": dict(BUILD),
                        "ownerReferences": [owner("CronJob", "build", "uid-cj")]},
           "spec": copy.deepcopy(edited["spec"]["jobTemplate"]["spec"])}  # fmt: skip
    job = created(job, CRONJOBS, state)
    state.objects.append(_meta("Job", job, "uid-job"))
    child = pod(labels=BUILD, ownerReferences=[owner("Job", "build-1", "uid-job")])
    child["spec"] = copy.deepcopy(job["spec"]["template"]["spec"])
    built = created(child, JOBS, state)
    as_root = (
        built["metadata"]["labels"][POLICY_LABEL] == "builds"
        and built["spec"]["containers"][0]["securityContext"].get("runAsUser") == 0
    )
    assert not validation.allowed or not as_root


# --- a record forged by an update -------------------------------------------------------


@pytest.mark.parametrize("kind", ["ReplicaSet", "StatefulSet", "DaemonSet",
                                  "ReplicationController"])  # fmt: skip
@pytest.mark.parametrize("forged", [{PLATFORM_RECORD: "true"},
                                    {REQUESTED_BY: "system:serviceaccount:digitalhub:core"}],
                         ids=["record", "legacy-stamp"])  # fmt: skip
def test_a_record_forged_on_a_controller_by_update_is_removed(
    kind: str, forged: dict[str, str]
) -> None:
    """Her own controller (outside every selector, no records) updated with the
    platform's record, or only a platform stamp (read as the platform's for an object
    from before records): its controller's Pods would be the platform's. Routed, the
    record removed by ``/mutate``, and refused when ``/mutate`` was skipped."""
    api = "v1" if kind == "ReplicationController" else "apps/v1"
    selector: dict[str, Any] = {"app": "x"}
    spec = {"selector": selector if kind == "ReplicationController" else {"matchLabels": selector},
            "template": {"metadata": {"labels": {"app": "x"}},
                         "spec": {"containers": [{"name": "m", "image": "i"}]}}}  # fmt: skip
    old: dict[str, Any] = {"apiVersion": api, "kind": kind,
                           "metadata": {"name": "r", "namespace": "ml"}, "spec": spec}  # fmt: skip
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = dict(forged)
    group = "" if kind == "ReplicationController" else "apps"
    resources = {**RESOURCES, kind: (group, f"{kind.lower()}s")}
    assert _routed_with(resources, new, old)
    context = Context(ALICE, State([]), "UPDATE")
    mutation = mutate(new, SHIPPED, namespace="ml", old=old, context=context)
    assert not set(forged) & set(mutation.object["metadata"].get("annotations") or {})
    bypassed = validate(new, SHIPPED, namespace="ml", old=old, context=context)
    assert not bypassed.allowed and "ownership.stamp" in rules(bypassed)


def _routed_with(resources: dict[str, tuple[str, str]], new: Any, old: Any) -> bool:
    saved = dict(RESOURCES)
    RESOURCES.update(resources)
    try:
        return len(routed(new, old, "UPDATE")) == 2
    finally:
        RESOURCES.clear()
        RESOURCES.update(saved)
