"""What ``runguard explain`` and ``runguard whatif`` read from a live cluster, once.

``read_view`` lists the metadata of the kinds asked for (``PartialObjectMetadataList``,
as the server's cluster-state watch does: never a Secret's data), page by page, into a
cluster view: the Namespaces' labels a profile's ``namespaceSelector`` reads,
the PriorityClasses and RuntimeClasses a profile names, a run's claims and Secrets. A
kind the caller may not list (403) is left out, and said: the decisions that need it
fail closed. ``read_object`` gets one object whole. Requests go through the
``kubernetes`` client's configuration (``webhook.clusterstate.api.Api``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from webhook.clusterstate.api import LIST_ACCEPT, READ_TIMEOUT, Api, ApiError
from webhook.clusterstate.model import (
    CLUSTER_SCOPED,
    RESOURCES,
    SPEC_KINDS,
    ClusterStateError,
    Meta,
    meta_from_object,
)
from webhook.clusterstate.static import StaticClusterState

PAGE_SIZE = 500
MAX_PAGES = 100_000  # per kind: far above any real cluster
# What a what-if needs besides the runs: which namespaces may use which profile, and
# whether the classes a profile names exist.
# A project's own profiles (ProjectProfile), read whole: a run may name one. The claim
# templates (ResourceClaimTemplate), read whole: their devices count against a run's
# maximums (Kubernetes 1.34 and later; left out, said so, where not served).
WHATIF_KINDS = (
    "Namespace",
    "PriorityClass",
    "RuntimeClass",
    "ProjectProfile",
    "ResourceClaimTemplate",
)
# Namespaced kinds read here, not in the cluster-state model's table: runguard's own, and
# the claim templates.
OWN_RESOURCES = {
    "ProjectProfile": ("runguard.io", "v1", "projectprofiles"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
}
# Where a Pod's controller keeps the template it was made from.
TEMPLATE_OWNERS = frozenset({"Job", "ReplicaSet", "StatefulSet", "DaemonSet"})
API_VERSIONS = {
    "Pod": "v1",
    **{k: f"{g}/{v}" if g else v for k, (g, v, _) in {**RESOURCES, **OWN_RESOURCES}.items()},
}


def group_resource(kind: str) -> tuple[str, str]:
    """(API group, resource) of a kind read here: what RBAC grants ``list`` on."""
    group, _, resource = OWN_RESOURCES.get(kind) or RESOURCES[kind]
    return group, resource


def path_of(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """The API path of a kind (in ``namespace`` when it is namespaced), or of one object."""
    group, version, resource = (
        ("", "v1", "pods") if kind == "Pod" else OWN_RESOURCES.get(kind) or RESOURCES[kind]
    )
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace and kind not in CLUSTER_SCOPED:
        base += f"/namespaces/{namespace}"
    return f"{base}/{resource}" + (f"/{name}" if name else "")


def read_object(api_client: Any, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One object, whole (None: not found); ``ApiError`` for any other answer."""
    try:
        response = Api(api_client).get(
            path_of(kind, namespace, name), {}, "application/json", READ_TIMEOUT
        )
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    try:
        obj = orjson.loads(response.read())
    finally:
        response.release_conn()
    if not isinstance(obj, dict):
        raise ApiError(0, f"{kind} {namespace}/{name}: not an object")
    obj.setdefault("kind", kind)
    obj.setdefault("apiVersion", API_VERSIONS.get(kind, "v1"))
    return obj


class ReadState(StaticClusterState):
    """The objects of the kinds read, complete for those kinds; any other kind is not
    synced, so the decisions needing it fail closed, as they do without a view (a
    ``StaticClusterState`` would say its objects do not exist)."""

    def __init__(self, metas: Iterable[Meta], kinds: Iterable[str]) -> None:
        super().__init__(metas)
        self.kinds = frozenset(kinds)

    def synced(self, kind: str) -> bool:
        return kind in self.kinds


def read_view(
    api_client: Any, kinds: Iterable[str], namespace: str | None = None
) -> tuple[ReadState, list[str]]:
    """The cluster view of ``kinds`` (namespaced kinds in ``namespace`` only, when given;
    the Namespace then alone), and a line per kind left out because it may not be read."""
    api = Api(api_client)
    metas: list[Meta] = []
    left_out: list[str] = []
    read: list[str] = []
    for kind in kinds:
        query = {"limit": str(PAGE_SIZE)}
        if kind == "Namespace" and namespace:
            query["fieldSelector"] = f"metadata.name={namespace}"
        try:
            metas.extend(_listed(api, kind, path_of(kind, namespace), query))
        except ApiError as exc:
            if exc.status not in (401, 403, 404):
                raise
            left_out.append(f"{kind}: {exc}")
        else:
            read.append(kind)
    return ReadState(metas, read), left_out


def _listed(api: Api, kind: str, path: str, query: dict[str, str]) -> Iterable[Meta]:
    token = ""
    for _ in range(MAX_PAGES):
        accept = "application/json" if kind in SPEC_KINDS else LIST_ACCEPT  # spec kept
        response = api.get(path, {**query, "continue": token} if token else query,
                           accept, READ_TIMEOUT)  # fmt: skip
        try:
            page = orjson.loads(response.read())
        except orjson.JSONDecodeError as exc:
            raise ApiError(0, f"the list of {kind} is not JSON: {exc}") from None
        finally:
            response.release_conn()
        for item in page.get("items") or ():
            try:
                yield meta_from_object(item, kind)
            except ClusterStateError:
                continue  # an object the apiserver would not serve: nothing to decide with
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return
    raise ApiError(0, f"the list of {kind} has more than {MAX_PAGES} pages")
