"""The watch process, as the gunicorn master runs it: started before the workers fork,
restarted when it exits, stopped with the server; and ``ClusterWatch``, what the server
holds: that process, its private publication directory and the reader the workers use.

The process is a fresh interpreter (``python -m webhook.watches.clusterstate``), not a
fork: the master has threads (policy and certificate watchers) a fork would copy
mid-lock, and the ``kubernetes`` package stays out of the master and its workers. It
exits on its own when the master is gone (it checks its parent every second). gunicorn
reaps every child of the master, this one too (``waitpid(-1)``): this module only
``poll()``s it, and a reaped one reads as exited with code 0.

Besides ``KINDS``, the watch keeps the operators' kinds (``platform.operators``) of every
RunPolicy of the policy the server starts with (``operator_kinds``), in the
publication's operator slots. They are fixed for the server's life: a kind a reload
adds is not watched until the server restarts (until then its operator's Pods that use
the platform's objects fail closed, ``ownership.unknown`` naming the kind).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from webhook.clusterstate.model import (
    CLAIM_TEMPLATES,
    DEVICE_CLAIMS,
    KINDS,
    MAX_OPERATOR_KINDS,
    OPERATOR_CORE_KINDS,
    PROJECT_PROFILES,
    RESOURCES,
    RUN_PODS,
    split_group_kind,
)
from webhook.clusterstate.publication import create_directory
from webhook.clusterstate.reader import SharedClusterState

if TYPE_CHECKING:
    from webhook.policy.model import Policy

__all__ = ["ClusterWatch", "WatchProcess", "operator_kinds", "watched_kinds"]

log = logging.getLogger("runguard.server")

RESTART_BACKOFF = (1.0, 30.0)  # seconds before a restart, doubling while it keeps exiting
STABLE = 60.0  # a process that ran this long starts the backoff over


def operator_kinds(policy: Policy | None) -> tuple[str, ...]:
    """The "GROUP/Kind"s ``platform.operators`` of every RunPolicy of ``policy`` name, in
    the order they are written, each once; those the watch keeps anyway (a built-in kind
    named with its group, "apps/Deployment") left out. A core kind an operator owns Pods
    through (``Pod``: a Spark driver owning its executors) is kept too, by its Kind."""
    found: dict[str, None] = {}
    for run_policy in policy.run_policies if policy is not None else ():
        for operator in run_policy.platform.operators:
            for kind in operator.kinds:
                group, name = split_group_kind(kind)
                if name in KINDS and RESOURCES[name][0] == group:
                    continue
                if group or name in OPERATOR_CORE_KINDS:  # a custom resource has a group
                    found[kind] = None
    return tuple(found)


def watched_kinds(policy: Policy | None) -> tuple[str, ...]:
    """The kinds the watch keeps in its operator slots: ResourceClaims first (whose
    claims are a Pod's own, ``model.DEVICE_CLAIMS``), projects' profiles second
    (``model.PROJECT_PROFILES``), claim templates third (``model.CLAIM_TEMPLATES``), run
    Pods fourth (``model.RUN_PODS``), then ``operator_kinds``."""
    reserved = (DEVICE_CLAIMS, PROJECT_PROFILES, CLAIM_TEMPLATES, RUN_PODS)
    return tuple(dict.fromkeys((*reserved, *operator_kinds(policy))))


class WatchProcess:
    """One watch process publishing into ``directory``, from ``source`` (``in-cluster``
    or a kubeconfig path), kept running until ``stop()``. A subclass runs another
    watch (``module``, ``arguments()``) under the same supervision
    (``webhook.policy.mirror``)."""

    label = "cluster state"  # how the log names this watch

    def __init__(
        self,
        directory: Path | str,
        source: str,
        kinds: Sequence[str] = KINDS,
        operator_kinds: Sequence[str] = (),
        *,
        backoff: tuple[float, float] = RESTART_BACKOFF,
        output: int | IO[bytes] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.source = source
        self.kinds = tuple(kinds)
        self.operator_kinds = tuple(operator_kinds)
        self.backoff = backoff
        self.output = output  # where its log goes: the server's stderr unless given
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    module = "webhook.watches.clusterstate"  # what the process runs (python -m)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            self.module,
            "--dir",
            str(self.directory),
            "--source",
            self.source,
            "--parent",
            str(os.getpid()),
            *self.arguments(),
        ]

    def arguments(self) -> list[str]:
        """The options of this watch beyond where, from what and for whom."""
        return [
            "--kinds",
            ",".join(self.kinds),
            *(["--operator-kinds", ",".join(self.operator_kinds)] if self.operator_kinds else []),
        ]

    def start(self) -> None:
        self._spawn()
        name = self.label.replace(" ", "-") + "-watch"
        self._thread = threading.Thread(target=self._supervise, name=name, daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        self._process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self.output, stderr=self.output
        )
        log.info("%s: watch process %d started", self.label, self._process.pid)

    def _supervise(self) -> None:
        delay = self.backoff[0]
        started = time.monotonic()
        while not self._stop.wait(1.0):
            process = self._process
            if process is None or process.poll() is None:
                continue
            if time.monotonic() - started > STABLE:
                delay = self.backoff[0]
            log.error(
                "%s: watch process %d exited (code %s); restarting in %.0fs",
                self.label,
                process.pid,
                process.returncode,
                delay,
            )
            if self._stop.wait(delay):
                return
            delay = min(self.backoff[1], delay * 2)
            started = time.monotonic()
            self.restarts += 1
            self._spawn()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop supervising and end the process (SIGTERM, then SIGKILL after ``timeout``)."""
        self._stop.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        if self._thread is not None:
            self._thread.join(timeout)


class ClusterWatch:
    """The cluster state of a server: ``state`` is the ``ClusterState`` its request
    handlers read (every worker maps the same publication), kept by one watch process.

    ``start()`` in the process that forks the workers (the gunicorn master, which loads
    the app before forking): the watch process and its directory (in ``parent``,
    ``/dev/shm`` when there is one) go away with that process (``stop()``, also at
    exit); a forked worker inherits the reader and never stops anything.
    """

    def __init__(
        self,
        source: str,
        parent: str | None = None,
        kinds: Sequence[str] = KINDS,
        operator_kinds: Sequence[str] = (),
    ):
        if parent is None and os.path.isdir("/dev/shm"):
            parent = "/dev/shm"
        watched = tuple(operator_kinds[:MAX_OPERATOR_KINDS])
        if len(operator_kinds) > MAX_OPERATOR_KINDS:
            log.error(
                "cluster state: the policy names %d operator kinds, at most %d are watched; "
                "Pods owned by %s fail closed",
                len(operator_kinds),
                MAX_OPERATOR_KINDS,
                ", ".join(operator_kinds[MAX_OPERATOR_KINDS:]),
            )
        if watched:
            log.info("cluster state: operator kinds watched: %s", ", ".join(watched))
        self.operator_kinds = watched
        self.directory = create_directory(parent, watched)
        self.state = SharedClusterState(self.directory)
        self.process = WatchProcess(self.directory, source, kinds, watched)
        self._owner = os.getpid()

    def start(self) -> ClusterWatch:
        self.process.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        if os.getpid() != self._owner:
            return
        self.process.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
