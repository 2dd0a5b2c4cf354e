"""``eventually``: the one bounded wait of the tests (unit, HTTP and e2e)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    what: str, probe: Callable[[], T | None], timeout: float = 30.0, *, interval: float = 0.2
) -> T:
    """Call ``probe`` every ``interval`` seconds until it returns something true; return
    that. Fails with ``what`` after ``timeout`` seconds: every wait is bounded."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(interval)
