"""What a connection into a Pod reaches: the name a proxy gives, and the Pods behind a
Service.

A proxy's request names its target ``[scheme:]name[:port]`` (``pods/proxy`` and
``services/proxy``): the object read is ``name``, as the apiserver reads it
(``SplitSchemeNamePort`` in k8s.io/apimachinery/pkg/util/net).

``services/proxy``: the apiserver proxies to an address of the Service's Endpoints
(same name; from Kubernetes 1.37 on, of its EndpointSlices, label
``kubernetes.io/service-name``) whose ``targetRef`` names a Pod of the namespace holding
that IP, and nowhere else. runguard judges (``webhook.serving.shells``) every Pod the Service's
selector picks (what its endpoints will hold) and every Pod its Endpoints or
EndpointSlices name (a Service without a selector, whose endpoints someone wrote): one
platform Pod among them refuses the door to whoever may not open it. A Service that
reaches no Pod opens nothing (the apiserver answers 503). Pure: the reads are
``ServiceReads``' (the server's are ``webhook.serving.shells.PodReader``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "PROXY_FORM",
    "Listed",
    "ServiceReads",
    "targeted_pods",
    "label_selector",
    "proxied_name",
    "reached_pods",
]


@dataclass(frozen=True)
class Listed:
    """What reading a Service, its Endpoints or a list of Pods gave: the objects (none:
    no such object), or why they could not be read (``error``)."""

    items: tuple[dict[str, Any], ...] = ()
    error: str | None = None


class ServiceReads(Protocol):
    """The reads that judge a ``services/proxy``, in one namespace."""

    def service(self, namespace: str, name: str) -> Listed:
        """The Service (one item), or none."""
        ...

    def endpoints(self, namespace: str, name: str) -> Listed:
        """The Service's Endpoints (one item), or none."""
        ...

    def endpoint_slices(self, namespace: str, name: str) -> Listed:
        """The Service's EndpointSlices (label ``kubernetes.io/service-name``)."""
        ...

    def pods(self, namespace: str, selector: str) -> Listed:
        """The Pods of the namespace matching a label selector (all of them: "")."""
        ...


# The schemes a proxy's name may start with (k8s.io/apimachinery/pkg/util/net).
PROXY_SCHEMES = ("", "http", "https")


def proxied_name(name: str) -> str | None:
    """The object's name in a proxy's request name, ``[scheme:]name[:port]`` (scheme
    ``http`` or ``https``, port a number or a port's name), as the apiserver splits it;
    None for a name it refuses (``invalid pod request``)."""
    parts = name.split(":")
    if len(parts) > 3:
        return None
    scheme, target = (parts[0], parts[1]) if len(parts) == 3 else ("", parts[0])
    return target if target and scheme in PROXY_SCHEMES else None


PROXY_FORM = "a proxy names its target [http:|https:]name[:port]"


def reached_pods(services: ServiceReads, namespace: str, name: str) -> Listed:
    """The Pods a ``services/proxy`` to Service ``name`` may reach: those its selector
    picks, and those its Endpoints and EndpointSlices name (``targetRef``, a Pod of the
    namespace; one list of the namespace's Pods for those the selector did not pick); a
    Service not found is an error (the apiserver would answer 404)."""
    found = services.service(namespace, name)
    if found.error is not None:
        return found
    if not found.items:
        return Listed((), "no such Service")
    pods: dict[str, dict[str, Any]] = {}
    selector = label_selector(found.items[0])
    if selector:
        picked = services.pods(namespace, selector)
        if picked.error is not None:
            return picked
        pods.update((_name(p), p) for p in picked.items)
    named: set[str] = set()
    for listed in (services.endpoints(namespace, name), services.endpoint_slices(namespace, name)):
        if listed.error is not None:
            return listed
        named.update(*(targeted_pods(e, namespace) for e in listed.items))
    named -= set(pods)
    if named:
        every = services.pods(namespace, "")
        if every.error is not None:
            return every
        pods.update((_name(p), p) for p in every.items if _name(p) in named)
    return Listed(tuple(pods[n] for n in sorted(pods)))


def label_selector(service: dict[str, Any]) -> str:
    """A Service's ``spec.selector`` as a label selector (``k=v,...``); "" when it has
    none (its Endpoints are written by hand, or it has none)."""
    spec = service.get("spec")
    selector = spec.get("selector") if isinstance(spec, dict) else None
    if not isinstance(selector, dict):
        return ""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()) if isinstance(v, str))


def targeted_pods(endpoints: dict[str, Any], namespace: str) -> set[str]:
    """The names of the Pods of ``namespace`` an Endpoints (its addresses, ready or not)
    or an EndpointSlice (its endpoints) point to by ``targetRef``: the only addresses the
    apiserver proxies to (whatever the ref's kind: it reads a Pod of that name)."""
    refs: list[Any] = []
    for subset in _dicts(endpoints.get("subsets")):
        for key in ("addresses", "notReadyAddresses"):
            refs.extend(a.get("targetRef") for a in _dicts(subset.get(key)))
    refs.extend(e.get("targetRef") for e in _dicts(endpoints.get("endpoints")))
    return {
        ref["name"]
        for ref in _dicts(refs)
        if ref.get("namespace", namespace) == namespace
        and isinstance(ref.get("name"), str)
        and ref["name"]
    }


def _dicts(items: Any) -> list[dict[str, Any]]:
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _name(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""
