"""Attacks on the platform's and the operators' ServiceAccounts and their tokens
(``ownership.service-account``, the installers' records, ``serviceaccounts/token``): a
user's Pod or Workflow running as an operator's account, an operator's Deployment
changed, recorded or adopted, a debug container for an operator's token, a token Secret
or a TokenRequest for a platform account.

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces; the
installers are ``platform.installers`` (the chart, cluster admins by default). An attack
that is stopped is a plain test (it guards the property); one that gets through is
``xfail(strict=True)`` with the chain, why it matters and the fix proposed (strict: an
xfail that starts passing fails the run until its mark is removed).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.attack_chains import (
    AUTH,
    DH_NS,
    DIGITALHUB,
    ML_NS,
    MLRUN,
    MLRUN_API,
    MPI,
    _holds,
    _hook,
    _role_binding,
    _routes,
    _status_routed,
    env_names,
    fixture,
    judged_by,
    owned_by,
    platform_run,
    state,
    step_pod,
    stored,
    update,
)
from harness.cluster_state import State
from harness.routing import Cel
from harness.shells import Cluster, answer, as_pod, connect_request, token_of
from harness.shipped import ALICE, ARGO, DEPLOYMENTS, KCM, RS, SHIPPED, rules

from webhook.audit.rbacreport import platform_of, rbac_report
from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.model import Policy
from webhook.serving import shells

# --- the operators' accounts ------------------------------------------------------------


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
    return Policy.of(run.model_copy(update={"enforcement": "Deny"}))


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
    docs/policy-reference.md says Warn turns denials into warnings, so the engine is per spec, the
    shipped example is not safe as shipped.

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


# --- the installed operators and the platform's own Deployment --------------------------


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


def test_the_deployment_controller_can_record_a_rollout_of_an_installed_operator() -> None:
    """docs/dev/guarantees.md, "Trust over time": "controllers keep working". The
    deployment-controller records a rollout's revision (``deployment.kubernetes.io/revision``) on
    the Deployment through ``deployments/status``. For KubeRay's operator Deployment, created by the
    chart and recorded "installer", that status update changes an annotation, so the status
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


# --- tokens -----------------------------------------------------------------------------


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


def test_a_token_secret_for_the_platforms_account_in_a_run_namespace() -> None:
    """Chain (MLRun: its API's ServiceAccount ``mlrun-api`` lives in ``mlrun``, which its
    RunPolicies govern: MLRun's jobs run there). Alice, with ``create secrets`` and
    ``create pods`` in ``mlrun`` (no Secret read, no token, no impersonation: nothing
    ``runguard audit --rbac`` reports; ``tests/audit/test_rbacreport.py`` even counts
    ``create secrets`` as harmless), creates a Secret of type
    ``kubernetes.io/service-account-token`` with the annotation
    ``kubernetes.io/service-account.name: mlrun-api``: the token controller writes the
    platform's token into it. She mounts her own Secret in a Pod outside every
    selector (not a platform name: allowed) and calls the apiserver as MLRun's API:
    every run she creates is the platform's. The Secret's CREATE is an admission
    request runguard could judge but does not route (reserved names only), and the
    report does not show the verb. Gap: ``webhook/engine/rules/ownership.py`` (no rule
    for such a Secret) and ``webhook/audit/rbacreport.py`` ``DOORS`` (``rbac.token`` lists
    ``serviceaccounts/token`` only). Fix: refuse, at CREATE and UPDATE of a Secret, type
    ``kubernetes.io/service-account-token`` naming a platform or operator
    ServiceAccount (``ownership.service_account_identities``) to anyone but the
    platform (route Secrets of that type); and report ``create secrets`` in a namespace
    holding such a ServiceAccount as ``rbac.token``."""
    token_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "my-token", "namespace": "mlrun",
                     "annotations": {"kubernetes.io/service-account.name": "mlrun-api"}},
    }  # fmt: skip
    assert ("mlrun", "mlrun-api") in {
        sa for p in MLRUN.run_policies for sa in _accounts(p)
    }  # the platform's own account, in a namespace its RunPolicies govern
    refused = not judged_by(token_secret, ALICE, MLRUN, "mlrun").allowed
    objects = _role_binding("mlrun", [{"apiGroups": [""], "resources": ["secrets", "pods"],
                                       "verbs": ["create"]}])  # fmt: skip
    report = rbac_report(objects, platform_of(MLRUN), shells=True)
    shown = any(str(f.subject) == "User alice" for f in report.unexpected())
    assert refused or shown


def _accounts(policy: Any) -> frozenset[tuple[str, str]]:
    from webhook.engine.rules.ownership import service_account_identities

    return service_account_identities(policy)


def _token_request(who: Requester, pod_name: str, pod_uid: str, account: str) -> dict[str, Any]:
    return {
        "uid": "t-1", "operation": "CREATE",
        "kind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"},
        "resource": {"group": "", "version": "v1", "resource": "serviceaccounts"},
        "subResource": "token", "namespace": "ml", "name": account,
        "object": {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [], "boundObjectRef": {
                       "kind": "Pod", "apiVersion": "v1", "name": pod_name, "uid": pod_uid}}},
        "userInfo": {"username": who.username, "groups": list(who.groups)},
    }  # fmt: skip


def test_a_token_she_mints_bound_to_the_launcher_opens_a_shell_in_the_workers() -> None:
    """Chain: the ``edit`` ClusterRole grants ``create serviceaccounts/token`` in her
    namespace. mpi-operator v1 gives the launcher's account (``<job>-launcher``) a Role
    with ``create pods/exec`` on the workers. She runs ``kubectl create token
    train-launcher --bound-object-kind Pod --bound-object-name train-launcher
    --bound-object-uid <uid>`` (the account the launcher runs as, as TokenRequest
    requires), then ``kubectl --token=$T exec train -- sh``. The apiserver puts the
    launcher's name and uid in ``userInfo.extra`` exactly as for the kubelet's token, so
    ``shells._opener`` (webhook/serving/shells.py) finds "the platform's own Pod" and the shell
    into the platform's worker opens. Any account with ``pods/exec`` that runs a platform
    Pod (a notebook's ``default-editor``...) gives the same. Fix: refuse at CREATE of
    ``serviceaccounts/token`` a TokenRequest bound to a platform Pod unless the requester
    is the platform or the node it runs on (``system:node:<spec.nodeName>``); CONNECT
    cannot tell the two tokens apart."""
    worker = as_pod(platform_run(), "train")
    launcher = as_pod(platform_run(), "train-launcher")
    minted = _token_request(ALICE, "train-launcher", "pod-uid-1", "launcher")
    configs = [*manifests.webhook_configurations(SHIPPED),
               manifests.shells_webhook_configuration(SHIPPED)]  # fmt: skip
    assert shells.shell_of(minted) == "token"
    token_refused = _routes(configs, "serviceaccounts/token", "CREATE") and (
        shells.review(minted, SHIPPED, None, Cluster(worker, launcher)).response["response"][
            "allowed"
        ]
        is False
    )
    shell_opened = answer(
        {**connect_request(ALICE), "userInfo": token_of(launcher)}, Cluster(worker, launcher)
    )["allowed"]
    assert token_refused or not shell_opened
