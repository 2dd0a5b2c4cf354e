"""Shells into a run's Pod (exec, attach, port-forward): the CONNECT request, the cluster it is
judged against (``Cluster``), and the answer the webhook gives."""

from __future__ import annotations

import copy
from typing import Any

from webhook.engine import connect
from webhook.engine.context import Context, Requester
from webhook.serving import shells
from webhook.serving.shells import PodLookup

from .cluster_state import State
from .shipped import ALICE, SHIPPED, created, pod


def shell(who: Requester, target: Any, how: str = "exec", namespace: str = "ml") -> Any:
    context = Context(who, State([]), "CONNECT", how)
    return connect(target, SHIPPED, namespace=namespace, context=context)


def users_own_pod() -> dict[str, Any]:
    """Alice's run, naming nothing of the platform's: admitted for her."""
    mine = pod()
    main = mine["spec"]["containers"][0]
    del main["envFrom"], main["volumeMounts"]
    del mine["spec"]["volumes"]
    return created(mine, ALICE)


def connect_request(who: Requester, subresource: str = "exec", name: str = "train") -> Any:
    return {
        "uid": "u-1",
        "operation": "CONNECT",
        "kind": {"group": "", "version": "v1", "kind": "PodExecOptions"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": subresource,
        "namespace": "ml",
        "name": name,
        "object": {"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"]},
        "userInfo": {"username": who.username, "groups": list(who.groups)},
    }


class Reads:
    """The server's Pod read, answering ``lookup`` and recording what was asked."""

    def __init__(self, lookup: PodLookup) -> None:
        self.lookup = lookup
        self.asked: list[tuple[str, str]] = []

    def __call__(self, namespace: str, name: str) -> PodLookup:
        self.asked.append((namespace, name))
        return self.lookup


def answer(request: Any, read: Any) -> dict[str, Any]:
    assert shells.shell_of(request) in ("exec", "attach")
    outcome = shells.review(request, SHIPPED, None, read)
    assert outcome.error is None
    response: dict[str, Any] = dict(outcome.response["response"])
    return response


def token_of(opener: dict[str, Any], account: str = "launcher", uid: str = "pod-uid-1") -> Any:
    """The ``userInfo`` of a ServiceAccount token bound to ``opener`` (what the apiserver
    sends: the Pod's name and uid in ``extra``)."""
    return {
        "username": f"system:serviceaccount:ml:{account}",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:ml"],
        "extra": {
            "authentication.kubernetes.io/pod-name": [opener["metadata"]["name"]],
            "authentication.kubernetes.io/pod-uid": [uid],
        },
    }


def as_pod(made: dict[str, Any], name: str, account: str = "launcher") -> dict[str, Any]:
    """``made`` as the apiserver stores it: named, with a uid and its account."""
    stored = copy.deepcopy(made)
    stored["metadata"].update(name=name, uid="pod-uid-1")
    stored["spec"]["serviceAccountName"] = account
    return stored


class Cluster:
    """The server's Pod read over a few Pods of namespace ml."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.asked: list[str] = []

    def __call__(self, namespace: str, name: str) -> PodLookup:
        self.asked.append(name)
        return PodLookup(self.pods.get(name) if namespace == "ml" else None)
