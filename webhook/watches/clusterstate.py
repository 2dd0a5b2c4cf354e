"""The cluster-state watch process (``python -m webhook.watches.clusterstate --dir DIR
--source SOURCE``): its arguments, the server's log, and the ``Watcher`` of
``webhook.clusterstate.watch`` publishing into DIR until its parent (the server) is gone.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from webhook.clusterstate.api import Api, api_client
from webhook.clusterstate.model import KINDS, MAX_OPERATOR_KINDS, OPERATOR_CORE_KINDS
from webhook.clusterstate.watch import Watcher
from webhook.clusterstate.writer import Publisher
from webhook.serving.logs import configure_logging

__all__ = ["main"]

log = logging.getLogger("runguard.clusterstate")


def main(argv: Sequence[str] | None = None) -> int:
    """The watch process: ``--dir`` its publication, ``--source`` the cluster."""
    parser = argparse.ArgumentParser(
        prog="python -m webhook.watches.clusterstate",
        description="Watch the cluster state runguard decides with into DIR.",
    )
    parser.add_argument("--dir", required=True, help="the publication directory")
    parser.add_argument("--source", required=True, help="in-cluster, or a kubeconfig file")
    parser.add_argument("--parent", type=int, default=0, help="exit when this pid is gone")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument(
        "--operator-kinds",
        default="",
        help="comma-separated GROUP/Kind of operators' custom resources, as DIR was made with",
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    operator_kinds = [k for k in args.operator_kinds.split(",") if k]
    named = all("/" in k or k in OPERATOR_CORE_KINDS for k in operator_kinds)
    if not named or len(operator_kinds) > MAX_OPERATOR_KINDS:
        core = ", ".join(OPERATOR_CORE_KINDS)
        parser.error(f"--operator-kinds: at most {MAX_OPERATOR_KINDS} GROUP/Kind names or {core}")

    configure_logging()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        publisher = Publisher(args.dir, operator_kinds)
    except ValueError as exc:  # the master made DIR for other kinds: a bug, said
        log.error("cluster state: %s", exc)
        return 1
    try:
        client = api_client(args.source, len(kinds) + len(operator_kinds))
    except Exception as exc:  # noqa: BLE001  # a bad kubeconfig: said, and retried by the master
        log.error("cluster state: no client for %s: %s: %s", args.source, type(exc).__name__, exc)
        publisher.close()
        return 1
    watcher = Watcher(Api(client), publisher, [*kinds, *operator_kinds])
    watcher.start()
    log.info("cluster state: watching %s (%s)", ", ".join(watcher.kinds), args.source)
    while not stop.wait(1.0):
        publisher.beat()
        if args.parent and os.getppid() != args.parent:
            log.warning("cluster state: the server (pid %d) is gone; stopping", args.parent)
            break
    watcher.stop()
    publisher.close()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
