"""The TLS server context of a process, reloaded when the certificate files change.

gunicorn asks its ``ssl_context`` hook for a context on every new connection; its
default builds a fresh one (reading and parsing the key each time). A
``CertificateStore`` keeps one and checks the files at most once per ``interval``: a
renewed certificate is served to new connections, while connections already open keep
theirs. A half-written pair (certificate renewed, key not yet) fails to load and the
previous context stays. Messages go to the ``runguard.server`` logger.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from webhook.settings import RELOAD_INTERVAL
from webhook.watch import file_signature

__all__ = ["CertificateObserver", "CertificateStore", "ContextFactory"]

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
        *,
        interval: float = RELOAD_INTERVAL,
        observer: CertificateObserver | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval = interval
        self.observer = observer
        self._context: ssl.SSLContext | None = None
        self._signature: tuple[object, ...] = ()
        self._not_after = 0.0
        self._next_check = 0.0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _files_signature(self) -> tuple[object, ...]:
        return (file_signature(self.cert_file), file_signature(self.key_file))

    def context(self, factory: ContextFactory) -> ssl.SSLContext:
        if self._pid != os.getpid():  # first use in a forked worker
            self._pid = os.getpid()
            self._lock = threading.Lock()  # the master's could have been held at the fork
            self._tell()
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


def _certificate_summary(cert_file: str) -> tuple[float, str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    return cert.not_valid_after_utc.timestamp(), cert.subject.rfc4514_string()
