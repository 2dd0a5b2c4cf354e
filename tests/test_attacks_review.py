"""Attack chains against SPEC section 8 that still get through (security review).

Each test is a chain a security review found getting through, kept as a regression test
now that runguard stops it (the docstring says the chain and the fix). The
attacker is ``alice``, a user with kubectl create/update/patch rights in the run
namespace; the platform is the Core (``system:serviceaccount:digitalhub:core``). Judged by
the engine as the webhooks judge it (``tests/test_trust.py``'s helpers); where routing
matters, the rendered matchConditions are evaluated with ``test_manifests.Cel``.
"""

from __future__ import annotations

import copy
from typing import Any

from test_manifests import Cel
from test_ownership import Meta, State, owner
from test_trust import (
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

from webhook.engine import evaluate
from webhook.engine.context import Context, Requester
from webhook.install.manifests import (
    mutating_webhook_configuration,
    validating_webhook_configuration,
)
from webhook.keys import POLICY_LABEL

CRONJOBS = Requester("system:serviceaccount:kube-system:cronjob-controller")


def _controller_ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def _meta(kind: str, obj: dict[str, Any], uid: str) -> Meta:
    m = obj["metadata"]
    return Meta(kind, "ml", m["name"], uid, m.get("labels") or {}, m.get("annotations") or {})


# --- 1. content of the platform's objects rewritten by a user ------------------------------


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

    Why it matters: SPEC section 8, "no later change grants it": alice gains the
    platform's common credentials (stripped from any run of her own) by editing an object
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


# --- 2. a platform claim cloned by a door runguard never sees --------------------------------


def test_a_platform_claim_cannot_be_cloned_by_a_claim_or_a_claim_template() -> None:
    """Chain (a): alice creates PVC ``copy`` with ``dataSource: {kind:
    PersistentVolumeClaim, name: v-r1-data}`` (a CSI clone of the run's data), then a
    plain Pod (outside every selector) mounting ``copy``. No webhook routes the PVC (its
    name is not reserved) nor the Pod (it names no platform object); the engine judges
    neither. Chain (b): the same clone as a StatefulSet ``volumeClaimTemplates`` entry of
    a non-run StatefulSet: the controllers' matchCondition reads only the template, the
    statefulset-controller creates the clone.

    Why it matters: the engine denies exactly this clone through an ephemeral volume
    (``test_a_platform_claim_cloned_by_an_ephemeral_volume_is_denied``) and through a run's
    claim templates (SPEC section 6); a plain PVC is the same door, open.

    Fix: route PVC CREATE whose ``dataSource``/``dataSourceRef`` names a platform claim
    (and VolumeSnapshots of one), and pod controllers whose ``volumeClaimTemplates`` do;
    judge them as ``ownership.not-a-run`` unless the platform creates them (the DOORS
    table should include claim specs and ``volumeClaimTemplates.*.spec.dataSource*``)."""
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "copy", "namespace": "ml"},
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "1Gi"}},
                      "dataSource": {"kind": "PersistentVolumeClaim",
                                     "name": "v-r1-data"}}}  # fmt: skip
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "s", "namespace": "ml"},
           "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "s",
                    "template": {"metadata": {"labels": {"app": "x"}},
                                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                    "volumeClaimTemplates": [{"metadata": {"name": "d"},
                                              "spec": copy.deepcopy(claim["spec"])}]}}  # fmt: skip
    cel = Cel()
    hooks = [
        *validating_webhook_configuration(SHIPPED)["webhooks"],
        *mutating_webhook_configuration(SHIPPED)["webhooks"],
    ]
    routed = []
    for resource, obj in (("persistentvolumeclaims", claim), ("statefulsets", sts)):
        for hook in hooks:
            if any(resource in r["resources"] for r in hook["rules"]) and (
                "matchConditions" not in hook or cel.routed(hook, obj, resource)
            ):
                routed.append(resource)
    allowed = [
        obj["kind"]
        for obj in (claim, sts)
        if evaluate(obj, SHIPPED, namespace="ml", context=Context(ALICE, State([]))).allowed
    ]
    assert {"persistentvolumeclaims", "statefulsets"} <= set(routed) and not allowed


# --- 3. a debug container into a platform run holding a project-shared volume ----------------


def test_a_debug_container_cannot_reach_a_project_shared_volume_of_a_platform_run() -> None:
    """Chain: the Core's run mounts ``shared-data``, a claim with no platform name that
    carries the run's ``dhcore/project`` (a project-shared volume: usable only by that
    project's platform runs; alice's own run has it stripped). alice ``kubectl debug``s
    the run with a container mounting ``data``: ``ownership.debug`` only looks for
    platform-*named* references, so it is allowed and she reads the project's volume.

    Fix: ``ownership.debug`` applies to any Pod recorded as the platform's (its record,
    not its references), or at least counts project-shared claims and the platform's
    ServiceAccount as holdings."""
    state = State([Meta("PersistentVolumeClaim", "ml", "shared-data", "uid-pvc",
                        {"dhcore/project": "p1"})])  # fmt: skip
    spec = pod()["spec"]
    spec["containers"][0].pop("envFrom")
    spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared-data"}}]
    run = created({**pod(), "spec": spec}, CORE, state)
    assert run["spec"]["volumes"]  # the platform's run keeps it
    mine = evaluate({**pod(), "spec": spec}, SHIPPED, namespace="ml",
                    context=Context(ALICE, state))  # fmt: skip
    assert not mine.object["spec"].get("volumes")  # alice's own run does not
    debugged = copy.deepcopy(run)
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "image": "busybox", "command": ["sh"],
         "volumeMounts": [{"name": "data", "mountPath": "/d"}]}
    ]  # fmt: skip
    _, validation = update(debugged, run, ALICE, state, subresource="ephemeralcontainers")
    assert "ownership.debug" in rules(validation)


# --- 4. objects from before the policy label: requesters ignored ---------------------------


def test_an_object_from_before_the_policy_label_is_not_governed_by_a_lax_policy() -> None:
    """Chain: alice's Pod with the build labels, created before ``runguard.io/policy``
    existed (stamp ``alice``, no policy label; then judged by ``digitalhub``). After the
    upgrade, ``_governing`` on UPDATE chooses by the old labels with ``lambda _p: True``,
    skipping ``requesters``: ``builds`` governs it, and alice adds a root debug container
    (``kubectl debug --profile=sysadmin``-style, ``runAsUser: 0``), allowed by builds'
    ``onRoot: Allow``. The same Pod with the label is denied (``security.root``).

    Fix: for an object without a recorded policy, choose with ``requesters`` applied to
    its stamp/record (the platform record, or the stamp as a user name), never ``True``."""
    build = pod(labels=BUILD)
    build["spec"] = {"containers": [{"name": "c", "image": "busybox"}]}
    old = created(build, ALICE)
    del old["metadata"]["labels"][POLICY_LABEL]  # as stored before the label existed
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "image": "busybox", "securityContext": {"runAsUser": 0}}
    ]
    _, validation = update(new, old, ALICE, subresource="ephemeralcontainers")
    assert not validation.allowed


# --- 5. runguard's own rewriting breaks a controller -------------------------------------------


def test_a_template_carrying_the_policy_label_is_refused_not_relabelled() -> None:
    """Chain: alice creates a ReplicaSet (or Deployment) whose selector and template
    labels include ``runguard.io/policy: builds`` (or, outside every selector,
    ``runguard.io/policy: digitalhub``). Both are allowed; each Pod the
    replicaset-controller creates is relabelled by ``/mutate`` (``digitalhub``, resp. the
    label removed), so it no longer matches the ReplicaSet's selector: the controller
    releases it (an orphan that keeps running, not deleted with the ReplicaSet) and
    creates another, forever, up to the namespace's quota.

    Why it matters: SPEC section 8, "controllers keep working"; an unbounded,
    self-sustaining Pod flood (and orphans outside any owner) from one object.

    Fix: ``/validate`` denies (``scope.labels``) a pod controller whose selector or
    template labels carry ``runguard.io/policy`` with a value other than the one its
    Pods will get (simplest: the key at all); or ``/mutate`` writes the governing value
    into the template too, at the controller's CREATE."""
    labels = {**RUN, POLICY_LABEL: "builds"}
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "bomb", "namespace": "ml"},
          "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                   "template": {"metadata": {"labels": labels},
                                "spec": {"containers": [{"name": "c",
                                                         "image": "busybox"}]}}}}  # fmt: skip
    decision = evaluate(rs, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    stored = decision.object
    state = State([_meta("ReplicaSet", stored, "uid-bomb")])
    child = pod(labels=labels, ownerReferences=[_controller_ref("ReplicaSet", "bomb", "uid-bomb")])
    child["spec"] = copy.deepcopy(rs["spec"]["template"]["spec"])
    child_labels = created(child, RS, state)["metadata"]["labels"]
    selector = stored["spec"]["selector"]["matchLabels"]
    matches = all(child_labels.get(k) == v for k, v in selector.items())
    assert not decision.allowed or matches


def test_the_platforms_own_deployment_can_be_installed() -> None:
    """Not an attack, a break of the platform: the chart (an installer, ``system:masters``)
    creates the Core's Deployment in ``digitalhub`` running as ServiceAccount ``core``, a
    platform identity. The controllers' matchCondition routes it (``runs_as``), and
    ``ownership.service-account`` denies it: ``platform.installers`` is not consulted,
    and even a Deployment the Core creates is not stamped (``_stamps_owner`` ignores
    ServiceAccounts: ``platform_references`` reads only claims, configMaps and secrets),
    so its ReplicaSet would be denied next. ``helm install/upgrade`` of DigitalHub fails
    with runguard active.

    Fix: installers may create objects running as the platform's accounts (as they may
    create installation-wide names), and the ServiceAccount door counts in
    ``_stamps_owner`` so that the chain through the deployment-controller is recorded."""
    admin = Requester("kubernetes-admin", ("system:masters", "system:authenticated"))
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "core", "namespace": "digitalhub"},
                  "spec": {"selector": {"matchLabels": {"app": "core"}},
                           "template": {"metadata": {"labels": {"app": "core"}},
                                        "spec": {"serviceAccountName": "core",
                                                 "containers": [{"name": "core",
                                                                 "image": "core"}]}}}}  # fmt: skip
    decision = evaluate(deployment, SHIPPED, namespace="digitalhub",
                        context=Context(admin, State([])))  # fmt: skip
    assert decision.allowed, decision.message()
