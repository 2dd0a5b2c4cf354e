"""``runguard lint -p DIR``: check policy files; ``file:line: key: message`` per problem."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from webhook.cli import EXIT_BAD_INPUT, EXIT_OK
from webhook.clusterstate.static import StaticClusterState
from webhook.policy.lint import ClusterClasses, lint


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
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--cluster",
        nargs="?",
        const="",
        metavar="KUBECONFIG",
        help="also check that the priority and runtime classes the policy names exist in "
        "the cluster (the current kubeconfig context, or this file; in-cluster: 'in-cluster')",
    )
    where.add_argument(
        "--cluster-state",
        metavar="FILE",
        help="the same check against objects in a file (as runguard apply --cluster-state)",
    )
    parser.set_defaults(func=run)


def cluster_view(args: argparse.Namespace) -> ClusterClasses | None:
    """The classes of the cluster ``--cluster`` names, or of the ``--cluster-state`` file."""
    if args.cluster_state:
        return StaticClusterState.from_file(args.cluster_state)
    if args.cluster is None:
        return None
    from kubernetes import client, config  # only for --cluster: a second to import

    if args.cluster == "in-cluster":
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(config_file=args.cluster or None)  # type: ignore[no-untyped-call]
    api = client.ApiClient()
    priority = _names(client.SchedulingV1Api(api).list_priority_class().items)
    runtime = _names(client.NodeV1Api(api).list_runtime_class().items)
    return _Classes(priority, runtime)


def _names(items: Any) -> set[str]:
    return {str(i.metadata.name) for i in items if i.metadata is not None}


class _Classes:
    def __init__(self, priority: set[str], runtime: set[str]) -> None:
        self.priority, self.runtime = priority, runtime

    def has_priority_class(self, name: str) -> bool:
        return name in self.priority

    def has_runtime_class(self, name: str) -> bool:
        return name in self.runtime


def run(args: argparse.Namespace) -> int:
    try:
        cluster = cluster_view(args)
    except Exception as exc:  # noqa: BLE001 - any way the cluster cannot be read
        print(f"runguard: cannot read the cluster's classes: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = lint(args.policy, cluster)
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
