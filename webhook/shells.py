"""A door opened into a running Pod: its review.

``kubectl exec``, ``attach``, ``port-forward`` and the ``pods/proxy`` subresource are
CONNECT requests whose object is the command or the ports (``PodExecOptions``...), not
the Pod; a TokenRequest binding a ServiceAccount's token to a Pod names the Pod in its
``boundObjectRef``. The engine judges the Pod (``engine.connect``: a Pod of the
platform's is the platform's to open, ``ownership.debug``, as a debug container). So
the server reads it, one GET per door, and only when the requester is not the platform:
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
door would otherwise open unjudged.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from webhook import engine, kubeconfig
from webhook.admission import (
    INTERNAL_ERROR_MESSAGE,
    AdmissionRequest,
    Outcome,
    context_of,
    decision_response,
    review_response,
)
from webhook.engine.context import ClusterView
from webhook.engine.rules.trust import SHELLS, shell_judged
from webhook.engine.subject import service_account
from webhook.policy.model import Policy

__all__ = ["READ_TIMEOUT", "PodLookup", "PodReader", "ReadPod", "review", "shell_of"]

# Seconds per attempt, and one retry (a kept-alive connection the apiserver closed):
# both within the webhook's own timeout of 5 s, so a read that fails is refused with
# its reason, not by the apiserver's timeout.
READ_TIMEOUT = 1.5
READ_RETRIES = 1
# What the apiserver adds to the user of a ServiceAccount token bound to a Pod.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True)
class PodLookup:
    """What reading one Pod gave: the Pod; or None and why (``error``); or neither (no
    such Pod)."""

    pod: dict[str, Any] | None
    error: str | None = None


ReadPod = Callable[[str, str], PodLookup]  # (namespace, name) -> the Pod


def shell_of(request: AdmissionRequest) -> str | None:
    """The door the request opens into a Pod (``SHELLS``: ``exec``, ``attach``,
    ``portforward``, ``proxy`` by CONNECT of the Pod's subresource; ``token`` by CREATE
    of a ServiceAccount's token bound to a Pod), else None."""
    resource = request.get("resource")
    subresource = request.get("subResource")
    if subresource not in SHELLS or not isinstance(resource, dict) or resource.get("group"):
        return None
    if subresource == "token":
        is_door = request["operation"] == "CREATE" and resource.get("resource") == (
            "serviceaccounts"
        )
        return subresource if is_door and _bound_pod(request) is not None else None
    if request["operation"] != "CONNECT" or resource.get("resource") != "pods":
        return None
    return subresource


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
    request: AdmissionRequest, policy: Policy, cluster: ClusterView | None, read: ReadPod | None
) -> Outcome:
    """The answer to a shell's review (``shell_of`` says it is one); never raises: what
    the engine or the read could not do is denied."""
    try:
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
    token = shell_of(request) == "token"
    namespace = request.get("namespace") or ""
    name = (_bound_pod(request) if token else request.get("name")) or ""
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
    ns = namespace or None
    decision = engine.connect(found.pod, policy, namespace=ns, context=context)
    opener = _opener(request, read) if not decision.allowed and not token else None
    if opener is not None:
        decision = engine.connect(found.pod, policy, namespace=ns, context=context, by=opener)
    return Outcome(decision_response(uid, decision, patch=False), decision, decision.error)


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
    """Reads a Pod by namespace and name from the apiserver ``source`` names (``in-cluster``
    or a kubeconfig file); ``read`` never raises."""

    def __init__(self, source: str, timeout: float = READ_TIMEOUT) -> None:
        self.source = source
        self.timeout = timeout
        self._lock = threading.Lock()
        self._api: Any = None
        self._pid = 0

    def read(self, namespace: str, name: str) -> PodLookup:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._core().read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=self.timeout
            )
            pod = orjson.loads(response.data)
        except ApiException as exc:
            if exc.status == 404:
                return PodLookup(None)
            return PodLookup(None, f"the apiserver answered {exc.status} {exc.reason}")
        except Exception as exc:  # noqa: BLE001 - unreachable, timed out, bad credentials
            return PodLookup(None, f"{type(exc).__name__}: {str(exc)[:200]}")
        if not isinstance(pod, dict) or pod.get("kind") != "Pod":
            return PodLookup(None, "the apiserver answered something that is not a Pod")
        return PodLookup(pod)

    def _core(self) -> Any:
        with self._lock:
            if self._api is None or self._pid != os.getpid():
                from kubernetes import client

                configuration = kubeconfig.configuration(self.source)
                configuration.retries = READ_RETRIES
                self._api = client.CoreV1Api(client.ApiClient(configuration))
                self._pid = os.getpid()
            return self._api
