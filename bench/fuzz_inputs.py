"""Fuzzing the files runguard reads: ``runguard apply``, ``runguard lint`` and the policy loader.

Not a test (``tests/inputs/test_fuzz_inputs.py`` runs the same checks in a short, fixed form in
CI). The inputs and the checks are ``tests/harness/fuzz.py``'s: YAML and JSON inputs
made with hypothesis (run Pods and random values written as JSON or YAML, the same with
random edits, raw YAML punctuation, and hostile shapes), each through ``runguard apply``,
``runguard lint`` and ``read_policy``.

Any exception fails the run with the input that caused it (hypothesis shrinks it).
Printed: examples run per target, exit codes, the slowest example, the largest output
against its input.

    python bench/fuzz_inputs.py [--examples 2000] [--seed N]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

import bench_config  # noqa: F401  (the import path: the harness and webhook)
from harness.fuzz import FIGURES, check_apply, check_lint, check_loader, inputs
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="per target")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    chosen = args.seed if args.seed is not None else random.randrange(2**32)
    long_run = settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )

    @seed(chosen)
    @long_run
    @given(text=inputs, output=st.sampled_from(["json", "yaml", "text"]))
    def apply(text: str, output: str) -> None:
        with tempfile.TemporaryDirectory() as workdir:
            check_apply(text, Path(workdir), output)

    @seed(chosen)
    @long_run
    @given(text=inputs)
    def lint_and_load(text: str) -> None:
        with tempfile.TemporaryDirectory() as workdir:
            check_lint(text, Path(workdir))
            check_loader(text, Path(workdir))

    start = time.perf_counter()
    print(f"seed {chosen}, {args.examples} examples per target")
    apply()
    lint_and_load()
    print(
        f"{'target':<16} {'examples':>9} {'exit 0':>7} {'exit 1':>7} {'exit 2':>7} "
        f"{'slowest s':>10} {'max out/in':>11}"
    )
    for target in sorted(FIGURES.examples):
        codes = [FIGURES.exits[(target, c)] for c in (0, 1, 2)]
        ratio = FIGURES.ratio[target]
        print(
            f"{target:<16} {FIGURES.examples[target]:>9} {codes[0]:>7} {codes[1]:>7} "
            f"{codes[2]:>7} {FIGURES.slowest[target][0]:>10.3f} "
            f"{ratio if math.isfinite(ratio) else 0:>11.1f}"
        )
    for target in sorted(FIGURES.slowest):
        print(f"slowest {target}: {FIGURES.slowest[target][1]}")
    print(f"no failure in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
