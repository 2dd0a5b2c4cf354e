"""The ``runguard`` command line: each subcommand is a thin shell over library functions.

Every command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking
the parsed arguments and returning the exit code (0 ok, 1 denied / failed check,
2 bad input or bad policy).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from webhook.policy.model import Policy

# Order is the order of ``runguard --help``.
COMMANDS = (
    "apply",
    "explain",
    "lint",
    "test",
    "schema",
    "rules",
    "certs",
    "manifests",
    "chart",
    "serve",
    "audit",
    "whatif",
)

EXIT_OK, EXIT_DENIED, EXIT_BAD_INPUT = 0, 1, 2


def load_policy_or_report(directory: str) -> Policy | None:
    """The policy in ``directory``, or None after printing every ``file:line`` error."""
    from webhook.policy.errors import PolicyError
    from webhook.policy.loader import load_policy

    try:
        return load_policy(directory)
    except PolicyError as exc:
        for issue in exc.errors:
            print(issue, file=sys.stderr)
        return None


def write_output(text: str, output: str | None, command: str) -> int:
    """``text`` to stdout (no ``-o``, or ``-o -``) or to the file ``output``."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(output, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        print(f"runguard {command}: cannot write {output}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runguard",
        description="Admission policy engine for ML platform runs on Kubernetes.",
    )
    from webhook import __version__

    parser.add_argument("--version", action="version", version=f"runguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"webhook.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
