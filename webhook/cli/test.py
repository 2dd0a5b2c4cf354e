"""``runguard test DIR``: run declarative case folders and print a line per case."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.audit.casetest import find_cases, run_case
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "test",
        help="run declarative policy test cases",
        description="Run every case folder (holding case.yaml) under DIR. "
        "Exit 0 all pass, 1 any fails, 2 no cases found or a case could not run "
        "(a file unreadable or past the input limits, a bad policy).",
    )
    p.add_argument("directory", metavar="DIR")
    p.add_argument("-v", "--verbose", action="store_true", help="print descriptions")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = Path(args.directory)
    cases = find_cases(root) if root.is_dir() else []
    if not cases:
        print(f"runguard: no case folders (with case.yaml) under {root}", file=sys.stderr)
        return EXIT_BAD_INPUT
    failed = bad = 0
    for folder in cases:
        result = run_case(folder, root)
        status = "PASS" if result.passed else "ERROR" if result.bad_input else "FAIL"
        suffix = f"  # {result.description}" if args.verbose and result.description else ""
        print(f"{status} {result.name}{suffix}")
        for failure in result.failures:
            print(f"    {failure}")
        failed += not result.passed
        bad += result.bad_input
    passed = len(cases) - failed
    print(f"{passed} passed, {failed} failed" + (f" ({bad} could not run)" if bad else ""))
    if bad:
        return EXIT_BAD_INPUT
    return EXIT_OK if failed == 0 else EXIT_DENIED
