"""Prometheus metrics, correct under several gunicorn workers.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``runguard serve`` creates it), every process
writes its values to files there and ``/metrics`` aggregates them across the live
and dead workers; gauges use a ``live*`` mode so a dead worker's value disappears once
gunicorn's ``child_exit`` hook marks it. They are chosen so that a process that has
not set one yet (it reads 0) raises no false alarm: ``runguard_policy_rejected`` is
aggregated with max, the timestamps with max or most-recent. Without the variable
(tests, a single process) the metrics are ordinary in-process ones.

The variable is read when ``prometheus_client`` is first imported, so nothing imports
this module before ``runguard serve`` has set it up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "exposition", "get", "mark_process_dead"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Fine below 10 ms for a 1 ms p99, coarse up to the apiserver's 10 s webhook timeout.
LATENCY_BUCKETS = (
    0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass(frozen=True)
class Metrics:
    reviews: Counter
    latency: Histogram
    violations: Counter
    policy_reloads: Counter
    policy_last_success: Gauge
    policy_rejected: Gauge
    certificate_expiry: Gauge
    log_lines_dropped: Counter
    registry: CollectorRegistry
    _children: dict[tuple[str, ...], Any] = field(default_factory=dict)

    def observe_review(self, endpoint: str, decision: str, seconds: float | None) -> None:
        """Count one review and, when the engine ran, its latency (children cached:
        ``labels()`` takes a lock and builds a key on every call)."""
        counter = self._children.get(("reviews", endpoint, decision))
        if counter is None:
            counter = self._children.setdefault(
                ("reviews", endpoint, decision), self.reviews.labels(endpoint, decision)
            )
        counter.inc()
        if seconds is not None:
            histogram = self._children.get(("latency", endpoint))
            if histogram is None:
                histogram = self._children.setdefault(
                    ("latency", endpoint), self.latency.labels(endpoint)
                )
            histogram.observe(seconds)


@lru_cache(maxsize=1)
def get() -> Metrics:
    """This process's metrics, created on first use."""
    registry = CollectorRegistry(auto_describe=True)
    return Metrics(
        reviews=Counter(
            "runguard_admission_reviews",
            "Admission reviews answered, by endpoint and decision "
            "(allowed, patched, denied, error, malformed, unavailable).",
            ["endpoint", "decision"],
            registry=registry,
        ),
        latency=Histogram(
            "runguard_admission_review_duration_seconds",
            "Time to answer an admission review, from body read to response built.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ),
        violations=Counter(
            "runguard_policy_violations",
            "Violations found, by rule id and the enforcement applied.",
            ["rule", "enforcement"],
            registry=registry,
        ),
        policy_reloads=Counter(
            "runguard_policy_reloads",
            "Policy reload attempts after a change on disk, by result (success, failure); "
            "each worker counts the master's attempts it adopts.",
            ["result"],
            registry=registry,
        ),
        policy_last_success=Gauge(
            "runguard_policy_last_reload_success_timestamp_seconds",
            "Unix time the serving policy was loaded.",
            registry=registry,
            multiprocess_mode="livemax",
        ),
        policy_rejected=Gauge(
            "runguard_policy_rejected",
            "1 while the policy files on disk are rejected (errors in the log and /readyz) "
            "and the last good policy keeps serving; 0 when the files on disk serve.",
            registry=registry,
            multiprocess_mode="livemax",
        ),
        certificate_expiry=Gauge(
            "runguard_certificate_expiry_timestamp_seconds",
            "Unix time the serving certificate expires (notAfter).",
            registry=registry,
            multiprocess_mode="livemostrecent",
        ),
        log_lines_dropped=Counter(
            "runguard_log_lines_dropped",
            "Log lines dropped, by log (audit: stdout, server: stderr), because the stream "
            "was closed, full or not read fast enough; reviews never wait for a log.",
            ["log"],
            registry=registry,
        ),
        registry=registry,
    )


def exposition(*collectors: Collector) -> bytes:
    """The text exposition for ``GET /metrics``: all workers' values when multiprocess,
    then what ``collectors`` read at scrape time (values every worker shares)."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        text = generate_latest(registry)
    else:
        text = generate_latest(get().registry)
    if collectors:
        shared = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            shared.register(collector)
        text += generate_latest(shared)
    return text


def mark_process_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (gunicorn ``child_exit`` hook)."""
    if os.environ.get(MULTIPROC_ENV):
        _multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
