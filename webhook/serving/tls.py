"""The TLS server context of a process, reloaded when the certificate files change.

gunicorn asks its ``ssl_context`` hook for a context on every new connection; its
default builds a fresh one (reading and parsing the key each time). A
``CertificateStore`` keeps one and checks the files (certificate, key, and the client
CA of ``--client-ca``) at most once per ``interval``: a renewed certificate is served
to new connections, while connections already open keep theirs. A half-written pair
(certificate renewed, key not yet), or a missing file, fails to load and the previous
context stays.

In the gunicorn master a thread keeps the store up to date (``watch``), so that a
worker forked later starts from the last good context, not from the one of the start;
a fork waits for a reload under way (``os.register_at_fork``), never copying OpenSSL
in the middle of one. Messages go to the ``runguard.server`` logger.

mTLS: with a client CA, the context asks for a client certificate and verifies one
that is sent (``CERT_OPTIONAL``: a certificate from another CA fails the handshake);
``peer_verified`` tells the application whether the connection presented one.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from webhook.serving.settings import RELOAD_INTERVAL
from webhook.serving.watch import every, file_signature

__all__ = ["CertificateObserver", "CertificateStore", "ContextFactory", "peer_verified"]

log = logging.getLogger("runguard.server")

ContextFactory = Callable[[], ssl.SSLContext]
CertificateObserver = Callable[[float], None]  # told the serving certificate's notAfter


class CertificateStore:
    """A TLS server context per process, rebuilt when the certificate files change.

    ``observer(not_after)`` hears of every certificate this process starts serving:
    when one is (re)loaded, and on first use in a forked process (which serves the
    context it inherited).
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        ca_file: str | None = None,
        *,
        interval: float = RELOAD_INTERVAL,
        observer: CertificateObserver | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.ca_file = ca_file
        self.interval = interval
        self.observer = observer
        self._context: ssl.SSLContext | None = None
        self._factory: ContextFactory | None = None
        self._signature: tuple[object, ...] = ()
        self._not_after = 0.0
        self._next_check = 0.0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._stop = threading.Event()
        _STORES.add(self)

    def _files_signature(self) -> tuple[object, ...]:
        files = (self.cert_file, self.key_file) + ((self.ca_file,) if self.ca_file else ())
        return tuple(file_signature(path) for path in files)

    def watch(self) -> None:
        """Check the files every ``interval`` in a daemon thread (the gunicorn master,
        after a first ``context()``), until ``stop()``."""
        factory = self._factory
        if factory is None:
            raise ValueError("watch() before a first context(): nothing to rebuild with")
        every(self.interval, lambda: self.context(factory), self._stop, "runguard-tls-watch")

    def stop(self) -> None:
        self._stop.set()

    def context(self, factory: ContextFactory) -> ssl.SSLContext:
        if self._pid != os.getpid():  # first use in a forked worker: it serves this one
            self._pid = os.getpid()
            self._tell()
        self._factory = factory
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

    def _rebuild(self, factory: ContextFactory, signature: tuple[object, ...]) -> None:
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
        self._tell()
        expires = datetime.fromtimestamp(not_after, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        log.info(
            "certificate %s %s: %s, expires %s",
            self.cert_file,
            "loaded" if first else "reloaded",
            subject,
            expires,
        )

    def _tell(self) -> None:
        if self._not_after and self.observer is not None:
            self.observer(self._not_after)

    def _after_fork(self) -> None:
        """In a child: the master's watcher is not there, and its lock is new (the
        parent held it over the fork)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()


_STORES: weakref.WeakSet[CertificateStore] = weakref.WeakSet()


def _before_fork() -> None:
    for store in list(_STORES):
        store._lock.acquire()  # wait for a reload under way in the watcher thread


def _after_fork_in_parent() -> None:
    for store in list(_STORES):
        if store._lock.locked():
            store._lock.release()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._after_fork()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


def peer_verified(environ: Mapping[str, Any]) -> bool:
    """Whether the connection of a WSGI request (gunicorn's) presented a client
    certificate its context verified (under ``CERT_OPTIONAL``, a certificate that is
    sent is verified or the handshake fails)."""
    sock = environ.get("gunicorn.socket")
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return False
    try:
        return bool(getpeercert())
    except (OSError, ValueError):  # not connected any more
        return False


def _certificate_summary(cert_file: str) -> tuple[float, str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    return cert.not_valid_after_utc.timestamp(), cert.subject.rfc4514_string()
