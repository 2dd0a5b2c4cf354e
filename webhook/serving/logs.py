"""The server's own log (stderr): runguard's and gunicorn's lines, never waited for.

Every line goes through one ``LineWriter`` per stream (see ``linewriter.py``): a
record is formatted in the thread that logs it and queued; a stderr that is closed,
full or read by nobody drops lines (counted, and reported in ``/readyz``) instead of
blocking a review, a health probe or the master's handling of SIGTERM.

``configure_logging`` puts the handler on the root logger (so Flask, warnings and any
library log there too, and Flask adds no handler of its own that would write to the
stream directly); ``GunicornLogger`` swaps gunicorn's stream handlers for the same kind.
Stdout is the audit log (``auditlog.py``).
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

from gunicorn import glogging

from webhook.serving.linewriter import LineWriter
from webhook.serving.settings import DEFAULT_LOG_QUEUE

__all__ = [
    "GunicornLogger",
    "LineHandler",
    "configure_logging",
    "server_log",
    "stream_health",
    "stream_writer",
]

FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"
FLUSH_TIMEOUT = 1.0  # at exit, how long a handler waits for its lines to be written

_STREAM_WRITERS: dict[int, LineWriter] = {}  # by descriptor: one queue per stream


class LineHandler(logging.Handler):
    """A logging handler that formats in the caller's thread and hands the line to a
    ``LineWriter``: it never blocks and never raises."""

    def __init__(self, writer: LineWriter, formatter: logging.Formatter | None = None) -> None:
        super().__init__()
        self.writer = writer
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a bad format string: the line is lost, not the request
            self.writer.drop()
            return
        self.writer.put(text.encode("utf-8", "backslashreplace") + b"\n")

    def flush(self) -> None:
        self.writer.flush(FLUSH_TIMEOUT)


def stream_writer(
    name: str, stream: IO[str] | None, capacity: int = DEFAULT_LOG_QUEUE
) -> LineWriter:
    """The one writer of ``stream``'s descriptor in this process (made on first use)."""
    try:
        fd = stream.fileno() if stream is not None else -1
    except (OSError, ValueError):
        fd = -1
    writer = _STREAM_WRITERS.get(fd)
    if writer is None:
        writer = _STREAM_WRITERS.setdefault(
            fd, LineWriter.for_stream(name, stream, capacity=capacity)
        )
    return writer


def server_log(capacity: int = DEFAULT_LOG_QUEUE) -> LineWriter:
    """The writer of stderr, the server log (``capacity`` counts on first use only)."""
    return stream_writer("server", sys.stderr, capacity)


def stream_health() -> dict[str, dict[str, object]]:
    """``/readyz`` detail of the streams written so far, by name (``server``, ...)."""
    return {writer.name: writer.health() for writer in _STREAM_WRITERS.values()}


def configure_logging(level: str = "info", capacity: int = DEFAULT_LOG_QUEUE) -> None:
    """runguard's operational logs on stderr, next to gunicorn's; stdout is the audit log."""
    root = logging.getLogger()
    if any(isinstance(handler, LineHandler) for handler in root.handlers):
        return
    handler = LineHandler(server_log(capacity), logging.Formatter(FORMAT, DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # libraries: warnings and errors only
    logging.getLogger("runguard").setLevel(level.upper())
    logging.captureWarnings(True)  # warnings.warn writes to sys.stderr otherwise


class GunicornLogger(glogging.Logger):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's logger (``logger_class``), its stream handlers (``errorlog = "-"``,
    ``accesslog = "-"``) replaced by ``LineHandler``s on the same streams."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in list(log.handlers):
                if type(handler) is not logging.StreamHandler:  # files, syslog: as they are
                    continue
                stream = handler.stream
                name = "server" if stream is sys.stderr else "access"
                replacement = LineHandler(stream_writer(name, stream), handler.formatter)
                replacement._gunicorn = True  # type: ignore[attr-defined]  # gunicorn's mark
                log.removeHandler(handler)
                log.addHandler(replacement)
