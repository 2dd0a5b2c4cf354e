"""The writer's side of the publication (``publication.py``): the watch process's
``Publisher``, one ``KindPublisher`` per kind writing its bases and delta log and
bumping the control block only after the data it announces is written."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from webhook.clusterstate.model import KINDS, split_group_kind
from webhook.clusterstate.publication import (
    CONTROL,
    CONTROL_FILE_SIZE,
    ENTRY,
    HEAD,
    MAGIC,
    PUT,
    SLOTS,
    VERSION,
    Slot,
    base_path,
    delta_path,
    map_file,
    operator_kinds_of,
    read_delta,
    slots_of,
    write_empty_control,
)
from webhook.clusterstate.table import Record, Table, record_ids, write_base

__all__ = ["KindPublisher", "Publisher"]

MIN_COMPACTION = 1024  # overlay entries before a new base is worth writing


class Publisher:
    """The writer's side: one ``KindPublisher`` per kind, each used by one thread.

    ``operator_kinds``: the operator kinds the directory was made with (checked), or
    None to take them from its control block."""

    def __init__(self, directory: Path | str, operator_kinds: Iterable[str] | None = None) -> None:
        self.directory = Path(directory)
        control = self.directory / CONTROL
        if not control.exists():
            write_empty_control(control, tuple(operator_kinds or ()))
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
            for kind, index in slots_of(self.operator_kinds).items()
        }
        self.beat()

    def beat(self) -> None:
        """Record that the writer is alive (readers report its age)."""
        HEAD.pack_into(self.control, 0, MAGIC, VERSION, SLOTS, os.getpid(), time.time())

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
            base = map_file(base_path(self.directory, self.kind, slot.generation))
            table = Table(self.table_kind, base)
            delta = os.open(delta_path(self.directory, self.kind, slot.generation), os.O_RDWR)
        except FileNotFoundError:
            return False
        read_delta(table, delta, 0, slot.delta_size)
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
        base = base_path(self.directory, self.kind, generation)
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
            delta_path(self.directory, self.kind, generation),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            0o600,
        )
        old_delta = self._delta
        self.table, self._delta = Table(self.table_kind, map_file(base)), delta
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
                base_path(self.directory, self.kind, old_generation),
                delta_path(self.directory, self.kind, old_generation),
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
                entries.append(ENTRY.pack(len(record), op) + record)
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
