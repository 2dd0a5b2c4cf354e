"""A cluster state of a few objects' metadata, as the watch cache holds them: ``Meta``,
``OwnerRef``, ``State`` and ``owner`` (a controller reference)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Meta:
    """An object's metadata as the cluster state holds it (``engine.context.ObjectMeta``)."""

    kind: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[tuple[str, str, str, bool], ...] = ()


def OwnerRef(kind: str, name: str, uid: str, controller: bool) -> tuple[str, str, str, bool]:  # noqa: N802
    return (kind, name, uid, controller)


class State:
    """A cluster state of a few objects' metadata, as the watch cache holds them."""

    def __init__(self, objects: Iterable[Meta], synced: bool = True) -> None:
        self.objects = list(objects)
        self.all_synced = synced

    def get(self, kind: str, namespace: str, name: str) -> Meta | None:
        return next(
            (o for o in self.objects if (o.kind, o.namespace, o.name) == (kind, namespace, name)),
            None,
        )

    def by_uid(self, uid: str) -> Meta | None:
        return next((o for o in self.objects if o.uid == uid), None)

    def synced(self, kind: str) -> bool:
        return self.all_synced

    def has_priority_class(self, name: str) -> bool:
        return True  # the classes the policy names exist: ownership is what is tested

    def has_runtime_class(self, name: str) -> bool:
        return True


def owner(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": kind, "name": name, "uid": uid, "controller": True}
