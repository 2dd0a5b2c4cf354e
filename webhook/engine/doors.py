"""Every field of a Pod spec that names another object: the doors.

One table, read by the engine (``ownership.platform_references``: which of the
platform's objects a pod spec uses) and by the webhook configurations' CEL
(``webhook.manifests``: which pods reach runguard), so what the engine judges and what
the apiserver sends cannot drift. ``tests/test_doors.py`` walks the Kubernetes API schema
(the ``kubernetes`` client's models of the newest supported release) and fails on any
field that names a Secret, ConfigMap, PersistentVolumeClaim, ServiceAccount or device
that is neither here nor in ``NOT_DOORS`` with the reason.

A path starts at the pod spec; ``*`` is every item of a list; ``CONTAINERS`` stands for
the three container lists (init, regular and ephemeral containers).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CONTAINERS", "DOORS", "NOT_DOORS", "Door", "references"]

CONTAINERS = "CONTAINERS"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class Door:
    """A field naming an object of ``kind``; ``when`` a sibling key and the value it must
    have for the field to name that kind (a typed reference: ``dataSource.kind``)."""

    kind: str
    path: tuple[str, ...]
    when: tuple[str, str] | None = None

    @property
    def text(self) -> str:
        return ".".join(self.path)


def _door(kind: str, path: str, when: tuple[str, str] | None = None) -> Door:
    return Door(kind, tuple(path.split(".")), when)


_CLAIM = ("kind", "PersistentVolumeClaim")
DOORS: tuple[Door, ...] = (
    # Secrets
    _door("Secret", "volumes.*.secret.secretName"),
    _door("Secret", "volumes.*.projected.sources.*.secret.name"),
    _door("Secret", "volumes.*.csi.nodePublishSecretRef.name"),
    _door("Secret", "volumes.*.flexVolume.secretRef.name"),
    _door("Secret", "volumes.*.cephfs.secretRef.name"),
    _door("Secret", "volumes.*.rbd.secretRef.name"),
    _door("Secret", "volumes.*.iscsi.secretRef.name"),
    _door("Secret", "volumes.*.cinder.secretRef.name"),
    _door("Secret", "volumes.*.scaleIO.secretRef.name"),
    _door("Secret", "volumes.*.storageos.secretRef.name"),
    _door("Secret", "volumes.*.azureFile.secretName"),
    _door("Secret", "CONTAINERS.*.env.*.valueFrom.secretKeyRef.name"),
    _door("Secret", "CONTAINERS.*.envFrom.*.secretRef.name"),
    _door("Secret", "imagePullSecrets.*.name"),
    # ConfigMaps
    _door("ConfigMap", "volumes.*.configMap.name"),
    _door("ConfigMap", "volumes.*.projected.sources.*.configMap.name"),
    _door("ConfigMap", "CONTAINERS.*.env.*.valueFrom.configMapKeyRef.name"),
    _door("ConfigMap", "CONTAINERS.*.envFrom.*.configMapRef.name"),
    # Claims, and claims cloned into a new one by a generic ephemeral volume
    _door("PersistentVolumeClaim", "volumes.*.persistentVolumeClaim.claimName"),
    _door(
        "PersistentVolumeClaim",
        "volumes.*.ephemeral.volumeClaimTemplate.spec.dataSource.name",
        _CLAIM,
    ),
    _door(
        "PersistentVolumeClaim",
        "volumes.*.ephemeral.volumeClaimTemplate.spec.dataSourceRef.name",
        _CLAIM,
    ),
    # Who the Pod runs as
    _door("ServiceAccount", "serviceAccountName"),
    _door("ServiceAccount", "serviceAccount"),
    # Devices by claim (dynamic resource allocation): devices only through requests
    _door("ResourceClaim", "resourceClaims.*.resourceClaimName"),
    _door("ResourceClaimTemplate", "resourceClaims.*.resourceClaimTemplateName"),
)

# Fields that name something yet are no door, and why (the schema test reads these).
NOT_DOORS: dict[str, str] = {
    "volumes.*.ephemeral.volumeClaimTemplate.spec.volumeName": (
        "a PersistentVolume, not a claim: any volumeName of a claim template is a "
        "pre-existing reference for the volumes rules, whatever its name"
    ),
    "volumes.*.ephemeral.volumeClaimTemplate.spec.storageClassName": (
        "a StorageClass provisions new, empty storage"
    ),
    "volumes.*.ephemeral.volumeClaimTemplate.spec.volumeAttributesClassName": (
        "a VolumeAttributesClass: storage parameters, no data"
    ),
    "volumes.*.scaleIO.volumeName": "a volume of the ScaleIO system: a forbidden volume type",
    "volumes.*.storageos.volumeName": "a volume of StorageOS: a forbidden volume type",
    "volumes.*.projected.sources.*.clusterTrustBundle.name": (
        "a ClusterTrustBundle: public CA certificates, readable by every Pod"
    ),
    "CONTAINERS.*.env.*.valueFrom.fileKeyRef.volumeName": (
        "names a volume of the Pod itself, which is judged as a volume"
    ),
    "runtimeClassName": "a RuntimeClass: the profile's and scheduling's (cluster_lacks)",
    "priorityClassName": "a PriorityClass: judged by scheduling.priority-class",
}


def _walk(node: Any, path: tuple[str, ...], where: str) -> Iterator[tuple[Any, str, Any]]:
    """(value, dotted path with indexes, parent) at ``path`` below ``node``."""
    if not path:
        yield node, where, None
        return
    head, rest = path[0], path[1:]
    if head == CONTAINERS:
        for name in CONTAINER_LISTS:
            items = node.get(name) if isinstance(node, dict) else None
            for i, item in enumerate(items if isinstance(items, list) else ()):
                yield from _walk(item, rest[1:], f"{where}{name}[{i}].")
        return
    if head == "*":
        for i, item in enumerate(node if isinstance(node, list) else ()):
            yield from _walk(item, rest, f"{where.rstrip('.')}[{i}].")
        return
    child = node.get(head) if isinstance(node, dict) else None
    if child is None:
        return
    if not rest:
        yield child, f"{where}{head}", node
        return
    yield from _walk(child, rest, f"{where}{head}.")


def references(spec: Any, kinds: frozenset[str] | None = None) -> Iterator[tuple[str, str, str]]:
    """(kind, name, path relative to the pod spec) of every object the spec names through
    a door, of ``kinds`` (None: all); reads defensively (any input, however malformed)."""
    for door in DOORS:
        if kinds is not None and door.kind not in kinds:
            continue
        for value, where, parent in _walk(spec, door.path, "spec."):
            if not isinstance(value, str) or not value:
                continue
            if door.when is not None:
                key, wanted = door.when
                if not isinstance(parent, dict) or parent.get(key) != wanted:
                    continue
            end = where.rfind("]")  # the item that holds the reference, if in a list
            yield door.kind, value, where[: end + 1] if end >= 0 else where
