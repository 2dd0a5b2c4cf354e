"""Noticing that files changed: ``stat`` signatures, and a thread that looks every second.

Policy and certificate files arrive as Kubernetes volumes, which the kubelet updates
by swapping a ``..data`` symlink; a signature taken through the symlinks changes with
every swap, also when the content does not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "Signature",
    "directory_signature",
    "every",
    "file_signature",
    "newest_mtime",
    "stat_signature",
]

Signature = tuple[tuple[object, ...], ...]


def file_signature(path: Path | str) -> tuple[object, ...]:
    """Identity and version of a file, following symlinks (a ``..data`` swap shows)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return (str(path), "error", exc.errno)
    return stat_signature(path, st)


def stat_signature(path: Path | str, st: os.stat_result) -> tuple[object, ...]:
    """``file_signature`` of a file already ``stat``-ed (or ``fstat``-ed once open)."""
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def newest_mtime(signature: Signature) -> float:
    """Unix time of the newest file in a ``directory_signature``."""
    stamps = [entry[4] for entry in signature if len(entry) == 5]
    return max((s for s in stamps if isinstance(s, int)), default=0) / 1e9


def directory_signature(directory: Path | str) -> Signature:
    """A cheap summary that changes when any file of the directory changes.

    Entries are ``stat``-ed through symlinks, so the kubelet's atomic update of a
    ConfigMap volume (new ``..<timestamp>`` directory, ``..data`` symlink renamed onto
    it) changes the inode of every ``..data/<file>`` target seen through the top-level
    links. Subdirectories are summarised by their own ``stat`` (files added, removed).
    """
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        return ((str(directory), "error", exc.errno),)
    return tuple(file_signature(os.path.join(directory, name)) for name in names)


def every(
    interval: float, tick: Callable[[], object], stop: threading.Event, name: str
) -> threading.Thread:
    """A daemon thread calling ``tick`` every ``interval`` seconds until ``stop`` is set."""

    def run() -> None:
        while not stop.wait(interval):
            tick()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
