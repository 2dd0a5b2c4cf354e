"""``runguard chart``: the Helm chart ``charts/runguard``, rendered from the policy and
the kustomize base (``webhook.install.chart``).

    runguard chart -p DIR [--manifests M] --write OUT    # write the chart in OUT
    runguard chart -p DIR [--manifests M] --check OUT    # exit 1 when OUT is stale

Exit codes: 0 written / up to date, 1 ``--check`` found drift, 2 bad policy or input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chart",
        help="render the Helm chart from the policy and the kustomize base",
        description=(
            "Render the Helm chart charts/runguard from the same sources as manifests/: "
            "the base's objects, the webhook configurations and policy ConfigMap of the "
            "policy, and the optional components as values. With --check, exit 1 when the "
            "chart in OUT differs from what the sources render."
        ),
    )
    parser.add_argument("-p", "--policy", type=Path, default=Path("policies"), metavar="DIR")
    parser.add_argument(
        "--manifests", type=Path, default=Path("manifests"), metavar="DIR",
        help="the kustomize base (default manifests)",
    )  # fmt: skip
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="OUT", help="write the chart in OUT")
    mode.add_argument("--check", type=Path, metavar="OUT", help="exit 1 when OUT is stale")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from webhook.install import manifests
    from webhook.install.chart import chart_files

    policy = load_policy_or_report(args.policy)
    if policy is None:
        return EXIT_BAD_INPUT
    try:
        files = chart_files(policy, manifests.read_policy_files(args.policy), args.manifests)
    except OSError as exc:
        print(f"runguard chart: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.write:
        for name, text in files.items():
            path = args.write / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        print(f"wrote {len(files)} files in {args.write}")
        return EXIT_OK
    stale = []
    for name, text in files.items():
        path = args.check / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path))
    if stale:
        print("\n".join(stale))
        print(
            f"{len(stale)} chart file(s) out of date: run `runguard chart -p {args.policy} "
            f"--write {args.check}`",
            file=sys.stderr,
        )
        return EXIT_DENIED
    return EXIT_OK
