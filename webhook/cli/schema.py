"""``runguard schema [-o FILE]``: the JSON Schema of policy documents, for editors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from webhook.cli import EXIT_BAD_INPUT, EXIT_OK
from webhook.policy.schema import policy_schema


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of policy files",
        description=(
            "Print the JSON Schema (Draft 2020-12) of RunPolicy and Profile documents, "
            "for editors: e.g. a '# yaml-language-server: $schema=FILE' line in a policy "
            "file makes VS Code complete and check its keys."
        ),
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    parser.set_defaults(func=run)


def render() -> str:
    return json.dumps(policy_schema(), indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    text = render()
    if args.output is None or args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"runguard schema: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK
