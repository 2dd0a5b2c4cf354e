"""Attacks through every connection into a Pod (``webhook/serving/shells.py``,
``webhook/serving/reach.py``, ``engine.connect``): ``kubectl exec`` / ``attach``,
``port-forward``, ``pods/proxy``, ``services/proxy``, ``nodes/proxy``, a CONNECT that is no
door, and a debug container added to a platform Pod.

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces: it
grants ``create`` on ``pods/exec``, ``pods/attach``, ``pods/portforward``, ``pods/proxy``,
``services/proxy``, ``serviceaccounts/token`` and ``impersonate`` on serviceaccounts,
nothing on ``userextras``. Each chain below got through, or refused a user her own Pod,
before it was mended; its docstring keeps the chain and the fix made. The reads of the
cluster are functions here (``Namespace``); the server's reads and the apiserver's
routing are tested through the real apiserver in ``tests/e2e/test_trust.py``.

Known race, not tested (offline it cannot be): a ``services/proxy`` is judged on the
Service, its Endpoints and EndpointSlices as read at the moment of the request
(``webhook.serving.reach.reached_pods``); a Service whose selector she changes between
runguard's answer and the apiserver's own read of the Endpoints (milliseconds later)
is proxied to Pods runguard did not judge. The endpoints controller lags the selector
too, so the window is the controller's reaction time plus the webhook's round trip.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import REPO
from harness.attack_chains import DH_NS, DIGITALHUB, _routes, platform_run
from harness.cluster_state import Meta, State
from harness.shells import (
    Cluster,
    Reads,
    answer,
    as_pod,
    connect_request,
    shell,
    token_of,
    users_own_pod,
)
from harness.shipped import ALICE, ARGO, CORE, SHIPPED, created, pod, rules, update, workflow

from webhook import engine
from webhook.engine import connect, evaluate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.serving import admission, shells
from webhook.serving.app import create_app
from webhook.serving.reach import Listed, proxied_name, reached_pods
from webhook.serving.shells import PodLookup, PodReader

HEAD_LABELS = {"ray.io/node-type": "head", "ray.io/cluster": "core-ray"}


def platform_head(name: str = "core-ray-head") -> dict[str, Any]:
    """The platform's Ray head Pod (its record, its secret and claim), as stored."""
    head = as_pod(created(pod(), CORE), name)
    head["metadata"]["labels"].update(HEAD_LABELS)
    return head


def her_pod(name: str = "mine", **labels: str) -> dict[str, Any]:
    mine = as_pod(users_own_pod(), name)
    mine["metadata"]["labels"].update(labels)
    return mine


def service(name: str, selector: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"ports": [{"name": "dashboard", "port": 8265}]}
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "ml"}, "spec": spec}  # fmt: skip


def endpoints(name: str, *targets: tuple[str, str], ready: bool = True) -> dict[str, Any]:
    """An Endpoints whose addresses point at Pods (namespace, name) by targetRef."""
    addresses = [
        {"ip": f"192.0.2.{i + 1}", "targetRef": {"kind": "Pod", "namespace": ns, "name": n}}
        for i, (ns, n) in enumerate(targets)
    ]
    key = "addresses" if ready else "notReadyAddresses"
    ports = [{"name": "dashboard", "port": 8265}]
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name},
            "subsets": [{key: addresses, "ports": ports}]}  # fmt: skip


def endpoint_slice(service_name: str, *targets: tuple[str, str]) -> dict[str, Any]:
    """An EndpointSlice of Service ``service_name`` pointing at Pods (namespace, name)."""
    found = [
        {"addresses": [f"192.0.2.{i + 1}"],
         "targetRef": {"kind": "Pod", "namespace": ns, "name": n}}
        for i, (ns, n) in enumerate(targets)
    ]  # fmt: skip
    labels = {"kubernetes.io/service-name": service_name}
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service_name}-x1", "labels": labels},
            "addressType": "IPv4", "endpoints": found}  # fmt: skip


class Namespace:
    """The server's reads (``shells.Reads``) over namespace ml's Services, Endpoints,
    EndpointSlices and Pods, recording what was asked of a Service."""

    def __init__(
        self,
        pods: list[dict[str, Any]],
        services: list[dict[str, Any]],
        endpoints_: Sequence[dict[str, Any]] = (),
        error: str | None = None,
    ) -> None:
        self._pods, self.error = pods, error
        self._services = {s["metadata"]["name"]: s for s in services}
        self._endpoints = list(endpoints_)
        self.asked: list[tuple[str, str]] = []

    def __call__(self, namespace: str, name: str) -> PodLookup:
        return Cluster(*self._pods)(namespace, name)

    def _one(self, found: dict[str, Any] | None) -> Listed:
        if self.error is not None:
            return Listed((), self.error)
        return Listed((found,) if found is not None else ())

    def service(self, namespace: str, name: str) -> Listed:
        self.asked.append(("service", name))
        return self._one(self._services.get(name) if namespace == "ml" else None)

    def endpoints(self, namespace: str, name: str) -> Listed:
        self.asked.append(("endpoints", name))
        found = [e for e in self._endpoints if e["kind"] == "Endpoints"
                 and e["metadata"]["name"] == name and namespace == "ml"]  # fmt: skip
        return self._one(found[0] if found else None)

    def endpoint_slices(self, namespace: str, name: str) -> Listed:
        self.asked.append(("slices", name))
        if self.error is not None:
            return Listed((), self.error)
        return Listed(tuple(
            e for e in self._endpoints
            if e["kind"] == "EndpointSlice" and namespace == "ml"
            and e["metadata"]["labels"]["kubernetes.io/service-name"] == name
        ))  # fmt: skip

    def pods(self, namespace: str, selector: str) -> Listed:
        self.asked.append(("pods", selector))
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        return Listed(tuple(
            p for p in self._pods
            if namespace == "ml"
            and all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ))  # fmt: skip


def service_proxy(who: Any, name: str) -> dict[str, Any]:
    """A CONNECT of ``services/proxy`` as the apiserver sends it (``kubectl get --raw
    /api/v1/namespaces/ml/services/<name>/proxy/...``)."""
    request = connect_request(who, "proxy", name=name)
    request["resource"] = {"group": "", "version": "v1", "resource": "services"}
    request["kind"] = {"group": "", "version": "v1", "kind": "ServiceProxyOptions"}
    request["object"] = {"kind": "ServiceProxyOptions", "apiVersion": "v1", "path": "/"}
    return request


def judged(request: dict[str, Any], cluster: Namespace, read: Any = None) -> dict[str, Any]:
    """The answer to ``request``, with every Pod of ``cluster`` readable by name too."""
    assert shells.shell_of(request) == "proxy"
    outcome = shells.review(request, SHIPPED, None, read or cluster, cluster)
    assert outcome.error is None
    response: dict[str, Any] = dict(outcome.response["response"])
    return response


def routed(resource: str) -> bool:
    (hook, _) = manifests.shells_webhook_configuration(SHIPPED)["webhooks"]
    return any(resource in r["resources"] and "CONNECT" in r["operations"] for r in hook["rules"])


# --- exec and attach: who the opener is, what the review says ---------------------------


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
    a debug container (``tests/serving/test_shells.py``; through the real apiserver and kubectl
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


def test_argo_signals_the_step_pods_of_the_cores_workflow() -> None:
    """False refusal. Argo's workflow-controller stops a step (``argo stop``/
    ``terminate``, ``activeDeadlineSeconds``, sidecars left running) by exec'ing
    ``kill`` into the step Pod's containers (``workflow/signal.SignalContainer``, its
    ClusterRole grants ``pods/exec``). The step Pod of the Core's Workflow is the
    platform's (record "true"), and the controller is an operator, not a platform
    identity: ``shell_judged``/``_platform_pod_for`` (rules/trust.py) refuse it
    ``ownership.debug`` (the ``_opener`` exemption needs the controller's Pod in the
    step's namespace). The errors are ignored by Argo: the step keeps running past its
    deadline. docs/dev/guarantees.md, "Trust over time": "everything ... a platform operator does to
    the objects it owns is allowed". Fix: an operator identity may open a shell into a Pod whose
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


# --- a debug container in a platform Pod ------------------------------------------------


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


# --- the network doors: port-forward and the name forms of a proxy ----------------------


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


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("head", "head"),
        ("head:8265", "head"),
        ("head:dashboard", "head"),
        ("http:head:8265", "head"),
        ("https:head:8443", "head"),
        ("https:head:", "head"),
        ("head:", "head"),
        ("https:head", "https"),  # two parts: name, port (as the apiserver reads it)
        ("", None),
        (":8265", None),
        ("ftp:head:21", None),
        ("http::80", None),
        ("a:b:c:d", None),
    ],
)
def test_a_proxys_name_is_split_as_the_apiserver_splits_it(name: str, target: str | None) -> None:
    assert proxied_name(name) == target


@pytest.mark.parametrize("name", ["train:8080", "http:train:8080", "https:train:http-metrics"])
def test_pods_proxy_with_a_port_reads_the_pod_it_names(name: str) -> None:
    """Refused wrongly. ``kubectl get --raw /api/v1/namespaces/ml/pods/train:8080/proxy/``
    into her own Pod: the request's ``name`` is ``train:8080``; ``_review`` read the Pod
    named ``train:8080``, found none, and refused her. Fix: split the name as the
    apiserver does (``proxied_name``) and read ``train``: hers opens, the platform's is
    refused in every form."""
    mine = Reads(PodLookup(users_own_pod()))
    request = connect_request(ALICE, "proxy", name=name)
    outcome = shells.review(request, SHIPPED, None, mine)
    assert outcome.response["response"]["allowed"] is True
    assert mine.asked == [("ml", "train")]
    platforms = Reads(PodLookup(created(pod(), CORE)))
    denied = shells.review(request, SHIPPED, None, platforms).response["response"]
    assert denied["allowed"] is False and "[ownership.debug]" in denied["status"]["message"]
    assert platforms.asked == [("ml", "train")]


@pytest.mark.parametrize("name", ["ftp:train:21", "a:b:c:d", ":8080"])
def test_a_proxy_name_the_apiserver_refuses_is_refused_unread(name: str) -> None:
    reads = Reads(PodLookup(None, "must not be asked"))
    for request in (connect_request(ALICE, "proxy", name=name), service_proxy(ALICE, name)):
        denied = shells.review(request, SHIPPED, None, reads, Namespace([], [])).response
        assert denied["response"]["allowed"] is False
        assert "[http:|https:]name[:port]" in denied["response"]["status"]["message"]
    assert reads.asked == []


# --- services/proxy ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["core-ray-head-svc", "core-ray-head-svc:8265",
                                  "http:core-ray-head-svc:dashboard"])  # fmt: skip
def test_a_service_proxy_to_the_platforms_ray_head_is_refused(name: str) -> None:
    """Chain: the Core's RayCluster runs a head Pod of the platform's (record "true",
    its secrets). She creates a Service ``core-ray-head-svc`` selecting
    ``ray.io/node-type=head, ray.io/cluster=core-ray`` (``edit`` grants Services), then
    POSTs to ``/api/v1/namespaces/ml/services/core-ray-head-svc:8265/proxy/api/jobs/``:
    Ray's job API runs her code in the platform's Pod. ``services/proxy`` was not routed
    (SHELL_SUBRESOURCES held Pods only) and a CONNECT reaching ``/validate`` was
    allowed. Fix: route it to the shells webhook and judge every Pod the Service
    reaches."""
    head = platform_head()
    cluster = Namespace([head, her_pod()], [service("core-ray-head-svc", HEAD_LABELS)])
    assert routed("services/proxy")
    denied = judged(service_proxy(ALICE, name), cluster)
    assert denied["allowed"] is False
    message = denied["status"]["message"]
    assert message.startswith("Service ml/core-ray-head-svc reaches Pod ml/core-ray-head: ")
    assert "[ownership.debug]" in message and "services/proxy" in message
    assert ("pods", "ray.io/cluster=core-ray,ray.io/node-type=head") in cluster.asked
    # the platform gets through, unread
    platform = Namespace([head], [service("core-ray-head-svc", HEAD_LABELS)], error="unread")
    assert judged(service_proxy(CORE, name), platform)["allowed"] is True
    assert platform.asked == []


def test_a_service_proxy_to_her_own_pods_opens() -> None:
    cluster = Namespace([platform_head(), her_pod("a", app="mine"), her_pod("b", app="mine")],
                        [service("mine", {"app": "mine"})],
                        [endpoints("mine", ("ml", "a"), ("ml", "b"))])  # fmt: skip
    assert judged(service_proxy(ALICE, "mine:8265"), cluster)["allowed"] is True
    assert cluster.asked == [("service", "mine"), ("pods", "app=mine"), ("endpoints", "mine"),
                             ("slices", "mine")]  # fmt: skip


def test_one_platform_pod_among_hers_refuses_the_service_proxy() -> None:
    """She labels the platform's head ``app=mine`` (she may add a label that is not a
    scope label) so that her Service picks it with her own Pods."""
    head = platform_head()
    head["metadata"]["labels"]["app"] = "mine"
    cluster = Namespace([her_pod("a", app="mine"), head], [service("mine", {"app": "mine"})])
    denied = judged(service_proxy(ALICE, "mine"), cluster)
    assert denied["allowed"] is False
    assert "reaches Pod ml/core-ray-head" in denied["status"]["message"]


@pytest.mark.parametrize(
    "refs",
    [
        endpoints("manual", ("ml", "core-ray-head")),
        endpoints("manual", ("ml", "core-ray-head"), ready=False),
        endpoint_slice("manual", ("ml", "core-ray-head")),
    ],
)
def test_a_service_without_selector_is_judged_by_the_pods_its_endpoints_name(
    refs: dict[str, Any],
) -> None:
    """Chain: a Service without a selector, whose Endpoints (or EndpointSlice) someone
    wrote with the platform head's IP and ``targetRef`` (the apiserver proxies to an
    endpoint only when its targetRef names a Pod of the namespace holding that IP; it
    reads the Endpoints up to Kubernetes 1.36, the EndpointSlices from 1.37). Judged on
    the Pods they name, ready or not, whatever the ref's kind."""
    cluster = Namespace([her_pod(), platform_head()], [service("manual", None)], [refs])
    denied = judged(service_proxy(ALICE, "manual"), cluster)
    assert denied["allowed"] is False and "reaches Pod ml/core-ray-head" in denied[
        "status"]["message"]  # fmt: skip
    assert cluster.asked == [("service", "manual"), ("endpoints", "manual"),
                             ("slices", "manual"), ("pods", "")]  # fmt: skip
    odd = copy.deepcopy(refs)
    odd_refs = [
        *(a for sub in odd.get("subsets", ()) for key in ("addresses", "notReadyAddresses")
          for a in sub.get(key, ())),
        *odd.get("endpoints", ()),
    ]  # fmt: skip
    assert odd_refs
    for ref in odd_refs:
        ref["targetRef"]["kind"] = "Node"
    cluster = Namespace([platform_head()], [service("manual", None)], [odd])
    assert judged(service_proxy(ALICE, "manual"), cluster)["allowed"] is False


def test_a_service_proxy_through_a_headless_or_external_name_service_is_refused() -> None:
    """A headless Service (``clusterIP: None``) selecting the platform's Ray head, and an
    ExternalName Service whose Endpoints someone wrote naming the head: the apiserver
    proxies to an endpoint's address whatever the Service's type, and runguard judges
    the Pods either names."""
    headless = service("headless", {"ray.io/node-type": "head", "ray.io/cluster": "core-ray"})
    headless["spec"]["clusterIP"] = "None"
    external = service("external", None)
    external["spec"].update({"type": "ExternalName", "externalName": "example.com"})
    cluster = Namespace([platform_head(), her_pod()], [headless, external],
                        [endpoints("external", ("ml", "core-ray-head"))])  # fmt: skip
    for name in ("headless", "external:8265", "https:headless:8443"):
        answer = judged(service_proxy(ALICE, name), cluster)
        assert answer["allowed"] is False, name
        assert "reaches Pod ml/core-ray-head" in answer["status"]["message"]


def test_what_the_apiserver_never_proxies_to_is_not_judged() -> None:
    """An address without a targetRef, or naming a Pod of another namespace, is never
    proxied to (``isValidAddress``); a Service that reaches no Pod opens nothing."""
    refs = endpoints("manual", ("digitalhub", "core-ray-head"))
    refs["subsets"][0]["addresses"].append({"ip": "192.0.2.9"})
    sliced = endpoint_slice("manual", ("digitalhub", "core-ray-head"))
    sliced["endpoints"].append({"addresses": ["192.0.2.9"]})
    cluster = Namespace([her_pod()], [service("manual", None)], [refs, sliced])
    assert judged(service_proxy(ALICE, "manual"), cluster)["allowed"] is True
    assert ("pods", "") not in cluster.asked
    empty = Namespace([platform_head()], [service("nothing", {"app": "none"})])
    assert judged(service_proxy(ALICE, "nothing"), empty)["allowed"] is True


@pytest.mark.parametrize(
    ("cluster", "says"),
    [
        (Namespace([], []), "no such Service"),
        (Namespace([], [], error="the apiserver answered 403 Forbidden"), "403 Forbidden"),
        (None, "has no --cluster-state"),
    ],
)
def test_a_service_that_cannot_be_read_is_refused(cluster: Any, says: str) -> None:
    request = service_proxy(ALICE, "core-ray-head-svc")
    outcome = shells.review(request, SHIPPED, None, Reads(PodLookup(None)), cluster)
    denied = outcome.response["response"]
    assert denied["allowed"] is False and says in denied["status"]["message"]
    assert "Service ml/core-ray-head-svc" in denied["status"]["message"]


def test_a_platform_pods_own_token_proxies_to_the_platforms_service() -> None:
    """The MPI launcher exemption holds through a Service as through the Pod."""
    head = platform_head()
    launcher = as_pod(created(pod(), CORE), "train-launcher")
    cluster = Namespace([head, launcher], [service("svc", HEAD_LABELS)])
    request = {**service_proxy(ALICE, "svc"), "userInfo": token_of(launcher)}
    assert judged(request, cluster, Cluster(head, launcher))["allowed"] is True
    forged = token_of(launcher, uid="another-uid")
    request = {**service_proxy(ALICE, "svc"), "userInfo": forged}
    assert judged(request, cluster, Cluster(head, launcher))["allowed"] is False


def test_reached_pods_lists_the_namespace_once_for_pods_the_selector_missed() -> None:
    head, mine = platform_head(), her_pod("a", app="mine")
    refs = endpoints("mine", ("ml", "a"), ("ml", "gone"))
    sliced = endpoint_slice("mine", ("ml", "a"), ("ml", "core-ray-head"))
    cluster = Namespace([head, mine], [service("mine", {"app": "mine"})], [refs, sliced])
    reached = reached_pods(cluster, "ml", "mine")
    assert reached.error is None
    assert [p["metadata"]["name"] for p in reached.items] == ["a", "core-ray-head"]
    assert cluster.asked == [("service", "mine"), ("pods", "app=mine"), ("endpoints", "mine"),
                             ("slices", "mine"), ("pods", "")]  # fmt: skip


def test_the_servers_reads_say_why_they_failed_never_raise(tmp_path: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n",
        encoding="utf-8",
    )
    reader = PodReader(str(kubeconfig), timeout=1.0)
    for found in (reader.service("ml", "svc"), reader.endpoints("ml", "svc"),
                  reader.endpoint_slices("ml", "svc"), reader.pods("ml", "app=x")):  # fmt: skip
        assert found.items == () and found.error


# --- a CONNECT that is no door, and nodes/proxy -----------------------------------------


def node_proxy(who: Any) -> dict[str, Any]:
    """``kubectl get --raw /api/v1/nodes/<node>/proxy/pods``: the kubelet's API."""
    request = connect_request(who, "proxy", name="node-1")
    request["resource"] = {"group": "", "version": "v1", "resource": "nodes"}
    request["kind"] = {"group": "", "version": "v1", "kind": "NodeProxyOptions"}
    request["object"] = {"kind": "NodeProxyOptions", "apiVersion": "v1", "path": "/pods"}
    del request["namespace"]
    return request


@pytest.mark.parametrize(
    "request_",
    [
        node_proxy(ALICE),
        node_proxy(CORE),
        {**connect_request(ALICE, "console"),
         "resource": {"group": "kubevirt.io", "version": "v1", "resource": "vms"}},
        connect_request(ALICE, "status"),
    ],
)  # fmt: skip
def test_a_connect_that_is_no_door_is_refused_not_let_through(request_: dict[str, Any]) -> None:
    """Chain: a CONNECT runguard does not judge that reaches ``/validate`` or ``/mutate``
    (a webhook configuration edited by hand, one of another tool pointing at runguard)
    was allowed: ``admission._judge`` let every CONNECT through. Fix: every CONNECT goes
    to ``webhook.serving.shells``; one that is no door is refused with what to do.
    ``nodes/proxy`` is not routed (RBAC's, admins only): the kubelet's port answers the
    same permission without the apiserver, where no admission runs."""
    assert not routed("nodes/proxy")
    assert shells.shell_of(request_) is None
    outcome = shells.review(request_, SHIPPED, None, Reads(PodLookup(None, "unasked")))
    denied = outcome.response["response"]
    assert denied["allowed"] is False and "runguard judges no CONNECT of" in denied["status"][
        "message"]  # fmt: skip
    for endpoint in ("mutate", "validate"):
        answer = admission.review(endpoint, request_, SHIPPED, None).response["response"]
        assert answer["allowed"] is False


def post(client: Any, path: str, request: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    answer = client.post(path, data=orjson.dumps(body), content_type="application/json")
    assert answer.status_code == 200
    response: dict[str, Any] = answer.get_json()["response"]
    return response


def test_the_server_judges_every_connect_at_either_path(tmp_path: Any) -> None:
    """Through the Flask app: a ``services/proxy`` to the platform's head and a
    ``pods/proxy`` with a port are judged at ``/validate`` with the server's reads, and
    at ``/mutate`` too; ``nodes/proxy`` is refused; a Service proxy to her own Pods
    opens."""
    app = create_app({"policy_dir": REPO / "policies"})
    head = platform_head()
    services = [service("ray", HEAD_LABELS), service("mine", {"app": "mine"})]
    cluster = Namespace([head, her_pod("a", app="mine")], services)
    app.extensions["runguard"].reads = cluster
    client = app.test_client()
    for path in ("/validate", "/mutate"):
        denied = post(client, path, service_proxy(ALICE, "ray:8265"))
        assert denied["allowed"] is False and "[ownership.debug]" in denied["status"]["message"]
        denied = post(client, path, connect_request(ALICE, "proxy", name="core-ray-head:8265"))
        assert denied["allowed"] is False and "[ownership.debug]" in denied["status"]["message"]
        assert post(client, path, service_proxy(ALICE, "mine"))["allowed"] is True
        denied = post(client, path, node_proxy(ALICE))
        assert denied["allowed"] is False and "nodes/proxy" in denied["status"]["message"]
