"""A door opened into a running Pod: its review.

``kubectl exec``, ``attach``, ``port-forward`` and the ``pods/proxy`` subresource are
CONNECT requests whose object is the command or the ports (``PodExecOptions``...), not
the Pod; ``services/proxy`` reaches a Pod behind a Service; a TokenRequest binding a
ServiceAccount's token to a Pod names the Pod in its ``boundObjectRef``. The engine
judges the Pod (``engine.connect``: a Pod of the platform's is the platform's to open,
``ownership.debug``, as a debug container), each Pod a Service may reach for a
``services/proxy``. So the server reads it, one GET per door (a Service: itself, its
Endpoints and one list of Pods), and only when the requester is not the platform:
people open shells, not controllers (the kubelets' token requests are not routed), so
this is far from the rate of admissions, and a read at the moment of the request sees
the Pod as it is now (the watch cache holds no Pods). A shell the platform's own Pod
opens with its token (the MPI launcher of mpi-operator v1 runs its workers by ``kubectl
exec``) is the platform's: the apiserver names the Pod a bound ServiceAccount token
belongs to in ``userInfo.extra`` (which impersonation cannot set without a grant on
``userextras``), and runguard reads that Pod too; minting such a token for a platform
Pod is itself refused to anyone but the platform and the Pod's node. It reads with the
credentials of the cluster state (``--cluster-state``: in-cluster or a kubeconfig), the
component the webhook ships with; each process makes its client on first use (after
gunicorn forks). A Pod that cannot be read is denied with the reason (fail closed): the
door would otherwise open unjudged; so is a CONNECT that is no door runguard knows
(``nodes/proxy``, RBAC's to grant to admins only, is not routed to runguard).

What a proxy names, and the Pods a ``services/proxy`` reaches: ``webhook.serving.reach``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from webhook import engine
from webhook.engine.context import ClusterView, Context
from webhook.engine.rules.debug import SHELLS, shell_judged
from webhook.engine.subject import service_account
from webhook.engine.types import Decision
from webhook.inputs import kubeconfig
from webhook.policy.model import Policy
from webhook.serving.admission import (
    INTERNAL_ERROR_MESSAGE,
    AdmissionRequest,
    Outcome,
    context_of,
    decision_response,
    review_response,
)
from webhook.serving.reach import PROXY_FORM, Listed, ServiceReads, proxied_name, reached_pods

__all__ = [
    "READ_TIMEOUT",
    "PodLookup",
    "PodReader",
    "ReadPod",
    "Reads",
    "ServiceReads",
    "judges",
    "not_a_door",
    "review",
    "shell_of",
]

# Seconds per attempt, and one retry (a kept-alive connection the apiserver closed):
# both within the webhook's own timeout of 5 s, so a read that fails is refused with
# its reason, not by the apiserver's timeout.
READ_TIMEOUT = 1.5
READ_RETRIES = 1
# What the apiserver adds to the user of a ServiceAccount token bound to a Pod.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
# The label an EndpointSlice names its Service by.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class PodLookup:
    """What reading one Pod gave: the Pod; or None and why (``error``); or neither (no
    such Pod)."""

    pod: dict[str, Any] | None
    error: str | None = None


ReadPod = Callable[[str, str], PodLookup]  # (namespace, name) -> the Pod


class Reads(ServiceReads, Protocol):
    """Every read a door is judged with: a Pod by name (called, a ``ReadPod``), and what
    a Service reaches."""

    def __call__(self, namespace: str, name: str) -> PodLookup: ...


def shell_of(request: AdmissionRequest) -> str | None:
    """The door the request opens into a Pod (``SHELLS``: ``exec``, ``attach``,
    ``portforward``, ``proxy`` by CONNECT of the Pod's subresource, ``proxy`` also of a
    Service's; ``token`` by CREATE of a ServiceAccount's token bound to a Pod), else
    None."""
    resource = request.get("resource")
    subresource = request.get("subResource")
    if subresource not in SHELLS or not isinstance(resource, dict) or resource.get("group"):
        return None
    if subresource == "token":
        is_door = request["operation"] == "CREATE" and resource.get("resource") == (
            "serviceaccounts"
        )
        return subresource if is_door and _bound_pod(request) is not None else None
    if request["operation"] != "CONNECT":
        return None
    if resource.get("resource") == "pods" or _through_service(request):
        return subresource
    return None


def judges(endpoint: str, request: AdmissionRequest) -> bool:
    """Whether ``review`` answers the request: every CONNECT, at either path (one that
    is no door is refused, never let through), and a token bound to a Pod at
    ``/validate``."""
    return request["operation"] == "CONNECT" or (
        endpoint == "validate" and shell_of(request) is not None
    )


def _through_service(request: AdmissionRequest) -> bool:
    """A CONNECT of ``services/proxy``."""
    resource = request.get("resource")
    return (
        isinstance(resource, dict)
        and not resource.get("group")
        and resource.get("resource") == "services"
        and request.get("subResource") == "proxy"
    )


def _bound_pod(request: AdmissionRequest) -> str | None:
    """The name of the Pod a TokenRequest binds its token to, if it binds one to a Pod."""
    obj = request.get("object")
    spec = obj.get("spec") if isinstance(obj, dict) else None
    ref = spec.get("boundObjectRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict) or ref.get("kind") != "Pod":
        return None
    name = ref.get("name")
    return name if isinstance(name, str) else ""


def review(
    request: AdmissionRequest,
    policy: Policy,
    cluster: ClusterView | None,
    read: ReadPod | None,
    services: ServiceReads | None = None,
) -> Outcome:
    """The answer to a shell's review (``shell_of`` says it is one), or to any CONNECT
    (one that is no door is denied); never raises: what the engine or the read could
    not do is denied. ``services``: the reads a ``services/proxy`` is judged with."""
    try:
        if shell_of(request) is None:
            return _denied(request["uid"], not_a_door(request))
        if _through_service(request):
            return _review_service(request, policy, cluster, read, services)
        return _review(request, policy, cluster, read)
    except Exception as exc:  # the caller logs it; the apiserver gets a clear denial
        denial = review_response(request["uid"], allowed=False, message=INTERNAL_ERROR_MESSAGE)
        return Outcome(denial, None, error=exc)


def _review(
    request: AdmissionRequest, policy: Policy, cluster: ClusterView | None, read: ReadPod | None
) -> Outcome:
    uid = request["uid"]
    context = context_of(request, cluster)
    if not shell_judged(policy, context):
        return Outcome(review_response(uid, allowed=True), None)  # the platform's own
    door = shell_of(request)
    namespace = request.get("namespace") or ""
    name = (_bound_pod(request) if door == "token" else request.get("name")) or ""
    if door == "proxy":
        target = proxied_name(name)
        if target is None:
            return _denied(uid, f"runguard cannot tell which Pod {name!r} names: {PROXY_FORM}")
        name = target
    where = f"Pod {namespace}/{name}"
    if read is None:
        return _denied(
            uid,
            f"runguard cannot read Pods (the server has no --cluster-state), so it cannot "
            f"judge a shell into {where}: an administrator must give it the cluster state",
        )
    found = read(namespace, name)
    if found.error is not None:
        return _denied(uid, f"runguard could not read {where} to judge this shell: {found.error}")
    if found.pod is None:
        return _denied(uid, f"runguard found no {where}")
    decision = _connect(found.pod, request, policy, context, read)
    return Outcome(decision_response(uid, decision, patch=False), decision, decision.error)


def _connect(
    pod: dict[str, Any], request: AdmissionRequest, policy: Policy, context: Context, read: ReadPod
) -> Decision:
    """``engine.connect`` of ``pod``; refused, again as opened by the Pod whose own token
    asks (``_opener``), unless the door is that token's minting."""
    ns = request.get("namespace") or None
    decision = engine.connect(pod, policy, namespace=ns, context=context)
    if decision.allowed or shell_of(request) == "token":
        return decision
    opener = _opener(request, read)
    if opener is None:
        return decision
    return engine.connect(pod, policy, namespace=ns, context=context, by=opener)


def not_a_door(request: AdmissionRequest) -> str:
    """Why a CONNECT that is no door into a Pod is refused (a webhook configuration
    that is not runguard's sent it: runguard routes only the doors it judges)."""
    resource = request.get("resource")
    plural = resource.get("resource") if isinstance(resource, dict) else None
    group = resource.get("group") if isinstance(resource, dict) else None
    what = f"{plural}/{request.get('subResource') or ''}" + (f" ({group})" if group else "")
    return (
        f"runguard judges no {request.get('operation')} of {what}: its webhooks send it the "
        "doors into a Pod only (pods/exec, attach, portforward, proxy; services/proxy); "
        "remove this resource from the webhook configuration that sent it"
    )


def _review_service(
    request: AdmissionRequest,
    policy: Policy,
    cluster: ClusterView | None,
    read: ReadPod | None,
    services: ServiceReads | None,
) -> Outcome:
    """``services/proxy``: each Pod the Service may reach is judged as by ``pods/proxy``;
    the first refused refuses the door."""
    uid = request["uid"]
    context = context_of(request, cluster)
    if not shell_judged(policy, context):
        return Outcome(review_response(uid, allowed=True), None)  # the platform's own
    namespace = request.get("namespace") or ""
    given = request.get("name") or ""
    name = proxied_name(given)
    if name is None:
        return _denied(uid, f"runguard cannot tell which Service {given!r} names: {PROXY_FORM}")
    where = f"Service {namespace}/{name}"
    if services is None or read is None:
        return _denied(
            uid,
            f"runguard cannot read Services and Pods (the server has no --cluster-state), "
            f"so it cannot judge a proxy to {where}: an administrator must give it the "
            "cluster state",
        )
    reached = reached_pods(services, namespace, name)
    if reached.error is not None:
        return _denied(uid, f"runguard could not read {where} to judge this proxy: {reached.error}")
    for pod in reached.items:
        decision = _connect(pod, request, policy, context, read)
        if not decision.allowed:
            message = f"{where} reaches Pod {namespace}/{decision.name}: {decision.message()}"
            response = review_response(
                uid,
                allowed=False,
                warnings=decision.warnings,
                audit_annotations=decision.audit_annotations,
                message=message,
            )
            return Outcome(response, decision, decision.error)
    return Outcome(review_response(uid, allowed=True), None)


def _opener(request: AdmissionRequest, read: ReadPod) -> dict[str, Any] | None:
    """The Pod of the target's namespace whose own ServiceAccount token asks for the
    shell (``userInfo.extra``), as the cluster holds it, when it is that Pod still (same
    uid, same account); else None."""
    info = request.get("userInfo") or {}
    parts = str(info.get("username", "")).split(":")
    extra = info.get("extra")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"] or not isinstance(extra, dict):
        return None
    names, uids = extra.get(POD_NAME_EXTRA), extra.get(POD_UID_EXTRA)
    if not (isinstance(names, list) and isinstance(uids, list) and len(names) == len(uids) == 1):
        return None
    (name,), (pod_uid,) = names, uids
    if parts[2] != request.get("namespace") or not isinstance(name, str) or not name:
        return None
    found = read(parts[2], name).pod
    if found is None:
        return None
    metadata, spec = found.get("metadata"), found.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    if metadata.get("uid") != pod_uid or service_account(spec) != parts[3]:
        return None
    return found


def _denied(uid: str, message: str) -> Outcome:
    return Outcome(review_response(uid, allowed=False, message=message), None)


class PodReader:
    """Reads a Pod by namespace and name, and what a ``services/proxy`` reaches
    (``ServiceReads``), from the apiserver ``source`` names (``in-cluster`` or a
    kubeconfig file); no read raises."""

    def __init__(self, source: str, timeout: float = READ_TIMEOUT) -> None:
        self.source = source
        self.timeout = timeout
        self._lock = threading.Lock()
        self._api: Any = None
        self._pid = 0

    def read(self, namespace: str, name: str) -> PodLookup:
        found = self._get("Pod", "CoreV1Api", "read_namespaced_pod", name, namespace)
        return PodLookup(found.items[0] if found.items else None, found.error)

    __call__ = read

    def service(self, namespace: str, name: str) -> Listed:
        return self._get("Service", "CoreV1Api", "read_namespaced_service", name, namespace)

    def endpoints(self, namespace: str, name: str) -> Listed:
        return self._get("Endpoints", "CoreV1Api", "read_namespaced_endpoints", name, namespace)

    def endpoint_slices(self, namespace: str, name: str) -> Listed:
        return self._list("EndpointSlice", "DiscoveryV1Api", "list_namespaced_endpoint_slice",
                          namespace, f"{SERVICE_NAME_LABEL}={name}")  # fmt: skip

    def pods(self, namespace: str, selector: str) -> Listed:
        return self._list("Pod", "CoreV1Api", "list_namespaced_pod", namespace, selector)

    def _list(self, kind: str, api: str, method: str, namespace: str, selector: str) -> Listed:
        """The objects of ``kind`` in ``namespace`` matching a label selector."""
        found = self._get(f"{kind}List", api, method, namespace, label_selector=selector)
        items = found.items[0].get("items") if found.items else None
        if found.error is not None or not isinstance(items, list):
            return Listed((), found.error or "the apiserver answered a list without items")
        return Listed(tuple(i for i in items if isinstance(i, dict)))

    def _get(self, kind: str, api: str, method: str, *args: str, **options: str) -> Listed:
        """The object of ``kind`` one call of the client's ``api`` answers (none: 404)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            call = getattr(getattr(client, api)(self._client()), method)
            response = call(*args, _preload_content=False, _request_timeout=self.timeout,
                            **options)  # fmt: skip
            obj = orjson.loads(response.data)
        except ApiException as exc:
            if exc.status == 404:
                return Listed()
            return Listed((), f"the apiserver answered {exc.status} {exc.reason}")
        except Exception as exc:  # noqa: BLE001 - unreachable, timed out, bad credentials
            return Listed((), f"{type(exc).__name__}: {str(exc)[:200]}")
        if not isinstance(obj, dict) or obj.get("kind") != kind:
            return Listed((), f"the apiserver answered something that is not a {kind}")
        return Listed((obj,))

    def _client(self) -> Any:
        with self._lock:
            if self._api is None or self._pid != os.getpid():
                from kubernetes import client

                configuration = kubeconfig.configuration(self.source)
                configuration.retries = READ_RETRIES
                self._api = client.ApiClient(configuration)
                self._pid = os.getpid()
            return self._api
