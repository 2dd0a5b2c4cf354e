"""Cost against object size: one review's CPU time as a list in the Pod grows, and its slope.

Not a test. For each series (env entries of one container, containers, volumes) and
each size, a run Pod is written as small as it can be (sizes past the apiserver's 3 MiB
request limit are skipped: it refuses them; ``SERIES`` and ``as_sent`` of
``tests/harness/workloads.py``), then timed, as CPU time (best of a few runs,
so other processes on the machine move it little):

- as the webhook gets it: the Pod with the fields the apiserver defaults before
  admission (per container ``terminationMessagePath``, ``imagePullPolicy``...), in an
  AdmissionReview; past the server's body limit it is answered 413 before any work;
  - ``mutate``: ``/mutate``;
  - ``validate``: ``/validate`` of the Pod as sent, mutation bypassed: the worst case,
    every violation reported and the mutation it checks for run as well;
  - ``validate'``: ``/validate`` of the mutated Pod (when that is within the limit);
- ``apply``: ``runguard apply``'s engine work (mutate, then validate the result) on the
  Pod as written (files up to 3 MiB).

Also printed: the JSON Patch's bytes against the mutated Pod's, and per series the slope
of log(time) against log(size) over the sizes from 1000 up (1.0 is linear, 2.0 quadratic).

Bounded: each size is repeated for at most ``--seconds``, and a series stops once one
review took more than ``--max-review`` seconds. ``--no-gc`` turns the cyclic garbage
collector off, which separates the engine's own cost from the collector's passes over
everything a large object allocates (they grow a little faster than linearly).

    python bench/bench_sizes.py [--sizes 10,100,1000,3000,10000,30000,100000] [--no-gc]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from collections.abc import Callable
from typing import Any

from bench_config import PLATFORM_USER, POLICY_DIR
from harness.workloads import SERIES, as_sent

from webhook.engine import Decision, evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.policy.loader import load_policy
from webhook.serving import gcpause
from webhook.serving.settings import DEFAULT_MAX_BODY

REQUEST_LIMIT = 3 * 1024 * 1024  # the apiserver's request body limit
REVIEW_OVERHEAD = 1024  # an AdmissionReview's fields around the object (uid, userInfo...)
PLATFORM = Requester(PLATFORM_USER)  # policies/'s platform identity
VALIDATED = "validate' ms"  # of the mutated Pod


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def cpu(fn: Callable[[], Decision], seconds: float, ceiling: float) -> tuple[float, Decision]:
    """Best CPU seconds of ``fn`` over up to 5 runs (at most ``seconds`` in all, a single
    run past ``ceiling``), and its decision."""
    best, total, runs = math.inf, 0.0, 0
    decision = None
    while runs == 0 or (runs < 5 and total < seconds and best <= ceiling):
        start = time.process_time()
        decision = fn()
        spent = time.process_time() - start
        best, total, runs = min(best, spent), total + spent, runs + 1
    assert decision is not None and decision.error is None
    return best, decision


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(time) against log(size)."""
    if len(points) < 2:
        return None
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(max(t, 1e-9)) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,3000,10000,30000,100000")
    parser.add_argument("--policy", default=str(POLICY_DIR))
    parser.add_argument("--seconds", type=float, default=2.0, help="repeat a size this long")
    parser.add_argument("--max-review", type=float, default=30.0, help="stop a series past it")
    parser.add_argument(
        "--no-gc", action="store_true", help="cyclic GC off: the engine's own cost alone"
    )
    args = parser.parse_args()
    if args.no_gc:
        gc.disable()
    sizes = [int(s) for s in args.sizes.split(",")]
    policy = load_policy(args.policy)
    context = Context(requester=PLATFORM)

    def timed(fn: Any, obj: dict[str, Any]) -> tuple[float, Decision]:
        return cpu(lambda: fn(obj, policy, context=context), args.seconds, args.max_review)

    print(
        f"{'series':<12} {'size':>7} {'written':>9} {'sent':>9} {'mutate ms':>10} "
        f"{'validate ms':>12} {VALIDATED:>12} {'apply ms':>9} {'patch/result':>12}"
    )
    for series, build in SERIES.items():
        points: dict[str, list[tuple[int, float]]] = {"mutate": [], "validate": [], "apply": []}
        for n in sizes:
            written = build(n)
            size = json_size(written)
            if size > REQUEST_LIMIT:
                print(f"{series:<12} {n:>7} {size:>9}  over the 3 MiB request limit: skipped")
                continue
            sent = as_sent(written)
            sent_size = json_size(sent)
            with gcpause.paused(gcpause.LARGE):  # as `runguard apply` runs it
                apply_s, applied = timed(evaluate, written)
            ratio = json_size(applied.patch) / json_size(applied.object)
            cells = ["413", "413", "413"]
            if sent_size + REVIEW_OVERHEAD <= DEFAULT_MAX_BODY:
                # as the server runs them: the collector paused for a large body
                with gcpause.paused(sent_size + REVIEW_OVERHEAD):
                    mutate_s, mutation = timed(mutate, sent)
                    validate_s, _ = timed(validate, sent)
                cells = [f"{mutate_s * 1e3:.1f}", f"{validate_s * 1e3:.1f}", cells[2]]
                mutated_size = json_size(mutation.object) + REVIEW_OVERHEAD
                if mutated_size <= DEFAULT_MAX_BODY:
                    with gcpause.paused(mutated_size):
                        cells[2] = f"{timed(validate, mutation.object)[0] * 1e3:.1f}"
                if n >= 1000:
                    points["mutate"].append((n, mutate_s))
                    points["validate"].append((n, validate_s))
            if n >= 1000:
                points["apply"].append((n, apply_s))
            print(
                f"{series:<12} {n:>7} {size:>9} {sent_size:>9} {cells[0]:>10} {cells[1]:>12} "
                f"{cells[2]:>12} {apply_s * 1e3:>9.1f} {ratio:>12.2f}"
            )
            if apply_s > args.max_review:
                print(f"{series:<12} stopped: one review took over {args.max_review:.0f} s")
                break
        slopes = [
            f"{name} {fitted:.2f}" if (fitted := slope(measured)) else f"{name} n/a"
            for name, measured in points.items()
        ]
        print(f"{series:<12} slope (log-log, sizes >= 1000): {', '.join(slopes)}")


if __name__ == "__main__":
    main()
