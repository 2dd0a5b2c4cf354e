"""Attacks on the shells' judgment (``kubectl exec`` / ``attach`` into a platform Pod,
``webhook/serving/shells.py``, ``engine.connect``, ``rules/trust.check_shell``).

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces: it
grants ``create`` on ``pods/exec``, ``pods/attach``, ``pods/portforward``, ``pods/proxy``,
``services/proxy``, ``serviceaccounts/token`` and ``impersonate`` on serviceaccounts,
nothing on ``userextras``. Each test guards the property: the last five got through, or
refused a legitimate shell, when this file was written; their docstrings keep the chain
and the fix made.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from test_ownership import Meta, State
from test_shells import (
    Cluster,
    Reads,
    answer,
    as_pod,
    connect_request,
    shell,
    token_of,
    users_own_pod,
)
from test_trust import ALICE, ARGO, CORE, SHIPPED, created, pod, rules, update, workflow

from webhook.engine import connect, evaluate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import with_alternatives
from webhook.serving import admission, shells
from webhook.serving.shells import PodLookup, PodReader

REPO = Path(__file__).resolve().parents[1]
MLRUN = load_policy(REPO / "policies" / "examples" / "mlrun")


def platform_run() -> dict[str, Any]:
    return created(pod(), CORE)


# --- stopped ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "who",
    [
        Requester("serviceaccount:digitalhub:core", ("system:authenticated",)),  # no system:
        Requester("core", ("system:authenticated",)),
        Requester("group:system:serviceaccounts", ("system:authenticated",)),
        Requester("alice", ("system:serviceaccount:digitalhub:core", "system:serviceaccounts")),
        Requester("system:serviceaccount:ml:core", ("system:serviceaccounts",)),  # her "core"
    ],
)
def test_identity_strings_typed_like_the_platform_are_not_it(who: Requester) -> None:
    reads = Reads(PodLookup(platform_run()))
    denied = answer(connect_request(who), reads)
    assert reads.asked == [("ml", "train")]
    assert denied["allowed"] is False and "[ownership.debug]" in denied["status"]["message"]


def _odd(**change: Any) -> dict[str, Any]:
    request = connect_request(ALICE)
    for key, value in change.items():
        if value is None:
            request.pop(key, None)
        else:
            request[key] = value
    return request


@pytest.mark.parametrize(
    "request_",
    [
        _odd(userInfo=None),  # no user: not the platform
        _odd(userInfo={"username": "", "groups": []}),
        _odd(userInfo={"username": ["system:serviceaccount:digitalhub:core"]}),
        _odd(name=None),
        _odd(namespace=None),
        _odd(requestResource={"group": "", "version": "v1", "resource": "pods"},
             requestSubResource="exec", requestKind={"group": "", "version": "v1",
                                                     "kind": "PodExecOptions"}),
        _odd(object={"kind": "PodExecOptions", "command": ["tar", "cf", "-", "/data"]}),  # cp
        _odd(object=None, kind=None),
        _odd(dryRun=True),
    ],
)  # fmt: skip
def test_odd_connect_reviews_never_open_a_platform_pod(request_: dict[str, Any]) -> None:
    assert shells.shell_of(request_) == "exec"
    outcome = shells.review(request_, SHIPPED, None, Reads(PodLookup(platform_run())))
    assert outcome.response["response"]["allowed"] is False


def test_a_read_that_raises_or_a_pod_of_odd_shape_is_denied_not_crashed() -> None:
    def boom(namespace: str, name: str) -> PodLookup:
        raise RuntimeError("apiserver exploded")

    outcome = shells.review(connect_request(ALICE), SHIPPED, None, boom)
    assert outcome.response["response"]["allowed"] is False
    assert isinstance(outcome.error, RuntimeError)
    assert "exploded" not in str(outcome.response)  # the reason is logged, not sent
    odd = {"kind": "Pod", "metadata": ["x"], "spec": {"containers": "x", "volumes": [1, None]}}
    decision = shell(ALICE, odd)
    assert decision.error is None
    huge = platform_run()
    huge["metadata"]["annotations"].update({f"k{i}": "v" * 1000 for i in range(1000)})
    assert rules(shell(ALICE, huge)) == {"ownership.debug"}


def test_an_operators_own_pod_is_judged_by_its_account() -> None:
    """KubeRay's operator Pod, installed by the chart (record "installer"), running as an
    operator account: a shell there is its token."""
    op: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"name": "kuberay-operator-1", "namespace": "digitalhub",
                       "annotations": {PLATFORM_RECORD: "installer"}},
          "spec": {"serviceAccountName": "kuberay-operator",
                   "containers": [{"name": "op", "image": "kuberay"}]}}  # fmt: skip
    assert rules(shell(ALICE, op, namespace="digitalhub")) == {"ownership.debug"}
    assert rules(shell(ALICE, op, "attach", namespace="digitalhub")) == {"ownership.debug"}


def test_stripping_a_platform_pods_record_first_is_refused() -> None:
    """The judgment reads the Pod's record: she cannot remove it before the shell (the
    mutating webhook puts it back, the validating one refuses it gone)."""
    run = platform_run()
    stripped = copy.deepcopy(run)
    del stripped["metadata"]["annotations"][PLATFORM_RECORD]
    stripped["metadata"]["annotations"][REQUESTED_BY] = "alice"
    mutation, _ = update(stripped, run, ALICE)
    assert mutation.object["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    context = Context(ALICE, State([]), "UPDATE")
    unpatched = validate(stripped, SHIPPED, namespace="ml", old=run, context=context)
    assert not unpatched.allowed and "ownership.stamp" in rules(unpatched)


def test_the_platform_still_opens_shells_everywhere_without_a_read() -> None:
    for how in ("exec", "attach"):
        reads = Reads(PodLookup(None, "must not be asked"))
        assert answer(connect_request(CORE, how), reads)["allowed"] is True
        assert reads.asked == []


def test_a_failed_read_does_not_send_the_token_to_the_user(tmp_path: Path) -> None:
    """PodReader's error goes into the denial the user reads: never the credentials."""
    secret = "s3cr3t-bearer-token-do-not-leak"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        f"users: [{{name: u, user: {{token: {secret}}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n",
        encoding="utf-8",
    )
    found = PodReader(str(kubeconfig), timeout=1.0).read("ml", "train")
    assert found.pod is None and found.error
    assert secret not in found.error
    denied = answer(connect_request(ALICE), lambda ns, name: found)
    assert denied["allowed"] is False and secret not in denied["status"]["message"]


# --- got through or were wrongly refused, until mended (docstrings: the chain, the fix) ---


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


def _routes(configs: list[dict[str, Any]], resource: str, operation: str) -> bool:
    return any(
        resource in rule["resources"] and operation in rule["operations"]
        for config in configs
        for hook in config["webhooks"]
        for rule in hook["rules"]
    )


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


@pytest.mark.parametrize("subresource", ["portforward", "proxy"])
def test_the_network_door_into_a_platform_ray_head_runs_code_there(subresource: str) -> None:
    """Chain: the Core's RayJob makes a RayCluster whose head Pod is the platform's (record
    "true", its secrets). ``kubectl port-forward pod/<head> 8265`` (CONNECT pods/
    portforward, into the Pod's network namespace: NetworkPolicies do not apply), or
    POST through ``/api/v1/namespaces/ml/pods/<head>:8265/proxy/api/jobs/`` (CONNECT
    pods/proxy), reaches Ray's unauthenticated job API: ``ray job submit -- python -c
    ...`` runs her code as the job driver in the head Pod, with its env, secrets and
    claims: a shell by a third door. shells.shell_of (webhook/serving/shells.py) and the rules of
    runguard-shells (webhook/install/manifests.py SHELL_SUBRESOURCES) cover exec and attach only.
    Fix: route CONNECT of pods/portforward and pods/proxy too and judge them as shells
    (ownership.debug), or document that RBAC must withhold them in run namespaces."""
    request = connect_request(ALICE, subresource, name="raycluster-head")
    routed = _routes(
        [manifests.shells_webhook_configuration(SHIPPED)], f"pods/{subresource}", "CONNECT"
    )
    head = Reads(PodLookup(platform_run()))
    outcome = (
        shells.review(request, SHIPPED, None, head)
        if shells.shell_of(request)
        else admission.review("validate", request, SHIPPED, None)
    )
    assert routed and outcome.response["response"]["allowed"] is False


def test_a_namespace_only_the_first_run_policy_excludes_is_still_judged() -> None:
    """Chain: two RunPolicies (the shipped ``builds`` first, ``digitalhub``); ``builds``
    also excludes ``team-a``, where ``digitalhub`` governs the Core's runs (its own Pod
    webhook, per RunPolicy, judges and records them there). runguard-shells takes its
    namespaceSelector from the root policy only (``_Target.webhook`` ->
    ``namespace_selector(self.policy)``, webhook/install/manifests.py, before it took what every
    RunPolicy excludes), so CONNECT in ``team-a``
    never reaches runguard: exec into the Core's run there opens unjudged. Fix: exclude
    only the namespaces every ownership-enabled RunPolicy excludes (the same holds for
    the references and controllers webhooks)."""
    builds, digitalhub = SHIPPED.run_policies()
    assert builds.name == "builds"
    excluded = builds.exclude_namespaces | {"team-a"}
    policy = with_alternatives(
        [builds.model_copy(update={"exclude_namespaces": excluded, "alternatives": ()}),
         digitalhub]
    )  # fmt: skip
    pod_hooks = [
        h for h in manifests.validating_webhook_configuration(policy)["webhooks"]
        if h["name"] == "validate-digitalhub.runguard.io"
    ]  # fmt: skip
    assert pod_hooks and all(
        "team-a" not in e["values"]
        for h in pod_hooks
        for e in h["namespaceSelector"]["matchExpressions"]
    )  # fmt: skip: the Core's runs in team-a are judged and recorded
    hooks = manifests.shells_webhook_configuration(policy)["webhooks"]
    assert len(hooks) == 2  # the doors, and tokens bound to a Pod
    shared = [  # the controllers', references' and reserved names' webhooks too
        h
        for config in manifests.webhook_configurations(policy)
        for h in config["webhooks"]
        if "objectSelector" not in h
    ]
    assert len(shared) >= 4
    for hook in [*hooks, *shared]:
        values = {v for e in hook["namespaceSelector"]["matchExpressions"] for v in e["values"]}
        assert "team-a" not in values and "runguard" in values


def test_argo_signals_the_step_pods_of_the_cores_workflow() -> None:
    """False refusal. Argo's workflow-controller stops a step (``argo stop``/
    ``terminate``, ``activeDeadlineSeconds``, sidecars left running) by exec'ing
    ``kill`` into the step Pod's containers (``workflow/signal.SignalContainer``, its
    ClusterRole grants ``pods/exec``). The step Pod of the Core's Workflow is the
    platform's (record "true"), and the controller is an operator, not a platform
    identity: ``shell_judged``/``_platform_pod_for`` (rules/trust.py) refuse it
    ``ownership.debug`` (the ``_opener`` exemption needs the controller's Pod in the
    step's namespace). The errors are ignored by Argo: the step keeps running past its
    deadline. SPEC section 8: "everything ... a platform operator does to the objects it
    owns is allowed". Fix: an operator identity may open a shell into a Pod whose
    controller ownerReference is of one of its kinds (owner references of stamped
    objects cannot be rewritten)."""
    made = evaluate(workflow("wf-1"), SHIPPED, namespace="ml", context=Context(CORE))
    annotations = made.object["metadata"]["annotations"]
    state = State([Meta("Workflow", "ml", "pipeline", "wf-1", {}, annotations)])
    by_uid = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "pipeline",
              "uid": "wf-1", "controller": True}  # fmt: skip
    step = evaluate(
        pod(labels={"workflows.argoproj.io/workflow": "pipeline"}, ownerReferences=[by_uid]),
        SHIPPED, namespace="ml", context=Context(ARGO, state),
    ).object  # fmt: skip
    assert step["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    assert rules(shell(ALICE, step)) == {"ownership.debug"}  # her shell stays refused
    decision = connect(
        step, SHIPPED, namespace="ml", context=Context(ARGO, state, "CONNECT", "exec")
    )
    assert decision.allowed, decision.message()


def test_a_platform_opens_a_shell_in_its_own_pod_beside_another_platform() -> None:
    """False refusal. A cluster running DigitalHub and MLRun loads both policies. The
    Core's run is recorded ``runguard.io/platform: "true"``; for MLRun's RunPolicies,
    ``recorded_platform`` (rules/ownership.py) reads the same "true" as MLRun's, so
    ``_platform_pod_for`` refuses the Core a shell (and a debug container) in its own
    Pod, and MLRun's API one in its own. Fix: judge a recorded Pod only against the
    RunPolicy that recorded it (its ``runguard.io/policy`` label, or a record naming the
    platform), or against the stamp's identity."""
    both = with_alternatives(
        [p.model_copy(update={"alternatives": ()})
         for p in (*SHIPPED.run_policies(), *MLRUN.run_policies())]
    )  # fmt: skip
    run = evaluate(pod(), both, namespace="ml", context=Context(CORE, State([]))).object
    assert run["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    assert rules(shell(ALICE, run)) == {"ownership.debug"}
    decision = connect(run, both, namespace="ml", context=Context(CORE, State([]), "CONNECT",
                                                                  "exec"))  # fmt: skip
    assert decision.allowed, decision.message()


def test_her_own_run_stays_hers_beside_another_platform() -> None:
    both = with_alternatives(
        [p.model_copy(update={"alternatives": ()})
         for p in (*SHIPPED.run_policies(), *MLRUN.run_policies())]
    )  # fmt: skip
    context = Context(ALICE, State([]), "CONNECT", "exec")
    assert connect(users_own_pod(), both, namespace="ml", context=context).allowed
