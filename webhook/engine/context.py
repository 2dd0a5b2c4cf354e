"""Who asks, and what the cluster holds: the context ownership decisions need.

The engine stays pure: the server hands it the request's user and a read-only view of
the cluster (a watch cache online, a file offline); nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class ObjectMeta(Protocol):
    """What the engine reads of an object in the cluster: metadata, and of a project's
    profile its spec (JSON text, ``spec``; "" for every other kind)."""

    @property
    def kind(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def owners(self) -> Sequence[tuple[str, str, str, bool]]: ...  # kind, name, uid, controller
    @property
    def spec(self) -> str: ...


class ClusterView(Protocol):
    """A read-only view of the objects decisions need (``webhook.clusterstate``)."""

    def get(self, kind: str, namespace: str, name: str) -> ObjectMeta | None: ...
    def by_uid(self, uid: str) -> ObjectMeta | None: ...
    def synced(self, kind: str) -> bool: ...
    def in_namespace(self, kind: str, namespace: str) -> Sequence[ObjectMeta]: ...
    def has_priority_class(self, name: str) -> bool: ...
    def has_runtime_class(self, name: str) -> bool: ...


@dataclass(frozen=True)
class Requester:
    """The user of the admission request (``request.userInfo``)."""

    username: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Context:
    """Everything a decision may need beyond the object and the policy.

    ``requester`` None: unknown (offline without ``--as``), never a platform identity.
    ``state`` None: no cluster view (offline without ``--cluster-state``): an object the
    decision needs is then missing, which fails closed.
    """

    requester: Requester | None = None
    state: ClusterView | None = None
    operation: str = "CREATE"
    subresource: str = ""
    resource: str = ""  # GROUP/resource the request is for (``ray.io/rayclusters``)


NO_CONTEXT = Context()


@dataclass(frozen=True)
class Ownership:
    """Whether the object is the platform's; ``unknown`` names what the cache lacks to say."""

    platform: bool
    unknown: str | None = None


OWNERSHIP_OFF = Ownership(True)  # ownership checks off (no platform.identities): names decide


def cluster_lacks(context: Context, kind: str, name: str) -> bool:
    """True when the cluster view is known to lack ``name`` (the cluster must
    have what runguard writes). No view, or one not synced yet: not known to lack it."""
    state = context.state
    if state is None or not state.synced(kind):
        return False
    if kind == "PriorityClass":
        return not state.has_priority_class(name)
    return not state.has_runtime_class(name)


def namespace_labels(context: Context, namespace: str) -> Mapping[str, str] | None:
    """The labels of Namespace ``namespace`` as the cluster view holds it; None when
    the view does not hold it (no view, not synced yet, or no such Namespace): a
    decision that needs them then fails closed."""
    state = context.state
    if state is None or not namespace or not state.synced("Namespace"):
        return None
    meta = state.get("Namespace", "", namespace)
    return None if meta is None else meta.labels


PROJECT_PROFILE = "ProjectProfile"  # a project's own profile, in its namespace


def project_profile_spec(context: Context, namespace: str, name: str) -> str | None:
    """The spec (JSON text) of ProjectProfile ``namespace/name``; None when the view
    holds none (no view, the kind not listed: CRD not installed, not synced yet)."""
    state = context.state
    if state is None or not namespace or not state.synced(PROJECT_PROFILE):
        return None
    meta = state.get(PROJECT_PROFILE, namespace, name)
    return None if meta is None else meta.spec


def project_profile_names(context: Context, namespace: str) -> list[str]:
    """The names of the ProjectProfiles of ``namespace`` the view holds."""
    state = context.state
    if state is None or not namespace or not state.synced(PROJECT_PROFILE):
        return []
    return [meta.name for meta in state.in_namespace(PROJECT_PROFILE, namespace)]
