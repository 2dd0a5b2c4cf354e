"""``runguard lint -p DIR``: check policy files; ``file:line: key: message`` per problem."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from webhook.cli import EXIT_BAD_INPUT, EXIT_OK
from webhook.policy.lint import lint


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "lint",
        help="check policy files",
        description=(
            "Check every policy file in a directory: YAML, schema, one RunPolicy, profile "
            "names and maximums. Prints file:line: key: message for each error, then "
            "warnings, then a summary. Exit 0 when there are no errors, 2 otherwise."
        ),
    )
    parser.add_argument(
        "-p", "--policy", default="policies", metavar="DIR", help="policy directory (policies)"
    )
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format (text)"
    )
    parser.add_argument("--strict", action="store_true", help="count warnings as errors (exit 2)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = lint(args.policy)
    failed = bool(report.errors) or (args.strict and bool(report.warnings))
    if args.output == "json":
        out = {
            "directory": report.directory,
            "ok": not failed,
            "errors": [e.to_dict() for e in report.errors],
            "warnings": [w.to_dict() for w in report.warnings],
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for line in report.lines():
            print(line)
        print(report.summary())
    return EXIT_BAD_INPUT if failed else EXIT_OK
