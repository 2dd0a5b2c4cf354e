"""runguard's own audit log: one JSON line per admission decision, on stdout.

A line says who asked what and what runguard decided, by rule id, and nothing of the
object itself: never env values, secret names or data, container specs, warnings'
text. The kube-apiserver audit log gets the same ids through ``auditAnnotations``.

Writing never holds up, or fails, the review that made the line: lines go through a
``LineWriter`` (a bounded queue and a thread of its own, see ``linewriter.py``), so a
stdout that is closed, full or read by nobody drops lines, counted in
``runguard_log_lines_dropped_total{log="audit"}`` and in ``/readyz``, and reviews go on.
Lines from several gunicorn workers sharing one stdout pipe stay whole (one ``write``
of at most ``PIPE_BUF`` bytes is atomic).
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO

import orjson

from webhook.serving.admission import AdmissionRequest, Endpoint, Outcome
from webhook.serving.linewriter import LineWriter
from webhook.serving.settings import DEFAULT_LOG_QUEUE

__all__ = ["AuditLog", "audit_record"]


def audit_record(
    endpoint: Endpoint,
    request: AdmissionRequest,
    outcome: Outcome,
    *,
    latency: float,
    policy_digest: str,
    now: float | None = None,
) -> dict[str, object]:
    """The audit line for one decision, as a dict (keys in a stable order)."""
    decision = outcome.decision
    gvk, user_info = request.get("kind"), request.get("userInfo")
    kind = (gvk.get("kind") if gvk else None) or (decision.kind if decision else "")
    user = (user_info.get("username") if user_info else None) or ""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return {
        "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "endpoint": endpoint,
        "uid": request["uid"],
        "operation": request["operation"],
        "kind": kind,
        "namespace": request.get("namespace") or (decision.namespace if decision else ""),
        "name": request.get("name") or (decision.name if decision else ""),
        "user": user,
        "dryRun": bool(request.get("dryRun", False)),
        "applies": bool(decision and decision.applies),
        "profile": decision.profile if decision else None,
        "mutations": _unique(c.rule for c in decision.mutations) if decision else [],
        "violations": _unique(v.rule for v in decision.violations) if decision else [],
        "allowed": outcome.response["response"]["allowed"],
        "decision": outcome.label,
        "enforcement": decision.enforcement if decision else None,
        "policy": policy_digest,
        "latencyMs": round(latency * 1000, 3),
    }


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


class AuditLog:
    """Writes audit records as JSON lines to ``stream`` (stdout by default).

    A stream with a file descriptor (stdout, a file, a pipe) is written by a
    ``LineWriter``; an in-memory one (``io.StringIO``, in tests) cannot block and is
    written at once.
    """

    def __init__(self, stream: IO[str] | None = None, *, capacity: int = DEFAULT_LOG_QUEUE) -> None:
        target = sys.stdout if stream is None else stream  # None: stdout closed at start
        self._memory: IO[str] | None = None
        self.writer: LineWriter | None = None
        try:
            if target is not None:
                target.fileno()
        except io.UnsupportedOperation:  # no descriptor: in memory
            self._memory = target
            return
        except (OSError, ValueError):  # closed: the writer says so
            pass
        self.writer = LineWriter.for_stream("audit", target, capacity=capacity)

    def write(self, record: dict[str, object]) -> None:
        line = orjson.dumps(record) + b"\n"
        if self.writer is not None:
            self.writer.put(line)
        elif self._memory is not None:
            self._memory.write(line.decode())

    def health(self) -> dict[str, object]:
        """``/readyz`` detail of the audit log (see ``LineWriter.health``)."""
        if self.writer is None:
            return {"status": "ok", "dropped": 0, "queued": 0}
        return self.writer.health()
