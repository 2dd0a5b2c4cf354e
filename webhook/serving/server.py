"""gunicorn: the configuration, the hooks and the application that serve runguard.

One source of truth for the gunicorn configuration: ``gunicorn_options()`` is what
``runguard serve`` runs in-process (``RunguardApplication``) and what the repository's
``gunicorn.conf.py`` exports for a plain ``gunicorn -c gunicorn.conf.py``. The hooks
tie the other modules to gunicorn's processes:

* the master loads the app and the policy once, builds the TLS context once (a bad
  certificate fails at start) and publishes its policy decisions for the workers
  (``when_ready``; ``policystore.py`` has the protocol); a forked worker follows them
  (``post_fork``);
* the master keeps the TLS context up to date too (``tls.py``), so a worker forked
  later serves the last good certificate;
* metrics are written by workers only (``PROMETHEUS_MULTIPROC_DIR``, a temporary
  directory made at start, see ``metrics.py``): the master never touches
  ``prometheus_client``, whose process-wide lock a fork must not copy while held;
* logs never block (``logs.py``, ``auditlog.py``): gunicorn's own lines go through
  ``GunicornLogger``, errors gunicorn answers itself are JSON (``RunguardWorker``),
  and a worker leaving gives its logs a bounded time to be written.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import ssl
import tempfile
from dataclasses import asdict
from functools import partial
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook.serving.linewriter import all_writers, flush_all
from webhook.serving.logs import GunicornLogger, configure_logging
from webhook.serving.policystore import PolicyPublication, PolicyStore
from webhook.serving.settings import ServeSettings
from webhook.serving.tls import CertificateStore, ContextFactory
from webhook.serving.worker import RunguardWorker

__all__ = [
    "RunguardApplication",
    "gunicorn_options",
    "prepare_multiprocess_metrics",
    "remove_multiprocess_metrics",
    "ssl_context",
]

_MULTIPROC_DIR_OWNED: list[tuple[int, str]] = []  # (pid of the maker, directory or "")
_MASTER_PID = [0]  # the gunicorn master records no metrics (see module doc)
EXIT_FLUSH = 2.0  # seconds a leaving process gives its logs to be written
GRACEFUL_STOP = 25  # seconds in-flight reviews get after a worker stops accepting


# ------------------------------------------------------------------------ metrics


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


def _certificate_served(not_after: float) -> None:
    if os.getpid() != _MASTER_PID[0]:
        from webhook.serving import metrics

        metrics.get().certificate_expiry.set(not_after)


def _count_dropped(log: str, lines: int) -> None:
    from webhook.serving import metrics

    metrics.get().log_lines_dropped.labels(log).inc(lines)


# ------------------------------------------------------------------ certificates

_CERTIFICATES: dict[tuple[str, str, str | None], CertificateStore] = {}


def ssl_context(conf: Any, default_ssl_context_factory: ContextFactory) -> Any:
    """gunicorn ``ssl_context`` hook: the process's cached context, TLS 1.2 or newer."""
    key = (conf.certfile, conf.keyfile, conf.ca_certs)
    store = _CERTIFICATES.get(key)
    if store is None:
        store = _CERTIFICATES.setdefault(key, CertificateStore(*key, observer=_certificate_served))
    return store.context(default_ssl_context_factory)


# ------------------------------------------------------------------------- hooks


def _runguard_store(arbiter: Any) -> PolicyStore | None:
    app = arbiter.app.wsgi()
    state = getattr(app, "extensions", {}).get("runguard")
    return getattr(state, "store", None)


class _ReusePort:
    """gunicorn's configuration, with ``SO_REUSEPORT`` on the master's listening sockets.

    Not gunicorn's own ``reuse_port``: that makes every forked worker bind new sockets
    from the configuration, which fails while the certificate file is missing (a
    worker replaced then would not boot); ``RunguardWorker`` binds its own beside them.
    """

    reuse_port = True

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


def on_starting(arbiter: Any) -> None:
    _MASTER_PID[0] = os.getpid()
    configure_logging(arbiter.cfg.loglevel)
    inherited = "GUNICORN_FD" in os.environ or "LISTEN_FDS" in os.environ
    if getattr(arbiter.cfg.worker_class, "own_listener", False) and not inherited:
        from gunicorn import sock

        if not arbiter.LISTENERS:
            arbiter.LISTENERS = sock.create_sockets(_ReusePort(arbiter.cfg), arbiter.log)


def when_ready(arbiter: Any) -> None:
    # Fail at start on a bad certificate or key, and fork workers with the context built.
    from gunicorn import sock

    sock.ssl_context(arbiter.cfg)
    for certificates in _CERTIFICATES.values():
        certificates.watch()  # so a worker forked later starts from the last good one
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


def post_fork(arbiter: Any, worker: Any, *, shutdown_delay: float = 0.0) -> None:
    worker.shutdown_delay = shutdown_delay  # drain this long on SIGTERM (``worker.py``)
    for writer in all_writers():  # a worker counts its dropped log lines (the master not)
        writer.count_drops(partial(_count_dropped, writer.name))
    store = _runguard_store(arbiter)
    if store is not None and store.publication is not None:
        store.follow()  # the master decides; this worker serves what it published


def worker_exit(arbiter: Any, worker: Any) -> None:
    flush_all(EXIT_FLUSH)  # the audit lines of its last reviews, if the sink takes them


def child_exit(arbiter: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from webhook.serving import metrics

        metrics.mark_process_dead(worker.pid)


def on_exit(arbiter: Any) -> None:
    store = _runguard_store(arbiter)
    if store is not None:
        store.stop()
    for certificates in _CERTIFICATES.values():
        certificates.stop()
    remove_multiprocess_metrics()
    flush_all(EXIT_FLUSH)


# ---------------------------------------------------------------------- gunicorn


def gunicorn_options(settings: ServeSettings) -> dict[str, Any]:
    """The gunicorn configuration of runguard (see docs/dev/server.md for the figures).

    ``gthread`` with keep-alive: the apiserver keeps its connections to a webhook open,
    and a TLS handshake costs several times a review, so a worker must serve many
    requests per connection (``sync`` closes every connection after one request).
    """
    worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
    options: dict[str, Any] = {
        "bind": [settings.bind],
        "workers": settings.workers,
        "worker_class": RunguardWorker,  # gthread, with JSON errors
        "threads": settings.threads,
        "keepalive": 75,  # the apiserver reuses its connections; idle ones close after 75 s
        "timeout": 30,  # a worker silent this long is killed and replaced
        # on SIGTERM: drain for the shutdown delay, then in-flight reviews finish (the
        # Deployment's terminationGracePeriodSeconds covers both)
        "graceful_timeout": GRACEFUL_STOP + math.ceil(settings.shutdown_delay),
        "preload_app": True,
        "certfile": str(settings.cert_file),
        "keyfile": str(settings.key_file),
        "ssl_context": ssl_context,
        # mTLS: ask for a client certificate, verify one that is sent; the app refuses
        # every path but the probes without one (docs/dev/server.md)
        "ca_certs": str(settings.client_ca) if settings.client_ca else None,
        "cert_reqs": ssl.CERT_OPTIONAL if settings.client_ca else ssl.CERT_NONE,
        "limit_request_line": 4094,
        "limit_request_fields": 100,
        "control_socket_disable": True,
        "accesslog": None,  # the audit log says more, without the noise of probes
        "errorlog": "-",
        "logger_class": GunicornLogger,  # never blocks on a full or closed stderr
        "loglevel": "info",
        "proc_name": "runguard",
        "on_starting": on_starting,
        "when_ready": when_ready,
        "post_fork": partial(post_fork, shutdown_delay=settings.shutdown_delay),
        "worker_exit": worker_exit,
        "child_exit": child_exit,
        "on_exit": on_exit,
    }
    if worker_tmp_dir:
        options["worker_tmp_dir"] = worker_tmp_dir
    return options


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
        from webhook.serving.app import create_app

        return create_app({**asdict(self.settings), "policy_store": self.store})
