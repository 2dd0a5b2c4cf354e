"""runguard's own audit log: one JSON line per admission decision, on stdout.

A line says who asked what and what runguard decided, by rule id, and nothing of the
object itself: never env values, secret names or data, container specs, warnings'
text. The kube-apiserver audit log gets the same ids through ``auditAnnotations``.

Each line is written with a single ``write`` + ``flush`` under a lock; lines from
several gunicorn workers sharing the same stdout pipe stay whole (one ``write`` of
less than ``PIPE_BUF`` bytes is atomic).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO

import orjson

from webhook.admission import AdmissionRequest, Endpoint, Outcome

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
    """Writes audit records as JSON lines to ``stream`` (stdout by default)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, record: dict[str, object]) -> None:
        line = orjson.dumps(record).decode() + "\n"
        stream = self._stream or sys.stdout
        with self._lock:
            try:
                stream.write(line)
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stdout must not fail a review
                pass
