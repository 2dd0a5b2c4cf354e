"""``runguard rules [-o FILE]``: every rule id, what each webhook does under it.

Generated from the declarations of ``webhook/engine/rule_ids.py``; published as
``docs/rules.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

from webhook.cli import write_output
from webhook.engine.rule_ids import rules_markdown


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rules",
        help="print every rule id and what each webhook does under it",
        description="Print the table of rule ids (docs/rules.md), as Markdown.",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return write_output(rules_markdown(), args.output, "rules")
