"""The watch process's cluster state, published in files every gunicorn worker maps:
the file protocol, which the writer (``writer.py``) and the readers (``reader.py``)
both follow.

One writer (the watch process, ``writer.Publisher``) and any number of readers
(``reader.SharedClusterState``, one per worker) share a private directory (``mkdtemp``: 0700),
in ``/dev/shm`` beside the policy publication when there is one::

    control               fixed size, mapped by all: per kind, the generation of its
                          base, the bytes of its delta log, object count, synced flag,
                          stats; the writer's pid and heartbeat; then the names of the
                          operator kinds given to ``create_directory``
    <Kind>.<gen>.base     a table base (``table.py``): records and indexes, mapped
                          read-only by the readers, so its pages are in memory once
    <Kind>.<gen>.delta    append-only changes since that base: (u32 length, u8 op,
                          record) entries

The control block has one slot per kind of ``KINDS``, then ``MAX_OPERATOR_KINDS`` slots
for operators' kinds ("GROUP/Kind", or ``Pod``: ``platform.operators``), assigned in the
order given when the directory is made and named in the block itself, so a reader
(forked before or after) and a restarted writer agree on them without being told; their
files are ``<Kind>.<group>.<gen>.base``. An unused slot stays empty.

A reader compares the control block with the copy it last saw (one ~3 KB slice per
lookup); when a kind moved on it maps the new base, or reads the new delta entries into
its table's overlay. The writer bumps the control block only after the data it
announces is written, and a delta entry is never rewritten, so a reader sees one
consistent state or a later one. A new base (first list, relist after ``410 Gone``, or
compaction when the overlay holds more than an eighth of the base) starts a new
generation; the writer removes the files of the previous one, which readers that still
map them keep until they move on.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from webhook.clusterstate.model import (
    KINDS,
    MAX_OPERATOR_KINDS,
    OPERATOR_CORE_KINDS,
    KindStats,
    split_group_kind,
)
from webhook.clusterstate.table import Table, record_ids

__all__ = [
    "CONTROL",
    "DELETE",
    "PUT",
    "Slot",
    "base_path",
    "create_directory",
    "delta_path",
    "map_file",
    "operator_kinds_of",
    "read_delta",
    "slots_of",
]

CONTROL = "control"
MAGIC = b"RGCC"
HEAD = struct.Struct("<4sHHQd")  # magic, version, kinds, writer pid, heartbeat
_SLOT = struct.Struct("<QQQQddQQQ32sQ")
_NAME = struct.Struct("<320s")  # "GROUP/Kind": a DNS subdomain (253), "/", a Kind
ENTRY = struct.Struct("<IB")  # record length, op
PUT, DELETE = 1, 0
SLOTS = len(KINDS) + MAX_OPERATOR_KINDS
CONTROL_SIZE = HEAD.size + _SLOT.size * SLOTS  # what changes: compared on every lookup
CONTROL_FILE_SIZE = CONTROL_SIZE + _NAME.size * MAX_OPERATOR_KINDS  # and the names
VERSION = 2
# Slot.problem: why an operator kind is not listed (0: none); such a kind does not hold
# /readyz back (``reader.SharedClusterState.stats``), its decisions fail closed.
NOT_INSTALLED, FORBIDDEN, FAILING = 1, 2, 3
PROBLEMS = {NOT_INSTALLED: "not installed", FORBIDDEN: "forbidden", FAILING: "failing"}


@dataclass
class Slot:
    """The control block's entry for one kind."""

    generation: int = 0  # of the current base; 0: none yet
    delta_size: int = 0  # bytes of its delta log readers may read
    objects: int = 0
    synced: int = 0
    last_event: float = 0.0
    last_sync: float = 0.0
    relists: int = 0
    watch_errors: int = 0
    events: int = 0
    # of the last change or bookmark applied: a restarted writer resumes its watch there
    resource_version: bytes = b""  # (at most 32 bytes, else empty)
    problem: int = 0  # an operator kind's: NOT_INSTALLED, FORBIDDEN, FAILING

    @classmethod
    def read(cls, control: Any, kind: str | int) -> Slot:
        """The slot of a kind of ``KINDS``, or the slot at an index."""
        g, d, o, s, e, t, r, w, n, version, problem = _SLOT.unpack_from(control, _slot_offset(kind))
        return cls(g, d, o, s, e, t, r, w, n, version.rstrip(b"\0"), problem)

    def write(self, control: Any, kind: str | int) -> None:
        _SLOT.pack_into(control, _slot_offset(kind), *astuple(self))

    def stats(self) -> KindStats:
        return KindStats(
            objects=self.objects,
            synced=bool(self.synced),
            last_event=self.last_event,
            last_sync=self.last_sync,
            relists=self.relists,
            watch_errors=self.watch_errors,
            events=self.events,
        )


def create_directory(parent: str | None = None, operator_kinds: Iterable[str] = ()) -> Path:
    """A fresh private directory with an empty control block, for one writer and its
    readers (the gunicorn master makes it before it forks anyone); ``operator_kinds``
    ("GROUP/Kind", at most ``MAX_OPERATOR_KINDS``) get the operator slots, in order."""
    directory = Path(tempfile.mkdtemp(prefix="runguard-cluster-", dir=parent))
    try:
        write_empty_control(directory / CONTROL, tuple(operator_kinds))
    except BaseException:
        os.rmdir(directory)
        raise
    return directory


def write_empty_control(path: Path, operator_kinds: tuple[str, ...] = ()) -> None:
    if len(operator_kinds) > MAX_OPERATOR_KINDS:
        raise ValueError(f"at most {MAX_OPERATOR_KINDS} operator kinds, not {len(operator_kinds)}")
    if len(set(operator_kinds)) != len(operator_kinds) or any(
        ("/" not in kind and kind not in OPERATOR_CORE_KINDS) or kind in KINDS
        for kind in operator_kinds
    ):
        core = ", ".join(OPERATOR_CORE_KINDS)
        raise ValueError(
            f"operator kinds must be distinct GROUP/Kind names or {core}: {operator_kinds}"
        )
    names = b"".join(_NAME.pack(kind.encode()) for kind in operator_kinds)
    if any(len(kind.encode()) > _NAME.size for kind in operator_kinds):
        raise ValueError(f"an operator kind longer than {_NAME.size} bytes")
    head = HEAD.pack(MAGIC, VERSION, SLOTS, 0, 0.0)
    data = head + b"\0" * (CONTROL_SIZE - HEAD.size) + names
    tmp = path.with_name(".control.tmp")
    tmp.write_bytes(data + b"\0" * (CONTROL_FILE_SIZE - len(data)))
    os.replace(tmp, path)


def operator_kinds_of(control: Any) -> tuple[str, ...]:
    """The operator kinds a control block holds slots for, in slot order."""
    kinds = []
    for i in range(MAX_OPERATOR_KINDS):
        (name,) = _NAME.unpack_from(control, CONTROL_SIZE + _NAME.size * i)
        if not name.rstrip(b"\0"):
            break
        kinds.append(name.rstrip(b"\0").decode())
    return tuple(kinds)


def _slot_offset(kind: str | int) -> int:
    index = kind if isinstance(kind, int) else KINDS.index(kind)
    if not 0 <= index < SLOTS:
        raise IndexError(f"no slot {index}")
    return HEAD.size + _SLOT.size * index


def _stem(kind: str) -> str:
    """The kind's name in file names: "Secret", or "Workflow.argoproj.io" for an operator's."""
    group, name = split_group_kind(kind)
    return f"{name}.{group}" if "/" in kind else kind


def base_path(directory: Path, kind: str, generation: int) -> Path:
    return directory / f"{_stem(kind)}.{generation}.base"


def delta_path(directory: Path, kind: str, generation: int) -> Path:
    return directory / f"{_stem(kind)}.{generation}.delta"


def slots_of(operator_kinds: tuple[str, ...]) -> dict[str, int]:
    """Every kind with a slot (built-in by Kind, operator's by GROUP/Kind): its index."""
    return {kind: i for i, kind in enumerate((*KINDS, *operator_kinds))}


def map_file(path: Path) -> mmap.mmap:
    with open(path, "rb") as file:
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


def read_delta(table: Table, fd: int, start: int, end: int | None = None) -> int:
    """Apply to ``table`` the complete delta entries from ``start`` (to ``end``, else to
    the end of the file: the control block only says that there is more); returns
    where the next entry starts. An entry still being written is left for next time."""
    if end is None:
        end = os.fstat(fd).st_size
    data = os.pread(fd, max(0, end - start), start)
    offset = 0
    while offset + ENTRY.size <= len(data):
        length, op = ENTRY.unpack_from(data, offset)
        if offset + ENTRY.size + length > len(data):
            break
        record = data[offset + ENTRY.size : offset + ENTRY.size + length]
        offset += ENTRY.size + length
        if op == PUT:
            table.put(record)
        else:
            table.remove(*record_ids(record)[:2])
    return start + offset
