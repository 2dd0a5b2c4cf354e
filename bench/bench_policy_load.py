"""Policy load benchmark: time to load a policy directory into a ``Policy``, not a test.

Loads ``policies/`` and ``policies/examples/mlrun/`` (YAML with lines, schema, cross-document
checks, model build) and prints, per directory, the median and best wall time and the best
CPU time per load, and the split between reading + checking and building the model.

Bounded: each directory is loaded ``--count`` times or for ``--seconds``, whichever first.

    python bench/bench_policy_load.py [--count 200] [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench_config import REPO as ROOT

from webhook.policy.loader import load_policy, read_policy
from webhook.policy.model import build_run_policy

DIRECTORIES = ("policies", "policies/examples/mlrun")


def measure(fn: Callable[[], Any], count: int, seconds: float) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each call, after a few warm-up calls."""
    for _ in range(min(5, count)):
        fn()
    walls: list[float] = []
    cpus: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(walls) < count and time.perf_counter() < deadline:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    print(f"{'directory':<26} {'loads':>6} {'median ms':>10} {'best ms':>8} {'best CPU ms':>12}")
    for directory in DIRECTORIES:
        path = ROOT / directory
        walls, cpus = measure(lambda path=path: load_policy(path), args.count, args.seconds)
        print(
            f"{directory:<26} {len(walls):>6} {statistics.median(walls) * 1e3:>10.2f} "
            f"{min(walls) * 1e3:>8.2f} {min(cpus) * 1e3:>12.2f}"
        )
        source = read_policy(path)
        run_policy = source.run_policy
        assert run_policy is not None and not source.errors
        profiles = [p.data for p in source.profiles]
        builds, _ = measure(
            lambda data=run_policy.data, profiles=profiles: build_run_policy(data, profiles),
            args.count,
            args.seconds / 4,
        )
        print(
            f"{'  of which build_run_policy':<26} {len(builds):>6} "
            f"{statistics.median(builds) * 1e3:>10.3f} {min(builds) * 1e3:>8.3f}"
        )


if __name__ == "__main__":
    main()
