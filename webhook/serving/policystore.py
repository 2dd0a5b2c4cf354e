"""The serving policy, hot-reloaded, and one decision about it for every worker.

Process model under gunicorn (``gthread`` workers, ``preload_app``):

* the master loads the policy once and is the one process that decides which policy
  serves: its ``PolicyStore`` watcher thread checks the policy files' signature (a
  ``stat`` of each file, following the ``..data`` symlink of a ConfigMap volume) every
  ``interval``, loads a change once its newest file is a second old (files copied one
  by one load together) and publishes the outcome in a private directory
  (``PolicyPublication``): the new policy, or the last good one with the ``file:line``
  errors of the rejected files, which it logs;
* every worker serves the master's publication and never reads the policy directory
  (``PolicyStore.follow``, from the ``post_fork`` hook): it checks the publication at
  most once per ``interval`` before a request and in a daemon thread, so an idle worker
  keeps up too, and swaps the new state in with one reference assignment (a request
  sees the old policy or the new one, never a mix). Every worker thus serves the same
  last good policy, flagged in ``/readyz`` and in the ``runguard_policy_rejected``
  metric while an edit is rejected;
* the master's watcher thread never calls the ``observer`` (which records metrics):
  ``prometheus_client``'s process-wide lock must not be copied into a fork while held.

``create_app`` on its own (tests) has a store that loads its directory itself.
Messages go to the ``runguard.server`` logger, the serving process's channel.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from webhook.policy.model import Policy
from webhook.serving.policystate import TRANSITION, PolicyPublication, PolicyState
from webhook.serving.settings import RELOAD_INTERVAL
from webhook.serving.watch import Signature, directory_signature, every, newest_mtime

__all__ = ["PolicyObserver", "PolicyPublication", "PolicyState", "PolicyStore"]

log = logging.getLogger("runguard.server")

SETTLE = 1.0  # a policy file changed less than this long ago is not loaded yet

PolicyLoader = Callable[[Path], Policy]
PolicyObserver = Callable[[PolicyState, "bool | None"], None]


class PolicyStore:
    """The serving policy of one process, and where it comes from.

    ``current()`` is the hot path: a reference read, plus at most once per
    ``interval`` a ``stat`` of the source. A reload happens in the thread that noticed
    the change while the others keep the serving policy. The source is one of:

    * the policy directory (``create_app`` on its own, and the gunicorn master): a
      change is loaded once settled, and rejected with its ``file:line`` errors if it
      does not load, the last good policy staying;
    * under gunicorn, the master's ``PolicyPublication``: the master ``publish()``es
      the outcome of every reload attempt (its watcher thread checks the directory)
      and each worker ``follow()``s it, never reading the directory itself. One process
      decides what the last good policy is, so every worker serves the same one, also
      a worker that served nothing while a good edit was on disk.

    ``observer(state, result)`` hears of every reload attempt in a serving process
    (``result`` True or False) and of the state a process starts serving with
    (``result`` None); the master's watcher thread never calls it (see module doc).
    """

    def __init__(
        self,
        directory: Path | str,
        loader: PolicyLoader | None = None,
        *,
        interval: float = RELOAD_INTERVAL,
        settle: float = SETTLE,
        observer: PolicyObserver | None = None,
    ) -> None:
        if loader is None:
            from webhook.policy.loader import load_policy

            loader = load_policy
        self.directory = Path(directory)
        self.interval = interval
        self.settle = settle
        self.observer = observer
        self._loader = loader
        self._state = PolicyState(None)
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._pid = 0  # the serving process, adopted on the first current() there
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._publication: PolicyPublication | None = None
        self._following = False  # True: the publication is the source, not the directory
        self._published: tuple[object, ...] = ()  # publication file last read (following)
        self._unpublished = False  # a state the publication failed to take (publishing)

    @property
    def state(self) -> PolicyState:
        return self._state

    @property
    def publication(self) -> PolicyPublication | None:
        return self._publication

    def load(self) -> PolicyState:
        """First load; raises ``PolicyError`` (with every ``file:line`` issue) on failure,
        after recording the issues in ``state.rejected``."""
        from webhook.policy.errors import PolicyError

        with self._lock:
            signature = directory_signature(self.directory)
            self._next_check = time.monotonic() + self.interval
            try:
                policy = self._loader(self.directory)
            except PolicyError as exc:
                errors = tuple(str(issue) for issue in exc.errors) or (str(exc),)
                self._state = PolicyState(None, signature, rejected=errors, rejected_at=time.time())
                raise
            self._state = PolicyState(policy, signature, time.time())
        log.info(
            "policy loaded from %s: %s (digest %s)",
            self.directory,
            policy.describe(),
            policy.digest,
        )
        return self._state

    def catch_up(self) -> Policy | None:
        """The serving policy after a look at the source now, whatever the interval: a
        request that another worker may have answered with a newer policy."""
        self._next_check = 0.0
        return self.current()

    def current(self) -> Policy | None:
        """The serving policy (None before a first good load), checking for changes."""
        if self._pid != os.getpid():
            self._adopt_process()
        if time.monotonic() >= self._next_check:
            self.refresh()
        return self._state.policy

    def refresh(self, *, notify: bool = True) -> PolicyState:
        """Take in a change of the source since the last look; never raises."""
        if not self._lock.acquire(blocking=False):
            return self._state  # another thread is on it; serve what we have
        try:
            self._next_check = time.monotonic() + self.interval
            if self._following:
                result = self._adopt_published()
            else:
                result = self._check_directory()
                if self._publication is not None and (result is not None or self._unpublished):
                    self._publish()
        finally:
            self._lock.release()
        if result is not None and notify and self.observer is not None:
            self.observer(self._state, result)
        return self._state

    # -- the directory: standalone, or the master deciding for its workers

    def _check_directory(self) -> bool | None:
        signature = directory_signature(self.directory)
        if signature == self._state.signature:
            return None
        if time.time() - newest_mtime(signature) < self.settle:
            # Written just now: let it settle, so that files copied one by one are
            # loaded together, not half old and half new.
            self._next_check = time.monotonic() + min(self.interval, 0.2)
            return None
        return self._reload(signature)

    def _reload(self, signature: Signature) -> bool | None:
        """Load the changed files: True swapped in, False rejected, None retry later."""
        from webhook.policy.errors import PolicyError

        old = self._state
        try:
            policy = self._loader(self.directory)
        except PolicyError as exc:
            errors = tuple(str(issue) for issue in exc.errors) or (str(exc),)
        except Exception as exc:  # a file vanishing mid-swap, an unreadable file
            errors = (f"{self.directory}: {type(exc).__name__}: {exc}",)
        else:
            if directory_signature(self.directory) != signature:
                return None  # changed while loading (a copy in progress): next check retries
            now = time.time()
            if old.policy is not None and old.policy.digest != policy.digest:
                self._state = PolicyState(
                    policy, signature, now, previous=old.policy, previous_until=now + TRANSITION
                )
            else:  # the first, or the same digest (a touched file): keep what it replaced
                until = old.previous_until
                self._state = PolicyState(
                    policy, signature, now, previous=old.previous, previous_until=until
                )
            if old.policy is None or old.policy.digest != policy.digest:
                log.info(
                    "policy reloaded from %s: %s (digest %s, was %s)",
                    self.directory,
                    policy.describe(),
                    policy.digest,
                    old.policy.digest if old.policy else "none",
                )
            return True
        self._state = replace(old, signature=signature, rejected=errors, rejected_at=time.time())
        log.error(
            "policy in %s rejected, the last good one keeps serving (digest %s): %d error(s)",
            self.directory,
            old.policy.digest if old.policy else "none",
            len(errors),
        )
        for error in errors:
            log.error("  %s", error)
        return False

    def publish(self, publication: PolicyPublication | None = None, *, watch: bool = True) -> None:
        """The master's side: publish the serving state now and the outcome of every
        reload attempt from now on (in a watcher thread when ``watch``), for ``follow``.
        ``publication`` defaults to a fresh private one; ``stop()`` removes it."""
        self._pid = os.getpid()  # the deciding process: it never follows itself
        self._publication = publication or PolicyPublication.create()
        self._publication.write(self._state)  # at start: fails loudly
        log.info("policy decisions published for the workers in %s", self._publication.path)
        if watch:
            self._watch(notify=False)

    def _publish(self) -> None:
        assert self._publication is not None
        try:
            self._publication.write(self._state)
        except OSError as exc:  # a full disk: the workers keep the previous decision
            self._unpublished = True
            log.error("policy state not published to the workers, retrying: %s", exc)
        else:
            self._unpublished = False

    # -- the publication: a worker adopting the master's decision

    def follow(self, publication: PolicyPublication | None = None, *, watch: bool = True) -> None:
        """A worker's side: serve only what ``publication`` holds (by default the one
        the master of this forked process writes), read now and then at most once per
        ``interval`` before a request, and every ``interval`` in a daemon thread when
        ``watch``, so that an idle worker keeps up too."""
        publication = publication or self._publication
        if publication is None:
            raise ValueError("nothing to follow: no publication, and publish() was not called")
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the master's watcher could have held it at the fork
        self._stop = threading.Event()
        self._watcher = None
        self._publication = publication
        self._following = True
        self._published = ()
        self._adopt_published()
        self._next_check = time.monotonic() + self.interval
        if self.observer is not None:
            self.observer(self._state, None)
        if watch:
            self._watch(notify=True)

    def _adopt_published(self) -> bool | None:
        """Take the published state if it changed: True a good policy, False a rejected
        edit (the last good policy staying), None nothing new."""
        assert self._publication is not None
        signature = self._publication.signature()
        if signature == self._published:
            return None
        try:
            signature, new = self._publication.read()
        except Exception as exc:  # gone with the master, or unreadable: keep serving
            self._published = signature  # tried once per version of the file
            log.error("policy state of the master not read, keeping the serving one: %s", exc)
            return None
        self._published = signature
        old = self._state
        if new.policy and old.policy and new.policy.digest == old.policy.digest:
            new = replace(new, policy=old.policy)  # the same policy: keep the one in use
        elif new.policy is not None:
            log.info(
                "policy adopted from the master: %s (digest %s, was %s)",
                new.policy.describe(),
                new.policy.digest,
                old.policy.digest if old.policy else "none",
            )
        self._state = new
        return not new.rejected

    # -- process and threads

    def _adopt_process(self) -> None:
        """First use in this process (a forked worker): a fresh lock, as the master's
        watcher could have held it at the fork, and the starting state published."""
        if self._publication is not None:
            self.follow()  # forked from a publishing master without the post_fork hook
            return
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._watcher = None
        self._stop = threading.Event()
        if self.observer is not None:
            self.observer(self._state, None)

    def _watch(self, *, notify: bool) -> None:
        """Refresh every ``interval`` in a daemon thread."""
        if self._watcher is not None:
            return

        name = "runguard-policy-follow" if self._following else "runguard-policy-watch"
        self._watcher = every(self.interval, lambda: self.refresh(notify=notify), self._stop, name)

    def stop(self) -> None:
        """Stop the thread; in the publishing master, remove the publication too."""
        self._stop.set()
        if self._publication is not None and not self._following:
            self._publication.remove()
