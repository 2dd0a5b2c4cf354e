"""The cluster state's Prometheus metrics, read from the publication at scrape time.

Every worker maps the same control block, so whichever worker answers ``/metrics``
reports the same values; they are not written to ``prometheus_client``'s per-process
files (which would sum them over the workers) but collected when scraped. Operators'
kinds are labelled ``kind="GROUP/Kind"``, those that cannot be listed included (synced
0, their errors counted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from webhook.clusterstate.reader import SharedClusterState

__all__ = ["ClusterStateCollector"]


class ClusterStateCollector:
    """A ``prometheus_client`` collector of a ``SharedClusterState``'s stats."""

    def __init__(self, state: SharedClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        stats = self.state.all_stats()  # operators' kinds by GROUP/Kind, not installed too
        objects = GaugeMetricFamily(
            "runguard_cluster_state_objects", "Objects in the cluster state cache.", labels=["kind"]
        )
        synced = GaugeMetricFamily(
            "runguard_cluster_state_synced",
            "1 once the kind has been listed completely (and is watched since).",
            labels=["kind"],
        )
        age = GaugeMetricFamily(
            "runguard_cluster_state_last_event_age_seconds",
            "Seconds since the last change of the kind was applied (or, before any, since "
            "its last complete list).",
            labels=["kind"],
        )
        relists = CounterMetricFamily(
            "runguard_cluster_state_relists",
            "Complete lists after the first one (410 Gone, or repeated watch errors).",
            labels=["kind"],
        )
        errors = CounterMetricFamily(
            "runguard_cluster_state_watch_errors",
            "Failed lists and watches (each retried with backoff).",
            labels=["kind"],
        )
        events = CounterMetricFamily(
            "runguard_cluster_state_events",
            "Changes applied from watch events (updates that change no kept metadata not counted).",
            labels=["kind"],
        )
        for kind, kind_stats in stats.items():
            objects.add_metric([kind], kind_stats.objects)
            synced.add_metric([kind], 1 if kind_stats.synced else 0)
            last = kind_stats.last_event or kind_stats.last_sync
            if last:
                age.add_metric([kind], max(0.0, now - last))
            relists.add_metric([kind], kind_stats.relists)
            errors.add_metric([kind], kind_stats.watch_errors)
            events.add_metric([kind], kind_stats.events)
        heartbeat = GaugeMetricFamily(
            "runguard_cluster_state_watch_heartbeat_age_seconds",
            "Seconds since the watch process last said it is alive (about 1 while it runs).",
        )
        pid, beat = self.state.writer()
        if pid:
            heartbeat.add_metric([], max(0.0, now - beat))
        yield from (objects, synced, age, relists, errors, events, heartbeat)
