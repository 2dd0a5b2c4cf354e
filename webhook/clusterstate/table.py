"""The objects of one kind, stored compactly: a read-only *base* and a small *overlay*.

A base is one buffer (``bytes``, or a file the readers ``mmap``, shared by every
process that maps it) holding the records and two sorted indexes::

    header | records: (u32 length, JSON record)... | by name: u64 hash[n], u64 offset[n]
                                                   | by uid:  u64 hash[n], u64 offset[n]

A record is the JSON array ``[namespace, name, uid, labels, annotations, owners]``
(``owners``: ``[kind, name, uid, controller]`` each), and ``spec`` after them where the
``Meta`` keeps one; a ``Meta`` is decoded from it on
lookup. An index is 16 bytes per object, searched by ``bisect`` straight on the
buffer. Hashes are 64-bit BLAKE2b of ``namespace NUL name`` and of the uid: the same in
every process (Python's ``hash`` is not), and a match is always checked against the
decoded record.

Changes since the base (a watch event) sit in the overlay: key -> record or None
(deleted), uid -> record or None; ``compacted()`` writes base and overlay into a new
base when the overlay grows.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import struct
from array import array
from collections.abc import Iterable, Iterator
from types import MappingProxyType
from typing import IO, Any

import orjson

from webhook.clusterstate.model import Meta, OwnerRef

__all__ = [
    "Record",
    "Table",
    "decode_record",
    "encode_record",
    "record_ids",
    "table_from_records",
    "write_base",
]

Record = bytes  # an encoded Meta, without its kind (a table holds one kind)

MAGIC = b"RGCS"
VERSION = 1
_HEADER = struct.Struct("<4sHHQQQQ")  # magic, version, 0, count, records end, key idx, uid idx
_LENGTH = struct.Struct("<I")
_WORD = 8
_OFFSET_BITS = 40  # a base is at most 1 TiB: hash << 40 | offset sorts by hash
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def encode_record(meta: Meta) -> Record:
    """The record of ``meta``: equal metadata, equal bytes (keys sorted)."""
    owners = [[o.kind, o.name, o.uid, o.controller] for o in meta.owners]
    fields = [meta.namespace, meta.name, meta.uid, meta.labels, meta.annotations, owners]
    if meta.spec:
        fields.append(meta.spec)
    return orjson.dumps(
        fields,
        option=orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS,
        default=dict,  # the read-only mappings of a Meta
    )


def decode_record(kind: str, record: Record | memoryview) -> Meta:
    namespace, name, uid, labels, annotations, owners, *spec = orjson.loads(record)
    return Meta(
        kind,
        namespace,
        name,
        uid,
        MappingProxyType(labels),
        MappingProxyType(annotations),
        tuple(OwnerRef(*owner) for owner in owners),
        spec[0] if spec else "",
    )


def _hash(text: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def key_hash(namespace: str, name: str) -> int:
    return _hash(f"{namespace}\0{name}".encode())


def uid_hash(uid: str) -> int:
    return _hash(uid.encode())


def record_ids(record: Record | memoryview) -> tuple[str, str, str]:
    """(namespace, name, uid) of a record."""
    namespace, name, uid, *_ = orjson.loads(record)
    return namespace, name, uid


def write_base(out: IO[bytes], records: Iterable[Record]) -> int:
    """Write a base holding ``records`` (each key once) to ``out`` (positioned at 0);
    returns the object count. Streams the records: what is held in memory is the two
    indexes, one Python int per object each (hash and offset in one, ~50 bytes)."""
    out.write(b"\0" * _HEADER.size)
    keys: list[int] = []
    uids: list[int] = []
    offset = _HEADER.size
    for record in records:
        namespace, name, uid = record_ids(record)
        keys.append(key_hash(namespace, name) << _OFFSET_BITS | offset)
        if uid:
            uids.append(uid_hash(uid) << _OFFSET_BITS | offset)
        out.write(_LENGTH.pack(len(record)))
        out.write(record)
        offset += _LENGTH.size + len(record)
    if offset >= 1 << _OFFSET_BITS:
        raise ValueError(f"a table of {offset} bytes is too large")
    end = offset
    pad = -offset % _WORD
    out.write(b"\0" * pad)
    offset += pad
    key_index = offset
    offset += _write_index(out, keys)
    uid_index = offset
    _write_index(out, uids)
    out.seek(0)
    out.write(_HEADER.pack(MAGIC, VERSION, 0, len(keys), end, key_index, uid_index))
    return len(keys)


def _write_index(out: IO[bytes], entries: list[int]) -> int:
    """A count, then the sorted hashes and their offsets, in this machine's byte order
    (the readers' ``memoryview.cast`` reads them in place). Sorts ``entries`` in place."""
    entries.sort()
    count = len(entries)
    out.write(struct.pack("<Q", count))
    out.write(array("Q", (e >> _OFFSET_BITS for e in entries)).tobytes())
    out.write(array("Q", (e & _OFFSET_MASK for e in entries)).tobytes())
    return _WORD * (1 + 2 * count)


def base_bytes(records: Iterable[Record]) -> bytes:
    out = io.BytesIO()
    write_base(out, records)
    return out.getvalue()


class _Index:
    """A sorted hash array and its parallel offsets, read in place."""

    def __init__(self, view: memoryview, offset: int) -> None:
        (count,) = struct.unpack_from("<Q", view, offset)
        start = offset + _WORD
        self.hashes = view[start : start + _WORD * count].cast("Q")
        self.offsets = view[start + _WORD * count : start + 2 * _WORD * count].cast("Q")
        self.count = count

    def offsets_of(self, value: int) -> Iterator[int]:
        i = bisect.bisect_left(self.hashes, value)
        while i < self.count and self.hashes[i] == value:
            yield self.offsets[i]
            i += 1


class Table:
    """The objects of one kind: a base buffer and the overlay of changes since.

    Lookups never lock: ``put``/``remove`` (one writer at a time, the caller's lock)
    change the overlay one dict item at a time, and a new base comes as a new ``Table``
    swapped in by reference.
    """

    def __init__(self, kind: str, base: Any = None) -> None:
        self.kind = kind
        self._buffer = base  # bytes or mmap: kept alive while the views live
        view = memoryview(base if base is not None else base_bytes(()))
        magic, version, _, count, end, key_index, uid_index = _HEADER.unpack_from(view)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"not a runguard cluster state table (version {VERSION})")
        self._view = view
        self.base_count = count
        self._keys = _Index(view, key_index)
        self._uids = _Index(view, uid_index)
        self.overlay: dict[tuple[str, str], Record | None] = {}
        self.uid_overlay: dict[str, Record | None] = {}
        self.count = count

    # -- lookups

    def record(self, namespace: str, name: str) -> Record | None:
        """The current record of ``namespace/name``, or None."""
        key = (namespace, name)
        if key in self.overlay:
            return self.overlay[key]
        for offset in self._keys.offsets_of(key_hash(namespace, name)):
            record = self._base_record(offset)
            if record_ids(record)[:2] == key:
                return record
        return None

    def get(self, namespace: str, name: str) -> Meta | None:
        key = (namespace, name)
        if key in self.overlay:
            record = self.overlay[key]
            return None if record is None else decode_record(self.kind, record)
        for offset in self._keys.offsets_of(key_hash(namespace, name)):
            meta = decode_record(self.kind, self._base_record(offset))
            if meta.namespace == namespace and meta.name == name:
                return meta
        return None

    def by_uid(self, uid: str) -> Meta | None:
        if uid in self.uid_overlay:
            record = self.uid_overlay[uid]
            return None if record is None else decode_record(self.kind, record)
        for offset in self._uids.offsets_of(uid_hash(uid)):
            meta = decode_record(self.kind, self._base_record(offset))
            if meta.uid == uid:
                return meta
        return None

    def _base_record(self, offset: int) -> bytes:
        (length,) = _LENGTH.unpack_from(self._view, offset)
        start = offset + _LENGTH.size
        return bytes(self._view[start : start + length])

    def records(self) -> Iterator[Record]:
        """Every current record: the base's not changed since, then the overlay's."""
        view, offset = self._view, _HEADER.size
        end = _HEADER.unpack_from(view)[4]
        while offset < end:
            (length,) = _LENGTH.unpack_from(view, offset)
            start = offset + _LENGTH.size
            record = bytes(view[start : start + length])
            offset = start + length
            if record_ids(record)[:2] not in self.overlay:
                yield record
        yield from (r for r in self.overlay.values() if r is not None)

    # -- changes (one writer at a time)

    def put(self, record: Record) -> bool:
        """Add or replace the object of ``record``; False when it is already so."""
        namespace, name, uid = record_ids(record)
        old = self.record(namespace, name)
        if old == record:
            return False
        if old is not None:
            old_uid = record_ids(old)[2]
            if old_uid and old_uid != uid:
                self.uid_overlay[old_uid] = None
        else:
            self.count += 1
        self.overlay[(namespace, name)] = record
        if uid:
            self.uid_overlay[uid] = record
        return True

    def remove(self, namespace: str, name: str) -> bool:
        """Delete ``namespace/name``; False when it is not there."""
        old = self.record(namespace, name)
        if old is None:
            return False
        old_uid = record_ids(old)[2]
        if old_uid:
            self.uid_overlay[old_uid] = None
        self.overlay[(namespace, name)] = None
        self.count -= 1
        return True

    @property
    def changes(self) -> int:
        return len(self.overlay)

    def close(self) -> None:
        """Release the views of a buffer about to be unmapped."""
        for index in (self._keys, self._uids):
            index.hashes.release()
            index.offsets.release()
        self._view.release()


def table_from_records(kind: str, records: Iterable[Record]) -> Table:
    """An in-memory table (offline state, tests); a key given twice keeps the last."""
    by_key: dict[tuple[str, str], Record] = {}
    for record in records:
        by_key[record_ids(record)[:2]] = record
    return Table(kind, base_bytes(by_key.values()))
