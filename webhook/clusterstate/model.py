"""What runguard knows of the cluster: object metadata, and the read-only interface to it.

Pure: no I/O, no clock, no Kubernetes client. The engine decides with a ``ClusterState``;
where it comes from (a file offline, the watch cache online) is not its business.

Only metadata is ever kept, and not all of it: kind, namespace, name, uid, labels,
annotations and ownerReferences; of a project's profile (``PROJECT_PROFILES``, runguard's
own, holding no secret) and a ResourceClaimTemplate, their spec too, which the engine
decides with; of a run Pod and a ResourceClaim a Pod owns, the devices they ask for and
nothing else of their spec (``device_spec``): a claim made late is judged with the run's
other devices.
``meta_from_object`` is the one door into a record: it drops everything else (a
Secret's ``data`` and ``stringData``, a ConfigMap's ``binaryData``, other specs, status,
``managedFields``) and the
``kubectl.kubernetes.io/last-applied-configuration`` annotation, which holds the whole
manifest ``kubectl apply`` sent, a Secret's data included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

import orjson

from webhook.keys import POLICY_LABEL

__all__ = [
    "CLAIM_TEMPLATES",
    "CLUSTER_SCOPED",
    "CONTROLLER_KINDS",
    "DEVICE_CLAIMS",
    "DEVICE_SPEC_KINDS",
    "KINDS",
    "LAST_APPLIED",
    "MAX_ANNOTATION_VALUE",
    "MAX_OPERATOR_KINDS",
    "OPERATOR_CORE_KINDS",
    "PROJECT_PROFILES",
    "RUN_PODS",
    "RESOURCES",
    "SPEC_KINDS",
    "ClusterState",
    "ClusterStateError",
    "KindStats",
    "Meta",
    "OwnerRef",
    "controller_chain",
    "device_spec",
    "meta_from_object",
    "split_group_kind",
]

# The kinds runguard decides with, as the API names them (``kind`` of the object).
KINDS: tuple[str, ...] = (
    "PersistentVolumeClaim",
    "Secret",
    "ConfigMap",
    "PriorityClass",
    "RuntimeClass",
    "Job",
    "CronJob",
    "ReplicaSet",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "Namespace",  # its labels: a profile's namespaceSelector
)
# Where the API serves each kind: (group, version, resource).
RESOURCES: dict[str, tuple[str, str, str]] = {
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "Secret": ("", "v1", "secrets"),
    "ConfigMap": ("", "v1", "configmaps"),
    "PriorityClass": ("scheduling.k8s.io", "v1", "priorityclasses"),
    "RuntimeClass": ("node.k8s.io", "v1", "runtimeclasses"),
    "Job": ("batch", "v1", "jobs"),
    "CronJob": ("batch", "v1", "cronjobs"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "DaemonSet": ("apps", "v1", "daemonsets"),
    "Namespace": ("", "v1", "namespaces"),
}
CLUSTER_SCOPED = frozenset({"PriorityClass", "RuntimeClass", "Namespace"})
# Kinds whose objects own Pods (directly or through another controller).
CONTROLLER_KINDS = frozenset(
    {"Job", "CronJob", "ReplicaSet", "Deployment", "StatefulSet", "DaemonSet"}
)
# Operators' custom resource kinds (``platform.operators``, "GROUP/Kind") the watch keeps
# besides ``KINDS``: the publication reserves this many slots for them, so its layout
# stays fixed; kinds beyond it are not watched (their decisions fail closed).
MAX_OPERATOR_KINDS = 16
# Core kinds an operator may own Pods through (a Spark driver Pod owns its executors),
# kept in an operator slot only when a policy names them: (version, resource, label
# selector). Only the objects runguard governs are listed (its RunPolicy label, written
# on each run Pod), so the memory stays bounded by the runs, not by every Pod.
OPERATOR_CORE_KINDS: dict[str, tuple[str, str, str]] = {
    "Pod": ("v1", "pods", POLICY_LABEL),
}
# ResourceClaims, watched in an operator slot (the first) whatever the policy: a claim a
# controller made for one Pod is that Pod's (``webhook.engine.rules.podclaims``). Found
# through discovery (resource.k8s.io/v1 from Kubernetes 1.34, v1beta1 before where
# dynamic resource allocation is on); not served, it is marked so and Pods naming an
# existing claim fail closed, as no such Pod is admitted by that apiserver anyway.
DEVICE_CLAIMS = "resource.k8s.io/ResourceClaim"
# Projects' own profiles, watched in an operator slot (the second) whatever the policy,
# with their spec (``SPEC_KINDS``): a run names one of its namespace. Not installed (the
# CRD absent), a run names installation-wide profiles only.
PROJECT_PROFILES = "runguard.io/ProjectProfile"
# ResourceClaimTemplates, with their spec (``SPEC_KINDS``), watched in an operator slot
# (the third) whatever the policy: the devices a run's templates ask for are counted
# against its maximums (``webhook.engine.rules.dra``). Not served (no dynamic resource
# allocation), no Pod naming one is admitted by that apiserver anyway.
CLAIM_TEMPLATES = "resource.k8s.io/ResourceClaimTemplate"
# Run Pods (by runguard's RunPolicy label, ``OPERATOR_CORE_KINDS``), watched in an
# operator slot (the fourth) whatever the policy: a ResourceClaim made for a Pod is judged
# against the RunPolicy of the run it is for (``webhook.engine.rules.dra``).
RUN_PODS = "Pod"
# Kinds whose spec is kept, as JSON text (``Meta.spec``), at most MAX_SPEC bytes of it:
# whole, or (``DEVICE_SPEC_KINDS``) only what asks for devices (``device_spec``).
DEVICE_SPEC_KINDS = frozenset({"Pod", "ResourceClaim"})
SPEC_KINDS = frozenset({"ProjectProfile", "ResourceClaimTemplate"}) | DEVICE_SPEC_KINDS
MAX_SPEC = 65536
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# An annotation value longer than this is not kept (memory stays bounded whatever other
# tools write); runguard's own stamps are far shorter.
MAX_ANNOTATION_VALUE = 4096

_EMPTY: Mapping[str, str] = MappingProxyType({})


class ClusterStateError(ValueError):
    """Objects that cannot be read as cluster state; the message says which and why."""


def split_group_kind(group_kind: str) -> tuple[str, str]:
    """("argoproj.io", "Workflow") of "argoproj.io/Workflow" (group "" for the core API)."""
    group, _, kind = group_kind.rpartition("/")
    return group, kind


class OwnerRef(NamedTuple):
    """One ``metadata.ownerReferences`` entry, as far as ownership needs it."""

    kind: str
    name: str
    uid: str
    controller: bool


@dataclass(frozen=True, slots=True)
class Meta:
    """The metadata of one object. ``namespace`` is ``""`` for a cluster-scoped kind."""

    kind: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    owners: tuple[OwnerRef, ...] = ()
    spec: str = ""  # of a kind of SPEC_KINDS: its spec as JSON text ("": absent, too long)

    def controller(self) -> OwnerRef | None:
        """The owner reference marked ``controller: true`` (at most one is allowed)."""
        for owner in self.owners:
            if owner.controller:
                return owner
        return None


@dataclass(frozen=True)
class KindStats:
    """How the state of one kind is doing (``ClusterState.stats()``, for metrics)."""

    objects: int = 0
    synced: bool = False
    last_event: float = 0.0  # unix time of the last change seen (0: none yet)
    last_sync: float = 0.0  # unix time the last complete list ended
    relists: int = 0  # complete lists after the first one (a 410 Gone, repeated errors)
    watch_errors: int = 0
    events: int = 0  # changes applied since the first list


@runtime_checkable
class ClusterState(Protocol):
    """The read-only view of the cluster the engine decides with.

    A lookup of a kind that is not ``synced`` answers None as if the object did not
    exist: a decision that needs one must check ``synced(kind)`` first and fail closed,
    naming the kind.
    """

    def get(self, kind: str, namespace: str, name: str) -> Meta | None:
        """The object ``kind`` ``namespace/name`` (namespace ``""`` if cluster-scoped)."""
        ...

    def by_uid(self, uid: str) -> Meta | None:
        """The object, of any kind, whose ``metadata.uid`` is ``uid``."""
        ...

    def in_namespace(self, kind: str, namespace: str) -> list[Meta]:
        """Every object of ``kind`` in ``namespace``."""
        ...

    def has_priority_class(self, name: str) -> bool: ...

    def has_runtime_class(self, name: str) -> bool: ...

    def synced(self, kind: str) -> bool:
        """True once every object of ``kind`` has been listed (and watched since)."""
        ...

    def stats(self) -> Mapping[str, KindStats]:
        """By kind, for metrics and ``/readyz``."""
        ...


def controller_chain(state: ClusterState, meta: Meta, max_depth: int = 8) -> tuple[Meta, ...]:
    """The controllers of ``meta`` by uid, nearest first: a Pod's ReplicaSet, then its
    Deployment (a Job, then its CronJob).

    A reference counts only if the object with its uid exists with the kind and name
    the reference gives, in the same namespace: an ``ownerReferences`` entry is written
    by whoever writes the object. Stops at a missing owner, a mismatch, a loop or
    ``max_depth``.
    """
    chain: list[Meta] = []
    seen = {meta.uid}
    current = meta
    while len(chain) < max_depth:
        ref = current.controller()
        if ref is None or ref.uid in seen:
            break
        owner = state.by_uid(ref.uid)
        if (
            owner is None
            or owner.kind != ref.kind
            or owner.name != ref.name
            or owner.namespace != current.namespace
        ):
            break
        chain.append(owner)
        seen.add(owner.uid)
        current = owner
    return tuple(chain)


def meta_from_object(obj: Any, kind: str | None = None) -> Meta:
    """The ``Meta`` of an API object or a ``PartialObjectMetadata`` (``kind`` given),
    keeping only what ownership decides with (see module doc)."""
    if not isinstance(obj, Mapping):
        raise ClusterStateError(f"an object must be a mapping, not {type(obj).__name__}")
    kind = kind or obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ClusterStateError("an object without a kind")
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        raise ClusterStateError(f"{kind} without metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ClusterStateError(f"{kind} without metadata.name")
    if kind in KINDS:
        namespace = "" if kind in CLUSTER_SCOPED else metadata.get("namespace") or "default"
    else:
        # Any other kind (an operator's custom resource): namespaced when the
        # export says so, as `kubectl get -o yaml` always does for namespaced objects.
        namespace = metadata.get("namespace") or ""
    uid = metadata.get("uid") or ""
    where = f"{kind} {namespace + '/' if namespace else ''}{name}"
    if not isinstance(namespace, str) or not isinstance(uid, str):
        raise ClusterStateError(f"{where}: namespace and uid must be strings")
    owners = _owners(metadata.get("ownerReferences"), where)
    return Meta(
        kind=kind,
        namespace=namespace,
        name=name,
        uid=uid,
        labels=_strings(metadata.get("labels"), where, "labels"),
        annotations=_annotations(metadata.get("annotations"), where),
        owners=owners,
        spec=_kept_spec(kind, obj.get("spec"), owners),
    )


def _kept_spec(kind: str, spec: Any, owners: tuple[OwnerRef, ...]) -> str:
    """What ``Meta.spec`` keeps: a ``SPEC_KINDS`` spec, of a run Pod and a claim a Pod owns
    only what asks for devices; "" for any other kind or claim."""
    if kind not in SPEC_KINDS:
        return ""
    if kind in DEVICE_SPEC_KINDS:
        pod_owned = any(o.controller and o.kind == "Pod" for o in owners)
        spec = device_spec(kind, spec) if kind == "Pod" or pod_owned else None
    return _spec(spec)


def device_spec(kind: str, spec: Any) -> dict[str, Any] | None:
    """What of a Pod's or a ResourceClaim's spec asks for devices (None: nothing): a
    claim's ``devices.requests``; a Pod's ``resourceClaims`` and its containers' extended
    resources (a name with a ``/``), init containers' ``restartPolicy`` with them, as
    ``effective_totals`` reads them. No command, env or image is kept."""
    if not isinstance(spec, Mapping):
        return None
    if kind == "ResourceClaim":
        devices = spec.get("devices")
        requests = devices.get("requests") if isinstance(devices, Mapping) else None
        return {"devices": {"requests": requests}} if requests is not None else None
    kept: dict[str, Any] = {}
    for part in ("initContainers", "containers"):
        containers = [_extended(c) for c in spec.get(part) or () if isinstance(c, Mapping)]
        if any(containers):
            kept[part] = [c for c in containers if c]
    claims = spec.get("resourceClaims")
    if isinstance(claims, list) and claims:
        kept["resourceClaims"] = claims
    return kept or None


def _extended(container: Mapping[str, Any]) -> dict[str, Any]:
    """A container's extended resources ({} when none), as ``resources.requests/limits``."""
    res = container.get("resources")
    kept: dict[str, Any] = {}
    for part in ("requests", "limits"):
        values = res.get(part) if isinstance(res, Mapping) else None
        if isinstance(values, Mapping):
            extended = {k: v for k, v in values.items() if isinstance(k, str) and "/" in k}
            if extended:
                kept[part] = extended
    if not kept:
        return {}
    out: dict[str, Any] = {"resources": kept}
    if container.get("restartPolicy") is not None:
        out["restartPolicy"] = container["restartPolicy"]
    return out


def _spec(value: Any) -> str:
    """A kept spec as JSON text (keys sorted: equal specs, equal text); "" when absent
    or longer than MAX_SPEC (a decision naming it then fails closed)."""
    if not isinstance(value, Mapping):
        return ""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return ""
    return text if len(text) <= MAX_SPEC else ""


def _strings(value: Any, where: str, key: str) -> Mapping[str, str]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise ClusterStateError(f"{where}: metadata.{key} must map strings to strings")
    for k, v in value.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            raise ClusterStateError(f"{where}: metadata.{key} must map strings to strings")
    return MappingProxyType(dict(value)) if value else _EMPTY


def _annotations(value: Any, where: str) -> Mapping[str, str]:
    kept = _strings(value, where, "annotations")
    if any(k == LAST_APPLIED or len(v) > MAX_ANNOTATION_VALUE for k, v in kept.items()):
        kept = MappingProxyType(
            {k: v for k, v in kept.items() if k != LAST_APPLIED and len(v) <= MAX_ANNOTATION_VALUE}
        )
    return kept


def _owners(value: Any, where: str) -> tuple[OwnerRef, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ClusterStateError(f"{where}: metadata.ownerReferences must be a list")
    owners = []
    for ref in value:
        if not isinstance(ref, Mapping):
            raise ClusterStateError(f"{where}: an ownerReferences entry must be a mapping")
        kind, name, uid = ref.get("kind"), ref.get("name"), ref.get("uid")
        if not (isinstance(kind, str) and isinstance(name, str) and isinstance(uid, str)):
            raise ClusterStateError(f"{where}: ownerReferences need kind, name and uid")
        owners.append(OwnerRef(kind, name, uid, ref.get("controller") is True))
    return tuple(owners)
