"""Every connection into a Pod, judged on the Pods it reaches (``webhook/serving/shells.py``).

The attacker has ``edit`` in run namespaces: ``create`` on ``pods/proxy`` and
``services/proxy`` among the rest. Each chain below got through, or refused a user her
own Pod, before this file; its docstring keeps the chain and the fix made. The reads
of the cluster are functions here (``Namespace``); the server's reads and the
apiserver's routing are tested through the real apiserver in ``tests/e2e/test_trust.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from test_shells import Cluster, Reads, as_pod, connect_request, token_of, users_own_pod
from test_trust import ALICE, CORE, REPO, SHIPPED, created, pod

from webhook.install import manifests
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


# --- the name forms of a proxy ---------------------------------------------------------------


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


# --- services/proxy ----------------------------------------------------------------------------


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


# --- a CONNECT that is no door, and nodes/proxy ------------------------------------------------


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
