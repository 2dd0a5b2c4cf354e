"""Serving: gunicorn over TLS, and the watchers that hot-reload policy and certificate.

One source of truth for the gunicorn configuration: ``gunicorn_options()`` is what
``runguard serve`` runs in-process (``RunguardApplication``) and what the repository's
``gunicorn.conf.py`` exports for a plain ``gunicorn -c gunicorn.conf.py``.

Process model (gunicorn ``gthread`` workers, ``preload_app``):

* the master loads the app and the policy once, builds the TLS context once (a bad
  certificate fails at start), and is the one process that decides which policy
  serves: its ``PolicyStore`` watcher thread checks the policy files' signature (a
  ``stat`` of each file, following the ``..data`` symlink of a ConfigMap volume) every
  ``reload_interval``, loads a change once its newest file is a second old (files
  copied one by one load together) and publishes the outcome in a private directory
  (``PolicyPublication``): the new policy, or the last good one with the ``file:line``
  errors of the rejected files, which it logs;
* every worker serves the master's publication and never reads the policy directory
  (``PolicyStore.follow``, from the ``post_fork`` hook): it checks the publication at
  most once per ``reload_interval`` before a request and in a daemon thread, so an
  idle worker keeps up too, and swaps the new state in with one reference assignment
  (a request sees the old policy or the new one, never a mix). Every worker thus
  serves the same last good policy, flagged in ``/readyz`` and in the
  ``runguard_policy_rejected`` metric while an edit is rejected. A worker checks the
  certificate files before a new TLS connection;
* metrics are written by workers only (``PROMETHEUS_MULTIPROC_DIR``, a temporary
  directory made at start): the master's watcher thread never touches
  ``prometheus_client``, whose process-wide lock a fork must not copy while held.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import shutil
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook.policy.model import Policy

__all__ = [
    "CertificateStore",
    "PolicyPublication",
    "PolicyState",
    "PolicyStore",
    "RunguardApplication",
    "ServeSettings",
    "SettingsError",
    "app_config",
    "byte_size",
    "configure_logging",
    "directory_signature",
    "gunicorn_options",
    "prepare_multiprocess_metrics",
    "remove_multiprocess_metrics",
    "ssl_context",
]

log = logging.getLogger("runguard.server")

DEFAULT_BIND = "127.0.0.1:8443"
DEFAULT_MAX_BODY = 4 * 1024 * 1024  # an UPDATE review carries object and oldObject
DEFAULT_THREADS = 2  # CPU-bound reviews: more threads only queue on the GIL (docs/server.md)
RELOAD_INTERVAL = 1.0  # seconds between checks of the policy and certificate files
SETTLE = 1.0  # a policy file changed less than this long ago is not loaded yet

Signature = tuple[tuple[object, ...], ...]
PolicyLoader = Callable[[Path], Policy]


# --------------------------------------------------------------------------- settings


class SettingsError(ValueError):
    """A ``runguard serve`` setting that is missing or unusable."""


@dataclass(frozen=True)
class ServeSettings:
    """What ``runguard serve`` needs; each has an environment variable for the image."""

    policy_dir: Path
    cert_file: Path
    key_file: Path
    bind: str = DEFAULT_BIND
    workers: int = 2
    threads: int = DEFAULT_THREADS
    max_body: int = DEFAULT_MAX_BODY
    reload_interval: float = RELOAD_INTERVAL

    ENV = {
        "policy_dir": "RUNGUARD_POLICY_DIR",
        "cert_file": "RUNGUARD_CERT_FILE",
        "key_file": "RUNGUARD_KEY_FILE",
        "bind": "RUNGUARD_BIND",
        "workers": "RUNGUARD_WORKERS",
        "threads": "RUNGUARD_THREADS",
        "max_body": "RUNGUARD_MAX_BODY",
    }

    @classmethod
    def resolve(
        cls, given: Mapping[str, object | None], env: Mapping[str, str] | None = None
    ) -> ServeSettings:
        """Settings from ``given`` (command-line values, None when absent), else the env."""
        env = os.environ if env is None else env
        raw: dict[str, object] = {}
        for key, var in cls.ENV.items():
            value = given.get(key)
            if value is None and env.get(var):
                value = env[var]
            if value is not None:
                raw[key] = value
        missing = [
            f"--{k.replace('_', '-')} / {cls.ENV[k]}"
            for k in ("policy_dir", "cert_file", "key_file")
            if k not in raw
        ]
        if missing:
            raise SettingsError("missing " + ", ".join(missing))
        settings = cls(
            policy_dir=Path(str(raw["policy_dir"])),
            cert_file=Path(str(raw["cert_file"])),
            key_file=Path(str(raw["key_file"])),
            bind=str(raw.get("bind", DEFAULT_BIND)),
            workers=_positive_int("workers", raw.get("workers", default_workers())),
            threads=_positive_int("threads", raw.get("threads", DEFAULT_THREADS)),
            max_body=byte_size(raw.get("max_body", DEFAULT_MAX_BODY)),
        )
        if not settings.policy_dir.is_dir():
            raise SettingsError(f"policy directory {settings.policy_dir} does not exist")
        for path in (settings.cert_file, settings.key_file):
            if not path.is_file():
                raise SettingsError(f"{path} does not exist")
        return settings


def default_workers() -> int:
    """One worker per core, at least two (a killed worker never leaves none)."""
    return max(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)


def _positive_int(name: str, value: object) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise SettingsError(f"{name} must be at least 1, got {number}")
    return number


_SIZE_SUFFIXES = {"": 1, "k": 1000, "ki": 1024, "m": 1000**2, "mi": 1024**2}


def byte_size(value: object) -> int:
    """Bytes, given as ``4194304``, ``4Mi`` or ``512Ki``."""
    text = str(value).strip()
    digits = text.rstrip("KkMmIi")
    suffix = text[len(digits) :].lower()
    if not digits.isdigit() or suffix not in _SIZE_SUFFIXES:
        raise SettingsError(f"max body must be bytes like 4194304 or 4Mi, got {text!r}")
    size = int(digits) * _SIZE_SUFFIXES[suffix]
    if size < 1024:
        raise SettingsError(f"max body must be at least 1Ki, got {text!r}")
    return size


# ------------------------------------------------------------------ file signatures


def file_signature(path: Path | str) -> tuple[object, ...]:
    """Identity and version of a file, following symlinks (a ``..data`` swap shows)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return (str(path), "error", exc.errno)
    return _stat_signature(path, st)


def _stat_signature(path: Path | str, st: os.stat_result) -> tuple[object, ...]:
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _newest_mtime(signature: Signature) -> float:
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


# ----------------------------------------------------------------------- policy


@dataclass(frozen=True)
class PolicyState:
    """What a store serves, and what it thinks of the files on disk.

    ``rejected`` holds the ``file:line`` errors of the files on disk when they failed
    to load (the last good ``policy`` keeps serving); it is empty when the files on
    disk are the ones serving.
    """

    policy: Policy | None
    signature: Signature = ()
    loaded_at: float = 0.0  # unix time the serving policy was loaded
    rejected: tuple[str, ...] = ()
    rejected_at: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """The ``/readyz`` detail."""
        out: dict[str, object] = {}
        if self.policy is not None:
            out["policy"] = {
                "name": self.policy.name,
                "digest": self.policy.digest,
                "loadedAt": _iso(self.loaded_at),
                "profiles": sorted(self.policy.profiles),
            }
        if self.rejected:
            out["rejected"] = {"at": _iso(self.rejected_at), "errors": list(self.rejected)}
        return out


def _iso(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


PolicyObserver = Callable[[PolicyState, "bool | None"], None]


class PolicyPublication:
    """The gunicorn master's decision, in one file its workers read: the ``PolicyState``
    to serve (the last good policy, and the errors of the files on disk if rejected).

    Written whole to a temporary file renamed over the previous one, so a reader gets
    one decision or the next, never a mix. A pickle: written by the master and read by
    its own forks, in a directory only this user can enter (``mkdtemp`` makes it 0700).
    """

    FILE = "state.pickle"

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.FILE
        self._owner = os.getpid()

    @classmethod
    def create(cls, parent: str | None = None) -> PolicyPublication:
        """A publication in a fresh private directory in ``parent`` (by default the
        temporary directory), removed by ``remove()``."""
        return cls(tempfile.mkdtemp(prefix="runguard-policy-", dir=parent))

    def write(self, state: PolicyState) -> None:
        tmp = self.path.with_name(f".{self.FILE}.tmp")
        tmp.write_bytes(pickle.dumps(replace(state, signature=()), pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, self.path)

    def signature(self) -> tuple[object, ...]:
        return file_signature(self.path)

    def read(self) -> tuple[tuple[object, ...], PolicyState]:
        """The published state, with the ``signature()`` of the very file it came from."""
        with open(self.path, "rb") as file:
            signature = _stat_signature(self.path, os.fstat(file.fileno()))
            state = pickle.load(file)
        if not isinstance(state, PolicyState):
            raise TypeError(f"{self.path} holds a {type(state).__name__}, not a PolicyState")
        return signature, state

    def remove(self) -> None:
        """Remove the directory ``create()`` made, in the process that made it."""
        if os.getpid() == self._owner:
            shutil.rmtree(self.directory, ignore_errors=True)


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
        log.info("policy %s loaded from %s (digest %s)", policy.name, self.directory, policy.digest)
        return self._state

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
        if time.time() - _newest_mtime(signature) < self.settle:
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
            self._state = PolicyState(policy, signature, time.time())
            if old.policy is None or old.policy.digest != policy.digest:
                log.info(
                    "policy %s reloaded from %s (digest %s, was %s)",
                    policy.name,
                    self.directory,
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
                "policy %s adopted from the master (digest %s, was %s)",
                new.policy.name,
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

        def run() -> None:
            while not self._stop.wait(self.interval):
                self.refresh(notify=notify)

        name = "runguard-policy-follow" if self._following else "runguard-policy-watch"
        self._watcher = threading.Thread(target=run, name=name, daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop the thread; in the publishing master, remove the publication too."""
        self._stop.set()
        if self._publication is not None and not self._following:
            self._publication.remove()


# ------------------------------------------------------------------ certificates


class CertificateStore:
    """A TLS server context per process, rebuilt when the certificate files change.

    gunicorn asks its ``ssl_context`` hook for a context on every new connection; the
    default builds a fresh one (reading and parsing the key each time). This keeps one
    and checks the files at most once per ``interval``: a renewed certificate is served
    to new connections; connections already open keep theirs. A half-written pair
    (certificate renewed, key not yet) fails to load and the previous context stays.
    """

    def __init__(self, cert_file: str, key_file: str, *, interval: float = RELOAD_INTERVAL):
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval = interval
        self._context: ssl.SSLContext | None = None
        self._signature: tuple[object, ...] = ()
        self._not_after = 0.0
        self._next_check = 0.0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _files_signature(self) -> tuple[object, ...]:
        return (file_signature(self.cert_file), file_signature(self.key_file))

    def context(self, factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        if self._pid != os.getpid():  # first use in a forked worker
            self._pid = os.getpid()
            self._lock = threading.Lock()  # the master's could have been held at the fork
            self._publish()
        ctx = self._context
        if ctx is not None and time.monotonic() < self._next_check:
            return ctx
        if not self._lock.acquire(blocking=ctx is None):
            return ctx  # type: ignore[return-value]  # not None: blocking when None
        try:
            if self._context is None or time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + self.interval
                signature = self._files_signature()
                if self._context is None or signature != self._signature:
                    self._rebuild(factory, signature)
            assert self._context is not None
            return self._context
        finally:
            self._lock.release()

    def _rebuild(
        self, factory: Callable[[], ssl.SSLContext], signature: tuple[object, ...]
    ) -> None:
        try:
            ctx = factory()
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            not_after, subject = _certificate_summary(self.cert_file)
        except (OSError, ValueError, ssl.SSLError) as exc:
            if self._context is None:
                raise
            self._signature = signature  # do not retry (and log) until the files change again
            log.error(
                "certificate %s not reloaded, keeping the previous one: %s", self.cert_file, exc
            )
            return
        first = self._context is None
        self._context, self._signature, self._not_after = ctx, signature, not_after
        self._publish()
        log.info(
            "certificate %s %s: %s, expires %s",
            self.cert_file,
            "loaded" if first else "reloaded",
            subject,
            _iso(not_after),
        )

    def _publish(self) -> None:
        if self._not_after and os.getpid() != _MASTER_PID[0]:
            from webhook import metrics

            metrics.get().certificate_expiry.set(self._not_after)


def _certificate_summary(cert_file: str) -> tuple[float, str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    return cert.not_valid_after_utc.timestamp(), cert.subject.rfc4514_string()


_CERTIFICATES: dict[tuple[str, str], CertificateStore] = {}


def ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> Any:
    """gunicorn ``ssl_context`` hook: the process's cached context, TLS 1.2 or newer."""
    key = (conf.certfile, conf.keyfile)
    store = _CERTIFICATES.get(key)
    if store is None:
        store = _CERTIFICATES.setdefault(key, CertificateStore(*key))
    return store.context(default_ssl_context_factory)


# ------------------------------------------------------------------------ metrics

_MULTIPROC_DIR_OWNED: list[tuple[int, str]] = []  # (pid of the maker, directory or "")
_MASTER_PID = [0]  # the gunicorn master records no metrics (see module doc)


def prepare_multiprocess_metrics() -> None:
    """Point prometheus_client at a fresh directory; call before anything imports it."""
    if _MULTIPROC_DIR_OWNED:
        return
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):  # stale values of a previous run would be summed
            if name.endswith(".db"):
                os.unlink(os.path.join(given, name))
        _MULTIPROC_DIR_OWNED.append((os.getpid(), ""))
        return
    made = tempfile.mkdtemp(prefix="runguard-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = made
    _MULTIPROC_DIR_OWNED.append((os.getpid(), made))


def remove_multiprocess_metrics() -> None:
    """Remove the directory ``prepare_multiprocess_metrics`` made, in the process that
    made it (a worker leaving gunicorn's code through the same stack must not)."""
    for pid, made in _MULTIPROC_DIR_OWNED:
        if made and pid == os.getpid():
            shutil.rmtree(made, ignore_errors=True)


# ------------------------------------------------------------------------- hooks


def _runguard_store(arbiter: Any) -> PolicyStore | None:
    app = arbiter.app.wsgi()
    state = getattr(app, "extensions", {}).get("runguard")
    return getattr(state, "store", None)


def on_starting(arbiter: Any) -> None:
    _MASTER_PID[0] = os.getpid()
    configure_logging(arbiter.cfg.loglevel)


def when_ready(arbiter: Any) -> None:
    # Fail at start on a bad certificate or key, and fork workers with the context built.
    from gunicorn import sock

    sock.ssl_context(arbiter.cfg)
    store = _runguard_store(arbiter)
    if store is not None:
        # Before the first fork, so every worker starts from it; beside the workers'
        # heartbeat files, in RAM (/dev/shm) if there is one: each worker stats it every
        # second.
        store.publish(PolicyPublication.create(arbiter.cfg.worker_tmp_dir))
    # What the master loaded is never garbage: keep the workers' collector off it
    # (a full collection walked ~60k objects, ~20 ms) and its pages shared.
    gc.collect()
    gc.freeze()


def post_fork(arbiter: Any, worker: Any) -> None:
    store = _runguard_store(arbiter)
    if store is not None and store.publication is not None:
        store.follow()  # the master decides; this worker serves what it published


def child_exit(arbiter: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from webhook import metrics

        metrics.mark_process_dead(worker.pid)


def on_exit(arbiter: Any) -> None:
    store = _runguard_store(arbiter)
    if store is not None:
        store.stop()
    remove_multiprocess_metrics()


def configure_logging(level: str = "info") -> None:
    """runguard's operational logs on stderr, next to gunicorn's; stdout is the audit log."""
    logger = logging.getLogger("runguard")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
            "%Y-%m-%d %H:%M:%S %z",
        )
    )
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


# ---------------------------------------------------------------------- gunicorn


def gunicorn_options(settings: ServeSettings) -> dict[str, Any]:
    """The gunicorn configuration of runguard (see docs/server.md for the figures).

    ``gthread`` with keep-alive: the apiserver keeps its connections to a webhook open,
    and a TLS handshake costs several times a review, so a worker must serve many
    requests per connection (``sync`` closes every connection after one request).
    """
    worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    options: dict[str, Any] = {
        "bind": [settings.bind],
        "workers": settings.workers,
        "worker_class": "gthread",
        "threads": settings.threads,
        "keepalive": 75,  # the apiserver reuses its connections; idle ones close after 75 s
        "timeout": 30,  # a worker silent this long is killed and replaced
        "graceful_timeout": 25,  # in-flight reviews finish on SIGTERM (< k8s' 30 s)
        "preload_app": True,
        "certfile": str(settings.cert_file),
        "keyfile": str(settings.key_file),
        "ssl_context": ssl_context,
        "limit_request_line": 4094,
        "limit_request_fields": 100,
        "control_socket_disable": True,
        "accesslog": None,  # the audit log says more, without the noise of probes
        "errorlog": "-",
        "loglevel": "info",
        "proc_name": "runguard",
        "on_starting": on_starting,
        "when_ready": when_ready,
        "post_fork": post_fork,
        "child_exit": child_exit,
        "on_exit": on_exit,
    }
    if worker_tmp_dir:
        options["worker_tmp_dir"] = worker_tmp_dir
    return options


def app_config(settings: ServeSettings) -> dict[str, object]:
    """The ``create_app`` configuration for these settings."""
    return {
        "RUNGUARD_POLICY_DIR": str(settings.policy_dir),
        "RUNGUARD_MAX_BODY": settings.max_body,
        "RUNGUARD_RELOAD_INTERVAL": settings.reload_interval,
    }


class RunguardApplication(BaseApplication):  # type: ignore[misc]  # gunicorn is untyped
    """``runguard serve``: gunicorn's custom application, configured by ``gunicorn_options``."""

    def __init__(self, settings: ServeSettings, store: PolicyStore) -> None:
        self.settings = settings
        self.store = store
        super().__init__(prog="runguard serve")

    def load_config(self) -> None:
        for key, value in gunicorn_options(self.settings).items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from webhook.app import create_app

        return create_app({**app_config(self.settings), "POLICY_STORE": self.store})
