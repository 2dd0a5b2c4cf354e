"""Lines to a file descriptor, written by a thread of their own: a slow, full or closed
sink never blocks, or fails, the code that logs.

``LineWriter.put()`` appends a line to a bounded queue and returns at once; a daemon
thread writes the queue out with ``os.write``, whole lines of at most ``PIPE_BUF``
bytes at a time, so lines of several processes sharing one pipe never interleave. A
line that finds the queue full, or whose write fails (a closed descriptor, a reader
gone), is dropped and counted (``dropped``, the ``on_drop`` callback, ``health()``);
a sink that stops reading only fills the queue. The thread is a daemon and writes
with ``os.write`` (no Python stream, no lock held while blocked), so a process whose
writer is stuck in a write still exits.

Threads do not survive ``fork``: a child starts with an empty queue and no counts, and
starts its own thread on its first line; it never writes its parent's lines.
"""

from __future__ import annotations

import errno
import os
import queue
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import IO

__all__ = ["LineWriter", "all_writers", "flush_all"]

PIPE_BUF = getattr(select, "PIPE_BUF", 512)  # one write up to this size is atomic on a pipe
STUCK_AFTER = 5.0  # seconds a write may block before the sink is called stuck
RECENT = 60.0  # seconds a drop keeps the log reported as degraded
_PERMANENT = (errno.EBADF, errno.EPIPE, errno.EINVAL)  # the sink is gone for good

DropObserver = Callable[[int], None]

_WRITERS: weakref.WeakSet[LineWriter] = weakref.WeakSet()


class LineWriter:
    """A bounded queue of lines and the thread that writes them to ``fd``.

    ``fd`` None: there is no sink (the stream was closed before the process started);
    every line is dropped and ``health()`` says why (``reason``).
    """

    def __init__(
        self,
        name: str,
        fd: int | None,
        *,
        capacity: int,
        on_drop: DropObserver | None = None,
        reason: str = "",
    ) -> None:
        self.name = name
        self.fd = fd
        self.capacity = capacity
        self.on_drop = on_drop
        self._closed_reason = reason or f"{name}: no file to write to"
        self._reset()
        _WRITERS.add(self)

    @classmethod
    def for_stream(
        cls, name: str, stream: IO[str] | IO[bytes] | None, *, capacity: int
    ) -> LineWriter:
        """A writer to the descriptor of ``stream`` (``sys.stdout``: None when the
        process started with it closed)."""
        if stream is None:
            return cls(name, None, capacity=capacity, reason=f"{name}: closed at start")
        try:
            fd = stream.fileno()
        except (OSError, ValueError) as exc:  # closed
            return cls(name, None, capacity=capacity, reason=f"{name}: {exc}")
        return cls(name, fd, capacity=capacity)

    def _reset(self) -> None:
        """A fresh start: at creation, and in a forked child."""
        self._queue: queue.Queue[bytes] = queue.Queue(self.capacity)
        self._lock = threading.Lock()  # counts and the thread's start
        self._thread: threading.Thread | None = None
        self._broken = self.fd is None
        self._error = "" if self.fd is not None else self._closed_reason
        self._unwritten = 0  # lines put and neither written nor dropped yet
        self._writing_since = 0.0  # monotonic start of the write under way, or 0
        self._last_drop = 0.0
        self.dropped = 0
        self.written = 0

    # -- callers' side

    def put(self, line: bytes) -> bool:
        """Queue ``line`` (ending in a newline); False when it was dropped. Never blocks."""
        if self._broken:
            self._drop(1)
            return False
        if self._thread is None:
            self._start()
        with self._lock:
            self._unwritten += 1
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._settle(1)
            self._drop(1)
            return False
        return True

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queued lines to be written (at exit)."""
        deadline = time.monotonic() + timeout
        while self._unwritten and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._unwritten

    def health(self) -> dict[str, object]:
        """``/readyz`` detail: ``ok`` or ``degraded`` (and why), lines dropped, queued."""
        now = time.monotonic()
        writing = self._writing_since
        reason = self._error
        if not reason and writing and now - writing > STUCK_AFTER:
            reason = f"{self.name}: a write has been blocked for {now - writing:.0f} s"
        if not reason and self._last_drop and now - self._last_drop < RECENT:
            reason = (
                f"{self.name}: lines dropped in the last minute (queue of {self.capacity} full)"
            )
        out: dict[str, object] = {
            "status": "degraded" if reason else "ok",
            "dropped": self.dropped,
            "queued": self._unwritten,
        }
        if reason:
            out["reason"] = reason
        return out

    def count_drops(self, observer: DropObserver) -> None:
        """Tell ``observer`` of every line dropped from now on, and of those so far."""
        self.on_drop = observer
        if self.dropped:
            self._tell(self.dropped)

    def drop(self, count: int = 1) -> None:
        """Count lines lost before they could be queued."""
        self._drop(count)

    # -- counts

    def _drop(self, count: int) -> None:
        with self._lock:
            self.dropped += count
            self._last_drop = time.monotonic()
        self._tell(count)

    def _tell(self, count: int) -> None:
        observer = self.on_drop
        if observer is not None:
            try:
                observer(count)
            except Exception:  # counting a drop must not fail the caller
                pass

    def _settle(self, count: int) -> None:
        with self._lock:
            self._unwritten -= count

    # -- the writing thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"runguard-{self.name}-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        pending: bytes | None = None
        while True:
            line = pending if pending is not None else self._queue.get()
            pending = None
            batch, size = [line], len(line)
            while size < PIPE_BUF:  # more whole lines, up to one atomic pipe write
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if size + len(nxt) > PIPE_BUF:
                    pending = nxt
                    break
                batch.append(nxt)
                size += len(nxt)
            self._write(b"".join(batch), len(batch))

    def _write(self, data: bytes, lines: int) -> None:
        assert self.fd is not None
        view = memoryview(data)
        self._writing_since = time.monotonic()
        try:
            while view:
                try:
                    view = view[os.write(self.fd, view) :]
                except BlockingIOError:  # someone made the descriptor non-blocking
                    select.select([], [self.fd], [], 1.0)
        except OSError as exc:
            self._error = f"{self.name}: {exc.strerror or exc}"
            self._broken = exc.errno in _PERMANENT
            self._drop(lines)
        else:
            self._error = ""
            self.written += lines
        finally:
            self._writing_since = 0.0
            self._settle(lines)


def all_writers() -> Iterator[LineWriter]:
    """The writers of this process."""
    return iter(list(_WRITERS))


def flush_all(timeout: float) -> None:
    """Give every writer up to ``timeout`` seconds in all to write what it holds."""
    deadline = time.monotonic() + timeout
    for writer in all_writers():
        writer.flush(max(0.0, deadline - time.monotonic()))


def _after_fork_in_child() -> None:
    for writer in all_writers():
        writer._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
