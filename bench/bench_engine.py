"""Engine benchmark: time per review (mutate + validate + JSON Patch), not a test.

Prints median and p99 per review for a typical GPU run pod (the size of the README's
GPU example) and for a 10-container pod, pods per second on one core, and ratios against
baselines measured in the same run. Each review is of another run's Pod (``runs``: a
thousand runs of the same template, each its own name, run label, secret and claim), as
each request brings the server a new object. A review is ``mutate`` then ``validate`` of its result
as the server makes them (``server_review``: ``/mutate`` leaves its receipt, ``/validate``
finds it and does not run the mutation steps again, ``webhook.engine.receipts``); the
same review with the backstop run (a Pod that bypassed ``/mutate`` costs that) is the
next row. Baselines:

- ``json round trip``: ``json.loads(json.dumps(pod))``, what the HTTP layer pays anyway;
- ``jsonpatch.make_patch``: the generic diff the engine avoids, on the same pod pair.

Bounded: each measurement stops after ``--count`` reviews or ``--seconds``, whichever first.

    python bench/bench_engine.py [--count 20000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import bench_config
import jsonpatch
from harness.workloads import gpu_pod

from webhook.engine import mutate, validate  # noqa: E402
from webhook.engine.receipts import SharedReceipts  # noqa: E402
from webhook.policy.loader import load_policy  # noqa: E402

RECEIPTS = SharedReceipts()  # as the server keeps them (webhook/serving/admission.py)
RUNS = 1000  # distinct runs a measurement cycles through


def server_review(pod: dict[str, Any], policy: Any) -> None:
    """One review as the server makes it: ``/mutate``, then ``/validate`` of its result."""
    validate(mutate(pod, policy, receipts=RECEIPTS).object, policy, receipts=RECEIPTS)


def runs(containers: int, count: int = RUNS) -> Callable[[], dict[str, Any]]:
    """The next of ``count`` runs' Pods, round and round: each review gets another run's
    objects (as the server decodes a new object per request), so nothing a review leaves
    behind (a receipt, a warm dict) serves the next one."""
    pods = [gpu_pod(containers, run) for run in range(1, count + 1)]
    return itertools.cycle(pods).__next__


def measure(fn: Callable[[], Any], count: int, seconds: float) -> list[float]:
    for _ in range(min(200, count)):  # warm caches
        fn()
    samples: list[float] = []
    # As a worker runs: the server's master collects and freezes what it loaded before
    # forking the workers (``webhook/serving/server.py``), so the collector walks only what a
    # review allocates.
    gc.collect()
    gc.freeze()
    deadline = time.perf_counter() + seconds
    clock = time.perf_counter
    while len(samples) < count and clock() < deadline:
        start = clock()
        fn()
        samples.append(clock() - start)
    return samples


def summary(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    median = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return median * 1e6, p99 * 1e6, len(ordered) / sum(ordered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--policy", default=str(bench_config.PLATFORM_POLICY_DIR))
    args = parser.parse_args()
    policy = load_policy(args.policy)

    print(f"{'workload':<44} {'median us':>10} {'p99 us':>10} {'per s':>10} {'x base':>7}")
    for label, pod in (
        ("typical GPU pod (1 container)", gpu_pod(1)),
        ("10-container pod", gpu_pod(10)),
    ):
        mutated = mutate(pod, policy).object
        pods = runs(len(pod["spec"]["containers"]))

        def review(next_pod: Callable[[], Any] = pods) -> None:
            server_review(next_pod(), policy)

        # Every review a run never seen (as a cluster's Pod creates are): what a review
        # compiles or computes once per run is paid each time, as in production.
        fresh = runs(len(pod["spec"]["containers"]), count=args.count + 300)

        def new_run_review(next_pod: Callable[[], Any] = fresh) -> None:
            server_review(next_pod(), policy)

        def backstop_run(pod: dict[str, Any] = pod) -> None:
            validate(mutate(pod, policy).object, policy)

        def baseline(pod: dict[str, Any] = pod) -> None:
            json.loads(json.dumps(pod))

        def generic_diff(pod: dict[str, Any] = pod, mutated: dict[str, Any] = mutated) -> None:
            jsonpatch.make_patch(pod, mutated)

        base = summary(measure(baseline, args.count, args.seconds))
        rows = [
            (f"{label}: review", summary(measure(review, args.count, args.seconds))),
            (
                f"{label}: review, new run",
                summary(measure(new_run_review, args.count, args.seconds)),
            ),
            (f"{label}: backstop run", summary(measure(backstop_run, args.count, args.seconds))),
            (f"{label}: json round trip (base)", base),
            (
                f"{label}: jsonpatch.make_patch only",
                summary(measure(generic_diff, args.count, args.seconds)),
            ),
        ]
        for name, (median, p99, rate) in rows:
            print(f"{name:<44} {median:>10.1f} {p99:>10.1f} {rate:>10.0f} {median / base[0]:>7.1f}")
    print("target: typical pod review median <= 100 us")


if __name__ == "__main__":
    main()
