"""The watch process's cluster state, published in files every gunicorn worker maps.

One job: the file protocol, writer and reader side by side (each side's guarantees are
what the other relies on), hence a little under 600 lines.

One writer (the watch process, ``Publisher``) and any number of readers
(``SharedClusterState``, one per worker) share a private directory (``mkdtemp``: 0700),
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

import contextlib
import errno
import hashlib
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from webhook.clusterstate.model import (
    KINDS,
    MAX_OPERATOR_KINDS,
    OPERATOR_CORE_KINDS,
    KindStats,
    Meta,
    split_group_kind,
)
from webhook.clusterstate.static import TableState
from webhook.clusterstate.table import Record, Table, record_ids, write_base

__all__ = [
    "DELETE",
    "PUT",
    "KindPublisher",
    "Publisher",
    "SharedClusterState",
    "Slot",
    "create_directory",
    "operator_kinds_of",
]

CONTROL = "control"
_MAGIC = b"RGCC"
_HEAD = struct.Struct("<4sHHQd")  # magic, version, kinds, writer pid, heartbeat
_SLOT = struct.Struct("<QQQQddQQQ32sQ")
_NAME = struct.Struct("<320s")  # "GROUP/Kind": a DNS subdomain (253), "/", a Kind
_ENTRY = struct.Struct("<IB")  # record length, op
PUT, DELETE = 1, 0
SLOTS = len(KINDS) + MAX_OPERATOR_KINDS
CONTROL_SIZE = _HEAD.size + _SLOT.size * SLOTS  # what changes: compared on every lookup
CONTROL_FILE_SIZE = CONTROL_SIZE + _NAME.size * MAX_OPERATOR_KINDS  # and the names
VERSION = 2
# Slot.problem: why an operator kind is not listed (0: none); such a kind does not hold
# /readyz back (``SharedClusterState.stats``), its decisions fail closed.
NOT_INSTALLED, FORBIDDEN, FAILING = 1, 2, 3
PROBLEMS = {NOT_INSTALLED: "not installed", FORBIDDEN: "forbidden", FAILING: "failing"}
MIN_COMPACTION = 1024  # overlay entries before a new base is worth writing


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
        _write_empty_control(directory / CONTROL, tuple(operator_kinds))
    except BaseException:
        os.rmdir(directory)
        raise
    return directory


def _write_empty_control(path: Path, operator_kinds: tuple[str, ...] = ()) -> None:
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
    head = _HEAD.pack(_MAGIC, VERSION, SLOTS, 0, 0.0)
    data = head + b"\0" * (CONTROL_SIZE - _HEAD.size) + names
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
    return _HEAD.size + _SLOT.size * index


def _stem(kind: str) -> str:
    """The kind's name in file names: "Secret", or "Workflow.argoproj.io" for an operator's."""
    group, name = split_group_kind(kind)
    return f"{name}.{group}" if "/" in kind else kind


def _base_path(directory: Path, kind: str, generation: int) -> Path:
    return directory / f"{_stem(kind)}.{generation}.base"


def _delta_path(directory: Path, kind: str, generation: int) -> Path:
    return directory / f"{_stem(kind)}.{generation}.delta"


def _slots(operator_kinds: tuple[str, ...]) -> dict[str, int]:
    """Every kind with a slot (built-in by Kind, operator's by GROUP/Kind): its index."""
    return {kind: i for i, kind in enumerate((*KINDS, *operator_kinds))}


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as file:
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


def _read_delta(table: Table, fd: int, start: int, end: int | None = None) -> int:
    """Apply to ``table`` the complete delta entries from ``start`` (to ``end``, else to
    the end of the file: the control block only says that there is more); returns
    where the next entry starts. An entry still being written is left for next time."""
    if end is None:
        end = os.fstat(fd).st_size
    data = os.pread(fd, max(0, end - start), start)
    offset = 0
    while offset + _ENTRY.size <= len(data):
        length, op = _ENTRY.unpack_from(data, offset)
        if offset + _ENTRY.size + length > len(data):
            break
        record = data[offset + _ENTRY.size : offset + _ENTRY.size + length]
        offset += _ENTRY.size + length
        if op == PUT:
            table.put(record)
        else:
            table.remove(*record_ids(record)[:2])
    return start + offset


# ----------------------------------------------------------------------------- writer


class Publisher:
    """The writer's side: one ``KindPublisher`` per kind, each used by one thread.

    ``operator_kinds``: the operator kinds the directory was made with (checked), or
    None to take them from its control block."""

    def __init__(self, directory: Path | str, operator_kinds: Iterable[str] | None = None) -> None:
        self.directory = Path(directory)
        control = self.directory / CONTROL
        if not control.exists():
            _write_empty_control(control, tuple(operator_kinds or ()))
        self._file = open(control, "r+b")  # mapped for the writer's life
        self.control = mmap.mmap(self._file.fileno(), CONTROL_FILE_SIZE)
        self.operator_kinds = operator_kinds_of(self.control)
        if operator_kinds is not None and tuple(operator_kinds) != self.operator_kinds:
            given = tuple(operator_kinds)
            self.control.close()
            self._file.close()
            raise ValueError(
                f"{directory} holds slots for operator kinds {self.operator_kinds}, not {given}"
            )
        self.kinds = {
            kind: KindPublisher(self, kind, index)
            for kind, index in _slots(self.operator_kinds).items()
        }
        self.beat()

    def beat(self) -> None:
        """Record that the writer is alive (readers report its age)."""
        _HEAD.pack_into(self.control, 0, _MAGIC, VERSION, SLOTS, os.getpid(), time.time())

    def close(self) -> None:
        for kind in self.kinds.values():
            kind.close()
        self.control.close()
        self._file.close()


class KindPublisher:
    """The state of one kind as the writer keeps it: its table (the base it wrote,
    mapped, and the overlay) and the delta log readers follow. Used by one thread.

    ``kind`` names the slot ("Secret", "argoproj.io/Workflow"); ``table_kind`` is what
    its objects' ``Meta.kind`` and owner references say ("Workflow")."""

    def __init__(self, publisher: Publisher, kind: str, index: int | None = None) -> None:
        self.publisher = publisher
        self.kind = kind
        self.index = KINDS.index(kind) if index is None else index
        self.table_kind = split_group_kind(kind)[1]
        self.table = Table(self.table_kind)
        self._delta: int | None = None  # descriptor of the current delta log

    @property
    def directory(self) -> Path:
        return self.publisher.directory

    @property
    def slot(self) -> Slot:
        return Slot.read(self.publisher.control, self.index)

    def _write(self, slot: Slot) -> None:
        slot.write(self.publisher.control, self.index)

    def resume(self) -> str | None:
        """Take over what a previous writer published (its base and delta log): the
        resourceVersion to watch from, or None when there is nothing to resume."""
        slot = self.slot
        if not slot.generation or not slot.resource_version or not self._load(slot):
            return None
        return slot.resource_version.decode()

    def _load(self, slot: Slot) -> bool:
        """Make the table and the delta log what readers see (``slot``): on a resume, and
        after a failed write. False when that generation is gone."""
        try:
            base = _map(_base_path(self.directory, self.kind, slot.generation))
            table = Table(self.table_kind, base)
            delta = os.open(_delta_path(self.directory, self.kind, slot.generation), os.O_RDWR)
        except FileNotFoundError:
            return False
        _read_delta(table, delta, 0, slot.delta_size)
        os.ftruncate(delta, slot.delta_size)  # written but never announced: not applied
        os.lseek(delta, slot.delta_size, os.SEEK_SET)
        old, self.table, self._delta = self._delta, table, delta
        if old is not None:
            os.close(old)
        return True

    def replace(
        self,
        records: Iterable[Record],
        resource_version: str | Callable[[], str],
        *,
        relist: bool,
    ) -> int:
        """A complete new state (a list, or a compaction): a new generation; synced.
        ``resource_version`` may be asked for once ``records`` are consumed (a paged list
        knows its version after the first page). An error while consuming ``records``
        leaves the published state as it was."""
        slot = self.slot
        generation = slot.generation + 1
        base = _base_path(self.directory, self.kind, generation)
        tmp = base.with_name(f".{base.name}.tmp")
        try:
            with open(tmp, "w+b") as out:
                count = write_base(out, records)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, base)
        if callable(resource_version):
            resource_version = resource_version()
        delta = os.open(
            _delta_path(self.directory, self.kind, generation),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            0o600,
        )
        old_delta = self._delta
        self.table, self._delta = Table(self.table_kind, _map(base)), delta
        old_generation = slot.generation
        slot.generation, slot.delta_size, slot.objects, slot.synced = generation, 0, count, 1
        slot.problem = 0
        slot.last_sync = time.time()
        slot.relists += relist
        slot.resource_version = _version_bytes(resource_version)
        self._write(slot)
        if old_delta is not None:
            os.close(old_delta)
        if old_generation:
            for path in (
                _base_path(self.directory, self.kind, old_generation),
                _delta_path(self.directory, self.kind, old_generation),
            ):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return count

    def apply(self, changes: Iterable[tuple[int, Record]], resource_version: str) -> int:
        """Apply (op, record) changes seen up to ``resource_version``; those that change
        nothing kept (a status update) are dropped. Returns how many were not."""
        if self._delta is None:
            raise RuntimeError(f"{self.kind}: changes before the first list")
        entries = []
        for op, record in changes:
            if op == PUT:
                changed = self.table.put(record)
            else:
                changed = self.table.remove(*record_ids(record)[:2])
            if changed:
                entries.append(_ENTRY.pack(len(record), op) + record)
        slot = self.slot
        if entries:
            data = b"".join(entries)
            try:
                written = os.write(self._delta, data)
                if written != len(data):  # a full file system writes what fits
                    raise OSError(errno.ENOSPC, f"{self.kind}: delta log full")
            except OSError:
                self._load(slot)  # back to what readers see; the caller retries
                raise
            slot.delta_size += len(data)
            slot.objects = self.table.count
            slot.last_event = time.time()
            slot.events += len(entries)
        slot.resource_version = _version_bytes(resource_version)
        self._write(slot)
        if self.table.changes > max(MIN_COMPACTION, self.table.base_count // 8):
            self.replace(self.table.records(), resource_version, relist=False)
        return len(entries)

    def bookmark(self, resource_version: str) -> None:
        """Nothing changed up to ``resource_version`` (a watch bookmark)."""
        slot = self.slot
        slot.resource_version = _version_bytes(resource_version)
        self._write(slot)

    def count_error(self, problem: int = 0) -> None:
        """A failed list or watch; ``problem`` (an operator kind's list) says why."""
        slot = self.slot
        slot.watch_errors += 1
        slot.problem = problem or slot.problem
        self._write(slot)

    def set_problem(self, problem: int) -> None:
        slot = self.slot
        if slot.problem != problem:
            slot.problem = problem
            self._write(slot)

    def close(self) -> None:
        if self._delta is not None:
            os.close(self._delta)
            self._delta = None


def _version_bytes(resource_version: str) -> bytes:
    """As stored: one too long to store is forgotten (a restart then lists again)."""
    encoded = resource_version.encode()
    return encoded if len(encoded) <= 32 else b""


# ----------------------------------------------------------------------------- reader


class SharedClusterState(TableState):
    """A worker's ``ClusterState``: the writer's publication, mapped; up to date on
    every lookup (one comparison of the control block; the lock only when something
    changed).

    Tables are keyed by slot: "Secret", "argoproj.io/Workflow"; the engine asks for an
    operator kind by its Kind alone ("Workflow", as owner references name it), which
    ``get`` and ``synced`` accept too."""

    # A watch delivers an object a moment after the apiserver stored it: an owner a
    # controller names may not be here yet (``webhook.engine.rules.ownership``).
    may_lag = True

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._control: mmap.mmap | None = None
        self._slots: dict[str, int] = _slots(())  # the operator kinds' once it is open
        self._seen = b""
        self._tables: dict[str, Table] = {}
        self._generations: dict[str, int] = {}
        self._offsets: dict[str, int] = {}
        self._deltas: dict[str, int] = {}  # descriptors, by kind
        self._lock = threading.Lock()

    @property
    def operator_kinds(self) -> tuple[str, ...]:
        """The operator kinds ("GROUP/Kind") the publication has slots for."""
        self._control or self._open_control()
        return tuple(kind for kind in self._slots if kind not in KINDS)

    def tables(self) -> Mapping[str, Table]:
        self.refresh()
        return self._tables

    def get(self, kind: str, namespace: str, name: str) -> Meta | None:
        if "/" in kind or kind in KINDS:
            return super().get(kind, namespace, name)
        for table in self.tables().values():  # an operator kind by its Kind alone
            if table.kind == kind:
                meta = table.get(namespace, name)
                if meta is not None:
                    return meta
        return None

    def refresh(self) -> None:
        """Catch up with the writer if the control block changed since the last look.

        A thread that finds another catching up waits for it: a lookup never answers
        from a state older than the control block it read (after ``synced()`` said
        yes, the kind's objects are there). The control block is only a hint, read
        without a lock while the writer may be changing it: what a reader takes in is
        decided by the files (the base named by a generation, the delta log's complete
        entries), so a torn read costs a second look, never a change missed.
        """
        control = self._control or self._open_control()
        if control is None or control[:CONTROL_SIZE] == self._seen:
            return
        with self._lock:
            for _ in range(5):  # a generation replaced while being opened: look again
                seen = control[:CONTROL_SIZE]
                if seen == self._seen:
                    return
                if all([self._catch_up(kind, i, seen) for kind, i in self._slots.items()]):
                    self._seen = seen
                    return

    def _open_control(self) -> mmap.mmap | None:
        try:
            control = _map(self.directory / CONTROL)
        except (FileNotFoundError, ValueError):  # not made yet, or empty
            return None
        if len(control) < CONTROL_FILE_SIZE:  # being written: look again next time
            control.close()
            return None
        self._slots = _slots(operator_kinds_of(control))
        self._control = control
        return self._control

    def _catch_up(self, kind: str, index: int, control: bytes) -> bool:
        """Take in what changed for ``kind``; False when it must be tried again."""
        generation = Slot.read(control, index).generation
        if generation == 0:
            return True
        if generation != self._generations.get(kind):
            try:
                base = _map(_base_path(self.directory, kind, generation))
                delta = os.open(_delta_path(self.directory, kind, generation), os.O_RDONLY)
            except FileNotFoundError:  # already replaced by a newer one: look again
                return False
            table = Table(split_group_kind(kind)[1], base)
            offset = _read_delta(table, delta, 0)
            old = self._deltas.get(kind)
            self._tables[kind] = table  # one assignment: lookups see old or new
            self._deltas[kind], self._offsets[kind] = delta, offset
            self._generations[kind] = generation
            if old is not None:
                os.close(old)
        else:
            table, delta = self._tables[kind], self._deltas[kind]
            self._offsets[kind] = _read_delta(table, delta, self._offsets[kind])
        return True

    def version(self) -> str:
        """The control block's digest: it changes whenever anything published does (a
        receipt of ``webhook.engine.receipts`` is for one version); "" before there is
        one."""
        control = self._control or self._open_control()
        if control is None:
            return ""
        return hashlib.blake2b(control[:CONTROL_SIZE], digest_size=16).hexdigest()

    def synced(self, kind: str) -> bool:
        """A kind of ``KINDS``, or an operator kind by GROUP/Kind or by its Kind alone
        (synced when every operator kind of that name is); any other kind is not."""
        if kind in KINDS:
            control = self._control or self._open_control()
            return control is not None and bool(Slot.read(control, kind).synced)
        matching = [
            stats.synced
            for name, stats in self.all_stats().items()
            if name == kind or (name not in KINDS and split_group_kind(name)[1] == kind)
        ]
        return bool(matching) and all(matching)

    def stats(self) -> Mapping[str, KindStats]:
        """What ``/readyz`` waits for: every kind of ``KINDS``, and the operator kinds
        but those that cannot be listed (CRD not installed, forbidden, failing), which
        are said in the watch's log and in ``problems()``."""
        problems = self.problems()
        return {k: v for k, v in self.all_stats().items() if k not in problems}

    def all_stats(self) -> Mapping[str, KindStats]:
        """Every kind with a slot, the operator kinds by GROUP/Kind (for metrics)."""
        control = self._control or self._open_control()
        if control is None:
            return {kind: KindStats() for kind in KINDS}
        return {kind: Slot.read(control, i).stats() for kind, i in self._slots.items()}

    def problems(self) -> Mapping[str, str]:
        """Operator kinds the watch cannot list, and why ("not installed", ...)."""
        control = self._control or self._open_control()
        if control is None:
            return {}
        found = {kind: Slot.read(control, i).problem for kind, i in self._slots.items()}
        return {kind: PROBLEMS.get(code, "failing") for kind, code in found.items() if code}

    def writer(self) -> tuple[int, float]:
        """(pid, last heartbeat) of the watch process; (0, 0.0) before it started."""
        control = self._control or self._open_control()
        if control is None:
            return 0, 0.0
        _, _, _, pid, heartbeat = _HEAD.unpack_from(control)
        return int(pid), float(heartbeat)
