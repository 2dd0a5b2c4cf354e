"""``runguard schema [--format json|markdown] [-o FILE]``: the policy schema, for editors and docs.

Both are generated from the policy model: the JSON Schema (what editors and ``runguard``
check files with; published as ``webhook/policy/runguard.schema.json``) and the
reference of every key (``docs/policy-reference.md``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from webhook.cli import write_output
from webhook.policy.reference import policy_reference
from webhook.policy.schema import policy_schema


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of policy files, or their reference",
        description=(
            "Print the JSON Schema (Draft 2020-12) of RunPolicy, Platform and Profile documents, "
            "for editors: e.g. a '# yaml-language-server: $schema=FILE' line in a policy "
            "file makes VS Code complete and check its keys. With --format markdown, the "
            "reference of every key (docs/policy-reference.md)."
        ),
    )
    parser.add_argument(
        "--format", choices=("json", "markdown"), default="json", help="output format (json)"
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    parser.set_defaults(func=run)


def render(fmt: str = "json") -> str:
    if fmt == "markdown":
        return policy_reference()
    return json.dumps(policy_schema(), indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    return write_output(render(args.format), args.output, "schema")
