"""The apiserver as the watch process and the offline tools reading a cluster ask it:
GET requests with a ``kubernetes`` client's configuration, raw JSON or a stream back,
an error status as ``ApiError`` (``Gone`` on 410), and where a kind is served
(``resource_path``, ``discover`` for an operator's ``GROUP/Kind``).

Every request of the watch asks for ``PartialObjectMetadata`` (``LIST_ACCEPT``,
``WATCH_ACCEPT``) and for nothing else, so the apiserver answers with metadata or with
an error, never with a Secret's ``data``. The ``kubernetes`` package is imported only
when a client is made (``api_client``): the readers of the cluster state never do.
"""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import urlencode

import orjson

from webhook.clusterstate.model import CLUSTER_SCOPED, KINDS, RESOURCES, split_group_kind
from webhook.inputs import kubeconfig

__all__ = [
    "LIST_ACCEPT",
    "WATCH_ACCEPT",
    "Api",
    "ApiError",
    "Gone",
    "NotInstalled",
    "Resource",
    "api_client",
    "discover",
    "resource_path",
]

LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0  # a list page
MAX_MESSAGE = 300  # of an apiserver error, in logs


class ApiError(Exception):
    """The apiserver answered with an error status (or not at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


class Gone(ApiError):
    """410: the resourceVersion (or the ``continue`` token) is too old: list again."""


class NotInstalled(ApiError):
    """Discovery found no listable resource of an operator's kind (CRD not installed)."""


class Resource(NamedTuple):
    """Where the apiserver serves a kind."""

    group: str
    version: str
    resource: str  # the plural: "workflows"
    namespaced: bool

    @property
    def path(self) -> str:
        if not self.group:
            return f"/api/{self.version}/{self.resource}"
        return f"/apis/{self.group}/{self.version}/{self.resource}"


def resource_path(kind: str) -> str:
    return Resource(*RESOURCES[kind], namespaced=kind not in CLUSTER_SCOPED).path


def discover(api: Api, group_kind: str) -> Resource:
    """Where the apiserver serves ``group_kind`` ("argoproj.io/Workflow"): its group's
    preferred version first, then its other versions; the resource whose ``kind`` it
    is, not a subresource, that can be listed and watched. ``NotInstalled`` when there
    is none (the group is unknown: 404), ``ApiError`` when discovery fails."""
    group, kind = split_group_kind(group_kind)
    for version in _versions(api, group):
        listed = _get_or_none(api, f"/apis/{group}/{version}")
        if listed is None:  # removed since the group was read
            continue
        for resource in listed.get("resources") or ():
            if _watchable(resource, kind):
                name = str(resource["name"])
                return Resource(group, version, name, bool(resource.get("namespaced", True)))
    raise NotInstalled(404, f"the API group {group} serves no {kind}")


def _versions(api: Api, group: str) -> list[str]:
    """The group's versions, the preferred first."""
    found = _get_or_none(api, f"/apis/{group}")
    if found is None:
        raise NotInstalled(404, f"the apiserver serves no API group {group}")
    preferred = str((found.get("preferredVersion") or {}).get("version") or "")
    versions = [str(v.get("version") or "") for v in found.get("versions") or ()]
    return list(dict.fromkeys(v for v in (preferred, *versions) if v))


def _get_or_none(api: Api, path: str) -> Any:
    """The JSON at ``path``, None on a 404."""
    try:
        return api.get_json(path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _watchable(resource: Any, kind: str) -> bool:
    """A discovery entry for ``kind`` itself (not a subresource) that can be listed and
    watched."""
    name = str(resource.get("name") or "")
    verbs = resource.get("verbs") or ()
    return (
        resource.get("kind") == kind
        and bool(name)
        and "/" not in name
        and "list" in verbs
        and "watch" in verbs
    )


class Api:
    """GET requests to the apiserver with a ``kubernetes`` client's configuration (host,
    TLS, credentials refreshed as the client refreshes them), raw JSON back."""

    def __init__(self, api_client: Any) -> None:
        self._configuration = api_client.configuration
        self._pool = api_client.rest_client.pool_manager

    def get(self, path: str, query: dict[str, str], accept: str, read_timeout: float) -> Any:
        """The open response to ``GET path?query`` (a urllib3 response, not read)."""
        import urllib3

        headers = {"Accept": accept, "User-Agent": "runguard-cluster-state"}
        bearer = self._configuration.auth_settings().get("BearerToken")
        if bearer and bearer.get("value"):
            headers["Authorization"] = bearer["value"]
        url = f"{self._configuration.host}{path}" + (f"?{urlencode(query)}" if query else "")
        try:
            response = self._pool.request(
                "GET",
                url,
                headers=headers,
                timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=read_timeout),
                preload_content=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from None
        if response.status != 200:
            body = response.read(65536)
            response.release_conn()
            message = _status_message(body) or response.reason or ""
            cls = Gone if response.status == 410 else ApiError
            raise cls(response.status, message)
        return response

    def get_json(self, path: str) -> Any:
        """``GET path`` (a discovery document), decoded."""
        response = self.get(path, {}, "application/json", READ_TIMEOUT)
        try:
            return orjson.loads(response.read())
        except orjson.JSONDecodeError as exc:
            raise ApiError(0, f"{path}: not JSON: {exc}") from None
        finally:
            response.release_conn()


def _status_message(body: bytes) -> str:
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return str(message)[:MAX_MESSAGE] if message else ""


def api_client(source: str, watches: int = len(KINDS)) -> Any:
    """A ``kubernetes`` client: ``in-cluster`` (the pod's ServiceAccount) or the path
    of a kubeconfig file (its current context), with a connection for each of
    ``watches`` at once."""
    from kubernetes import client

    configuration = kubeconfig.configuration(source)
    configuration.connection_pool_maxsize = watches + 2  # a watch per kind, at once
    return client.ApiClient(configuration)
