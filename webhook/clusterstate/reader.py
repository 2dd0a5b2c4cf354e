"""The readers' side of the publication (``publication.py``): ``SharedClusterState``,
a worker's view of what the watch process published, brought up to date on a lookup."""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from webhook.clusterstate.model import KINDS, KindStats, Meta, split_group_kind
from webhook.clusterstate.publication import (
    CONTROL,
    CONTROL_FILE_SIZE,
    CONTROL_SIZE,
    HEAD,
    PROBLEMS,
    Slot,
    base_path,
    delta_path,
    map_file,
    operator_kinds_of,
    read_delta,
    slots_of,
)
from webhook.clusterstate.static import TableState
from webhook.clusterstate.table import Table

__all__ = ["SharedClusterState"]


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
        self._slots: dict[str, int] = slots_of(())  # the operator kinds' once it is open
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
            control = map_file(self.directory / CONTROL)
        except (FileNotFoundError, ValueError):  # not made yet, or empty
            return None
        if len(control) < CONTROL_FILE_SIZE:  # being written: look again next time
            control.close()
            return None
        self._slots = slots_of(operator_kinds_of(control))
        self._control = control
        return self._control

    def _catch_up(self, kind: str, index: int, control: bytes) -> bool:
        """Take in what changed for ``kind``; False when it must be tried again."""
        generation = Slot.read(control, index).generation
        if generation == 0:
            return True
        if generation != self._generations.get(kind):
            try:
                base = map_file(base_path(self.directory, kind, generation))
                delta = os.open(delta_path(self.directory, kind, generation), os.O_RDONLY)
            except FileNotFoundError:  # already replaced by a newer one: look again
                return False
            table = Table(split_group_kind(kind)[1], base)
            offset = read_delta(table, delta, 0)
            old = self._deltas.get(kind)
            self._tables[kind] = table  # one assignment: lookups see old or new
            self._deltas[kind], self._offsets[kind] = delta, offset
            self._generations[kind] = generation
            if old is not None:
                os.close(old)
        else:
            table, delta = self._tables[kind], self._deltas[kind]
            self._offsets[kind] = read_delta(table, delta, self._offsets[kind])
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
        _, _, _, pid, heartbeat = HEAD.unpack_from(control)
        return int(pid), float(heartbeat)
