"""Instructions per engine review under callgrind, for this tree and others (not a test).

A wall-clock median moves with whatever else the machine runs; the number of
instructions a review executes does not. Each tree's typical-pod review (``mutate`` then
``validate`` as the server makes them, ``bench_engine.server_review`` where the tree has
it) runs under ``valgrind --tool=callgrind`` twice, 300 and 600 reviews after the same
warm-up; the difference over 300 is one review, without the interpreter's start and
the imports. Needs valgrind (Debian's ``valgrind`` package); about a minute per tree.

    python bench/bench_instructions.py [/tmp/base ...]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from bench_compare import REVIEW, ROOT

WARM, FEW, MORE = 300, 300, 600
RUN = (
    REVIEW
    + f"""
for _ in range({WARM}):
    review()
gc.collect()
gc.freeze()
for _ in range(int(sys.argv[2])):
    review()
"""
)


def collected(root: Path, count: int) -> int:
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-c", RUN, str(root), str(count)],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no total:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_review(root: Path) -> float:
    return (collected(root, MORE) - collected(root, FEW)) / (MORE - FEW)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("others", nargs="*", type=Path, help="checkouts to compare with")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    this = per_review(ROOT)
    print(f"this tree: {this / 1e6:.3f} M instructions per review")
    for other in args.others:
        theirs = per_review(other.resolve())
        print(f"{other}: {theirs / 1e6:.3f} M; this tree {this / theirs:.3f}x")


if __name__ == "__main__":
    main()
