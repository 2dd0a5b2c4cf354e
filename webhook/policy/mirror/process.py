"""The policy watch as the server runs it (``runguard serve --policy-objects``): its
process, supervised and restarted like the cluster-state watch, and the wait for its
first mirror. The process itself is ``webhook.watches.policy``, never imported by the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from webhook.clusterstate.process import WatchProcess

__all__ = ["SYNCED", "PolicyWatch", "wait_synced"]

SYNCED = ".synced"  # written in the directory once the first list is mirrored


class PolicyWatch(WatchProcess):
    """The policy watch process of a server, mirroring into ``directory``."""

    label = "policy objects"

    module = "webhook.watches.policy"

    def arguments(self) -> list[str]:
        return []


def wait_synced(directory: Path, timeout: float, alive: Callable[[], bool]) -> bool:
    """Wait until the watch mirrored its first list into ``directory``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (directory / SYNCED).exists():
            return True
        if not alive():
            return False
        time.sleep(0.1)
    return False
