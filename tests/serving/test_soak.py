"""The soak in a short form: a mixed load while the server is disturbed, then no leak.

``bench/soak.py`` is the long form (200k requests, its figures printed); this runs
``harness.soak.soak()`` with a few thousand requests on the same server (``RunguardWorker``, 2
workers x 2 threads, TLS, the repository's policies in a ConfigMap-style volume, the
audit log a FIFO read at 512 bytes/s and a log queue of 64 lines): keep-alive and new
connections, allowed, denied and malformed reviews to ``/mutate`` and ``/validate``,
slow and idle connections held open, one policy swap. Asserted: counts, statuses,
decisions, descriptors, threads and memory; never a duration (the run is bounded in
count and time, and how long it took is not a result).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import RunguardServer, eventually, soak

from webhook.serving.worker import REQUEST_TIMEOUT  # noqa: E402

REQUESTS = 4000
SECONDS = 120.0  # a bound on the run, never asserted
SLOW = 16
LOG_QUEUE = 64  # audit lines a worker holds for the slow sink before it drops
SINK_RATE = 512  # bytes/s the audit log is read at: far less than any run writes
FD_SLACK = 3  # e.g. the harness's own keep-alive connection to one worker
THREAD_SLACK = 2  # a worker's pool may have started its second thread only under load
# loose: a run grows a worker by about 1 MB; one that kept its reviews and answers
# (3-4 KB each way) would grow by about 25 MB
RSS_SLACK_MB = 16.0


def idle_usage(server: RunguardServer) -> dict[int, soak.Sample]:
    return {one.pid: one for one in soak.sample(server, 0, 0.0)}


@pytest.mark.slow
def test_a_disturbed_mixed_load_is_all_answered_rightly_and_leaves_no_leak(
    tmp_path: Path,
) -> None:
    kinds = soak.mix()
    with soak.soaked_server(tmp_path, log_queue=LOG_QUEUE, sink_rate=SINK_RATE) as (server, sink):
        report = soak.soak(
            server,
            requests=REQUESTS,
            seconds=SECONDS,
            keepalive=3,
            fresh=1,
            slow=SLOW,
            reloads=1,
            sample_every=1.0,
        )
        tally = report.tally
        soak.print_report(report, soak.audit_dropped(server), sink.read_bytes)  # on failure
        assert report.background_errors == [] and report.clients_lost == 0
        # every request sent was answered: no reset, no timeout, no closed connection
        assert tally.sent == report.issued > 0
        assert report.unanswered == 0, dict(tally.unanswered)
        assert tally.errors_5xx == 0, dict(tally.statuses)
        # ... with the expected answer: each decision, each uid, a JSON 400 for the
        # malformed reviews, a patch from one of the two policy versions
        assert report.wrong == 0, tally.examples
        assert set(tally.answered_by_kind) == {kind.name for kind in kinds}
        malformed = sum(tally.answered_by_kind[k.name] for k in kinds if k.expect == "malformed")
        assert set(tally.statuses) == {200, 400} and tally.statuses[400] == malformed
        assert tally.fresh_s and tally.keepalive_s  # both kinds of connection were used
        # the disturbances happened: slow clients held, the policy swapped and then
        # served by every worker, audit lines dropped for the sink that could not keep up
        assert report.slow_held >= SLOW  # opened again every HOLD_SECONDS
        assert report.swaps == report.adopted == 1
        assert report.workers_after == report.workers_before  # none crashed or was killed

        # idle again: every worker back to its descriptors and threads of before
        def back_to_baseline() -> bool:
            now = idle_usage(server)
            return all(
                pid in now
                and now[pid].fds <= fds + FD_SLACK
                and now[pid].threads <= threads + THREAD_SLACK
                for pid, (_, fds, threads) in report.baseline.items()
            )

        eventually(
            f"descriptors and threads back to {report.baseline} once idle "
            f"(last samples {report.samples[-len(report.baseline) :]})",
            back_to_baseline,
            REQUEST_TIMEOUT + 20,
            interval=0.5,
        )
        now = idle_usage(server)
        for pid, (rss, _, _) in report.baseline.items():
            assert now[pid].rss_mb <= rss + RSS_SLACK_MB, (pid, rss, now[pid].rss_mb)

        assert soak.audit_dropped(server) > 0  # the sink was slower than the traffic...
        ready = server.get("/readyz").json()
        assert ready["status"] == "ready"  # ... and that degraded logging only
        assert "Traceback" not in server.stderr
