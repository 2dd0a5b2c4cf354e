"""The cyclic garbage collector paused while a large review runs.

A review's objects (decoded JSON, the mutated copy, the decision) hold no reference
cycles: reference counting frees them as soon as the answer is sent. But a review of a
Pod near the apiserver's 3 MiB limit allocates millions of objects, and every 700
allocations the collector walks its youngest generation, every tenth of those the
older ones, over objects that are never garbage: on a 25k-container Pod a third of the
review's CPU (docs/dev/performance.md, "Cost against object size"). While any review at or
over ``LARGE`` bytes runs in the process the collector is off; it is back on when the
last one ends, so cycles made elsewhere are still collected, and small reviews (the
usual case, where it costs little) never touch it. A collector someone else turned off
stays off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LARGE", "paused"]

LARGE = 256 * 1024  # bytes of request body

_lock = threading.Lock()
_running = 0  # large reviews in progress in this process
_resume = False  # whether the first of them found the collector on


@contextmanager
def paused(size: int | None) -> Iterator[None]:
    """The collector off while this block runs, when ``size`` (bytes) is ``LARGE`` or more."""
    if size is None or size < LARGE:
        yield
        return
    global _running, _resume
    with _lock:
        if _running == 0:
            _resume = gc.isenabled()
            gc.disable()
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _resume:
                gc.enable()
