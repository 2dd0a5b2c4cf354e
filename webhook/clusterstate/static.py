"""Cluster state from tables: the lookups every ``ClusterState`` here shares, and the
offline one, read from a file (``runguard apply --cluster-state FILE``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from webhook.clusterstate.model import (
    CLUSTER_SCOPED,
    KINDS,
    OPERATOR_CORE_KINDS,
    ClusterStateError,
    KindStats,
    Meta,
    meta_from_object,
    split_group_kind,
)
from webhook.clusterstate.table import Table, decode_record, encode_record, table_from_records
from webhook.inputs.documents import InputError, is_list, list_items, read_objects
from webhook.inputs.limits import CLUSTER_STATE_FILES

__all__ = ["StaticClusterState", "TableState"]


class TableState:
    """A ``ClusterState`` over one ``Table`` per kind; ``tables()`` gives the current ones."""

    def tables(self) -> Mapping[str, Table]:
        raise NotImplementedError

    def get(self, kind: str, namespace: str, name: str) -> Meta | None:
        table = self.tables().get(kind)
        if table is None:
            return None
        return table.get("" if kind in CLUSTER_SCOPED else namespace, name)

    def by_uid(self, uid: str) -> Meta | None:
        if not uid:
            return None
        for table in self.tables().values():
            if table.count:
                meta = table.by_uid(uid)
                if meta is not None:
                    return meta
        return None

    def in_namespace(self, kind: str, namespace: str) -> list[Meta]:
        """Every object of ``kind`` (GROUP/Kind, or its Kind alone, as operators' kinds are
        kept) in ``namespace``: a scan of the kind's table, for the operators' kinds (an
        operator's selector names its objects by label, which no index holds)."""
        name = split_group_kind(kind)[1]
        return [
            meta
            for table in self.tables().values()
            if table.kind == name and table.count
            for meta in (decode_record(name, record) for record in table.records())
            if meta.namespace == namespace
        ]

    def has_priority_class(self, name: str) -> bool:
        return self.get("PriorityClass", "", name) is not None

    def has_runtime_class(self, name: str) -> bool:
        return self.get("RuntimeClass", "", name) is not None


class StaticClusterState(TableState):
    """A fixed cluster state: the objects given, of any kind (Namespaces and operators'
    custom resources included), every kind synced (an object absent from them does not
    exist). Of a core kind operators own Pods through (``Pod``), only those the watch
    would keep (runguard's RunPolicy label): offline sees what online sees."""

    def __init__(self, metas: Iterable[Meta] = ()) -> None:
        records: dict[str, list[bytes]] = {kind: [] for kind in KINDS}
        for meta in metas:
            core = OPERATOR_CORE_KINDS.get(meta.kind)
            if core is not None and core[2] not in meta.labels:
                continue
            records.setdefault(meta.kind, []).append(encode_record(meta))
        self._tables = {kind: table_from_records(kind, rs) for kind, rs in records.items()}
        self._version = secrets.token_hex(16)  # this fixed state, and no other

    def version(self) -> str:
        """Never changes: the receipts of ``webhook.engine.receipts`` name this state."""
        return self._version

    @classmethod
    def from_documents(cls, objects: Iterable[Any]) -> StaticClusterState:
        """From API objects (``kind: List`` and typed lists flattened); a Secret's
        ``data``/``stringData`` and a ConfigMap's ``data``/``binaryData`` are never kept."""
        metas = []
        for index, obj in enumerate(_flatten(objects)):
            try:
                metas.append(meta_from_object(obj))
            except ClusterStateError as exc:
                raise ClusterStateError(f"object {index + 1}: {exc}") from None
        return cls(metas)

    @classmethod
    def from_file(cls, path: Path | str) -> StaticClusterState:
        """From a multi-document YAML or JSON file (``-``: stdin)."""
        try:
            objects = read_objects(str(path), CLUSTER_STATE_FILES)
        except InputError as exc:
            raise ClusterStateError(str(exc)) from None
        try:
            return cls.from_documents(objects)
        except ClusterStateError as exc:
            raise ClusterStateError(f"{path}: {exc}") from None

    def tables(self) -> Mapping[str, Table]:
        return self._tables

    def synced(self, kind: str) -> bool:
        # A fixed state is complete: a kind it holds no object of has none.
        return True

    def stats(self) -> Mapping[str, KindStats]:
        return {k: KindStats(objects=t.count, synced=True) for k, t in self._tables.items()}


def _flatten(objects: Iterable[Any]) -> Iterable[Any]:
    for obj in objects:
        if is_list(obj):
            yield from _flatten(list_items(obj))
        else:
            yield obj
