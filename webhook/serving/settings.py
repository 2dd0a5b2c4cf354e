"""The settings of the admission server, each declared once.

``SETTINGS`` is the one list of what an operator can set: the ``ServeSettings`` field,
its command-line flag and its environment variable (``RUNGUARD_`` and the field's name
in capitals). ``runguard serve`` builds its flags and ``--help`` from it, ``create_app``
and ``gunicorn.conf.py`` read the environment through it, so a new setting is one line
here (and one field of ``ServeSettings``).

Values are parsed the same wherever they come from; a parser takes a text or a value
it made itself (``byte_size("4Mi")`` and ``byte_size(4194304)``), so settings handed on
from ``ServeSettings`` to ``create_app`` read back unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.inputs.kubeconfig import IN_CLUSTER

__all__ = [
    "BY_NAME",
    "DEFAULT_BIND",
    "DEFAULT_LOG_QUEUE",
    "DEFAULT_MAX_BODY",
    "DEFAULT_THREADS",
    "IN_CLUSTER",
    "MAX_SHUTDOWN_DELAY",
    "RELOAD_INTERVAL",
    "SETTINGS",
    "ServeSettings",
    "Setting",
    "SettingsError",
    "byte_size",
    "default_workers",
    "read_settings",
]

ENV_PREFIX = "RUNGUARD_"
DEFAULT_BIND = "127.0.0.1:8443"
DEFAULT_MAX_BODY = 4 * 1024 * 1024  # an UPDATE review carries object and oldObject
DEFAULT_THREADS = 2  # CPU-bound reviews: more threads only queue on the GIL (docs/dev/server.md)
DEFAULT_LOG_QUEUE = 4096  # log lines a process holds for a slow sink before it drops
RELOAD_INTERVAL = 1.0  # seconds between checks of the policy and certificate files
MAX_SHUTDOWN_DELAY = 120  # seconds; a Pod's grace period must cover it and the graceful stop


class SettingsError(ValueError):
    """A ``runguard serve`` setting that is missing or unusable."""


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; one runguard may not even look at is a clear error (a
    Secret mounted 0440 for another group: the Pod needs ``fsGroup``), not a traceback."""
    try:
        return path.is_file()
    except OSError as exc:
        raise SettingsError(f"cannot use {path}: {exc}") from None


# ----------------------------------------------------------------------- parsers


def default_workers() -> int:
    """One worker per core, at least two (a killed worker never leaves none)."""
    return max(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)


def positive_int(value: object, name: str = "value") -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise SettingsError(f"{name} must be at least 1, got {number}")
    return number


def _seconds(value: object, name: str, *, zero: bool = False, most: float = 3600) -> float:
    """Seconds, above 0 (or from 0, with ``zero``) and at most ``most``."""
    try:
        seconds = float(str(value))
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, got {value!r}") from None
    if zero and not 0 <= seconds <= most:
        raise SettingsError(f"{name} must be from 0 to {most:g}, got {seconds:g}")
    if not zero and not 0 < seconds <= most:
        raise SettingsError(f"{name} must be above 0 and at most {most:g}, got {seconds}")
    return seconds


def _delay(value: object, name: str) -> float:
    return _seconds(value, name, zero=True, most=MAX_SHUTDOWN_DELAY)


_SIZE_SUFFIXES = {"": 1, "k": 1000, "ki": 1024, "m": 1000**2, "mi": 1024**2}


def byte_size(value: object, name: str = "max body") -> int:
    """Bytes, given as ``4194304``, ``4Mi`` or ``512Ki``."""
    text = str(value).strip()
    digits = text.rstrip("KkMmIi")
    suffix = text[len(digits) :].lower()
    if not digits.isdigit() or suffix not in _SIZE_SUFFIXES:
        raise SettingsError(f"{name} must be bytes like 4194304 or 4Mi, got {text!r}")
    size = int(digits) * _SIZE_SUFFIXES[suffix]
    if size < 1024:
        raise SettingsError(f"{name} must be at least 1Ki, got {text!r}")
    return size


# ------------------------------------------------------------------ declaration


@dataclass(frozen=True)
class Setting:
    """One setting: a ``ServeSettings`` field, its flag and its environment variable.

    ``flags`` empty: ``--`` and the name with dashes; None: environment only.
    """

    name: str
    help: str
    parse: Callable[[object, str], object]
    flags: tuple[str, ...] | None = ()
    metavar: str = "VALUE"
    required: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def option_strings(self) -> tuple[str, ...]:
        return self.flags or (f"--{self.name.replace('_', '-')}",)

    @property
    def label(self) -> str:
        """How an error names it: ``--cert / RUNGUARD_CERT_FILE``."""
        return f"{self.option_strings[-1]} / {self.env}" if self.flags is not None else self.env


def _path(value: object, name: str) -> Path:
    return Path(str(value))


def _text(value: object, name: str) -> str:
    return str(value)


SETTINGS: tuple[Setting, ...] = (
    Setting("policy_dir", "policy directory", _path, ("-p", "--policy-dir"), "DIR", True),
    Setting("cert_file", "serving certificate (PEM)", _path, ("--cert",), "FILE", True),
    Setting("key_file", "its private key (PEM)", _path, ("--key",), "FILE", True),
    Setting(
        "client_ca",
        "require a client certificate signed by this CA on every path but /healthz "
        "and /readyz (mTLS for the apiserver; the kubelet's probes stay open)",
        _path,
        metavar="FILE",
    ),
    Setting("bind", f"address to listen on (default {DEFAULT_BIND})", _text, metavar="HOST:PORT"),
    Setting(
        "workers", "worker processes (default: one per core, at least 2)", positive_int, metavar="N"
    ),
    Setting(
        "threads", f"threads per worker (default {DEFAULT_THREADS})", positive_int, metavar="N"
    ),
    Setting("max_body", "request size limit (default 4Mi)", byte_size, metavar="BYTES"),
    Setting(
        "log_queue",
        f"log lines a process holds while stdout or stderr is slow (default "
        f"{DEFAULT_LOG_QUEUE}); more are dropped and counted, never waited for",
        positive_int,
        metavar="LINES",
    ),
    Setting(
        "shutdown_delay",
        "seconds a server told to stop (SIGTERM) keeps accepting and answering before it "
        "stops, closing each connection after its answer and saying 'draining' on "
        "/readyz, so load balancers and the apiserver drop it first (default 0; the "
        "shipped Deployment sets 5)",
        _delay,
        metavar="SECONDS",
    ),
    Setting(
        "reload_interval",
        f"seconds between checks of the policy and certificate files (default {RELOAD_INTERVAL:g})",
        _seconds,
        None,
    ),
    Setting(
        "cluster_state",
        "watch the cluster state ownership decides with (claims', secrets' and "
        "configMaps' metadata, classes, pod controllers): in-cluster (the pod's "
        "ServiceAccount) or a kubeconfig FILE; /readyz waits for its first sync",
        _text,
        metavar="in-cluster|FILE",
    ),
    Setting(
        "policy_objects",
        "read the policy from the cluster's RunPolicy and Profile objects instead of "
        "files: in-cluster (the pod's ServiceAccount) or a kubeconfig FILE; they are "
        "mirrored into the policy directory (empty, writable), kept in sync by a watch, "
        "and each object's status says whether it loaded",
        _text,
        metavar="in-cluster|FILE",
    ),
)

BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


def read_settings(
    given: Mapping[str, object], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Each setting from ``given`` (by name; None is absent), else from its environment
    variable (an empty one is unset), parsed; settings found in neither are left out."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        value = given.get(setting.name)
        if value is None and env.get(setting.env):
            value = env[setting.env]
        if value is not None:
            values[setting.name] = setting.parse(value, setting.name.replace("_", " "))
    return values


@dataclass(frozen=True)
class ServeSettings:
    """What ``runguard serve`` needs: one field per entry of ``SETTINGS``."""

    policy_dir: Path
    cert_file: Path
    key_file: Path
    client_ca: Path | None = None
    bind: str = DEFAULT_BIND
    workers: int = field(default_factory=default_workers)
    threads: int = DEFAULT_THREADS
    max_body: int = DEFAULT_MAX_BODY
    log_queue: int = DEFAULT_LOG_QUEUE
    shutdown_delay: float = 0.0
    reload_interval: float = RELOAD_INTERVAL
    cluster_state: str | None = None
    policy_objects: str | None = None

    @classmethod
    def resolve(
        cls, given: Mapping[str, object], env: Mapping[str, str] | None = None
    ) -> ServeSettings:
        """Settings from ``given`` (command-line values, None when absent), else the env."""
        values = read_settings(given, env)
        missing = [s.label for s in SETTINGS if s.required and s.name not in values]
        if missing:
            raise SettingsError("missing " + ", ".join(missing))
        settings = cls(**values)
        if not settings.policy_dir.is_dir():
            raise SettingsError(f"policy directory {settings.policy_dir} does not exist")
        for path in (settings.cert_file, settings.key_file, settings.client_ca):
            if path is not None and not _is_file(path):
                raise SettingsError(f"{path} does not exist")
        source = settings.cluster_state
        if source is not None and source != IN_CLUSTER and not _is_file(Path(source)):
            raise SettingsError(f"cluster state: kubeconfig {source} does not exist")
        source = settings.policy_objects
        if source is not None and source != IN_CLUSTER and not _is_file(Path(source)):
            raise SettingsError(f"policy objects: kubeconfig {source} does not exist")
        return settings
