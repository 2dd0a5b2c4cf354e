"""The engine's review against another checkout's, interleaved (not a test).

``make bench``'s ``engine_us_p50`` (mutate + validate of the typical GPU run Pod with the
platform test policy as the server makes them, ``bench_engine.server_review`` where the
tree has it, ``bench_all.engine_round``), measured for this tree and for a
baseline checkout (e.g. ``git worktree add /tmp/base 474493f``) in alternating child
processes, so a busy moment of this shared machine hits both. Prints each round and
the median ratio.

    python bench/bench_compare.py /tmp/base [--rounds 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from bench_config import REPO as ROOT

# ``review()`` of the typical GPU run Pod in the tree ``sys.argv[1]``, then what was loaded
# frozen, as a worker runs (the master froze it); the scripts that compare trees add theirs.
REVIEW = """
import gc, sys
root = sys.argv[1]
sys.path[:0] = [root, root + "/bench"]
import bench_engine
from webhook.policy.loader import load_policy
policy = load_policy(sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else
                     root + "/tests/cases/_policies/platform")
pod = bench_engine.gpu_pod(1)
served = getattr(bench_engine, "server_review", None)  # receipts, where the tree has them
def review():
    if served is not None:
        served(pod, policy)
    else:
        bench_engine.validate(bench_engine.mutate(pod, policy).object, policy)
"""
ROUND = (
    REVIEW
    + """
gc.collect()
gc.freeze()
print(bench_engine.summary(bench_engine.measure(review, 20000, float(sys.argv[2])))[0])
"""
)


def p50(root: Path, seconds: float, policy: Path | None = None) -> float:
    """``root``'s engine_us_p50, with its own platform test policy or ``policy``."""
    done = subprocess.run(
        [sys.executable, "-c", ROUND, str(root), str(seconds), str(policy or "")],
        capture_output=True, text=True, check=True, timeout=120 + seconds,
    )  # fmt: skip
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=Path, help="a checkout of the baseline commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    ratios = []
    for i in range(args.rounds):
        base, this = p50(args.baseline, args.seconds), p50(ROOT, args.seconds)
        ratios.append(this / base)
        print(f"round {i + 1}: baseline {base:.0f} us, this tree {this:.0f} us "
              f"({this / base:.3f}x)")  # fmt: skip
    print(f"engine_us_p50 ratio to the baseline: {statistics.median(ratios):.3f}x")


if __name__ == "__main__":
    main()
