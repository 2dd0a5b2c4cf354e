"""``runguard apply``: objects through the same mutate-then-validate code as the webhook."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.clusterstate.model import ClusterStateError
from webhook.clusterstate.static import StaticClusterState
from webhook.engine import Decision, evaluate
from webhook.engine.context import Context, Requester
from webhook.inputs.documents import InputError, read_objects
from webhook.serving import gcpause


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "apply",
        help="run Pods or pod controllers through the policy, offline",
        description="Mutate then validate objects as the webhooks would. "
        "Exit 0 all allowed, 1 any denied, 2 bad input or bad policy.",
    )
    p.add_argument(
        "-p", "--policy", default="policies", help="policy directory (default: policies)"
    )
    p.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    p.add_argument("-n", "--namespace", help="namespace to judge objects in (default: their own)")
    p.add_argument(
        "--cluster-state",
        metavar="FILE",
        help="objects the decisions need (claims, secrets and configMaps by metadata, "
        "pod controllers with their stamps and uids, priority and runtime classes, "
        "Namespaces with their labels, projects' ProjectProfiles), "
        "multi-document YAML or JSON; absent: no cluster view",
    )
    p.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        help="the requesting user, as kubectl --as (default: nobody, never a platform identity)",
    )
    p.add_argument(
        "--as-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="a group of the requesting user (repeatable)",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML or JSON file, or - for stdin")
    p.set_defaults(func=run)


def context_of(args: argparse.Namespace) -> Context:
    """The requester and cluster state of ``--as``/``--as-group``/``--cluster-state``.
    Raises InputError for an unreadable state file."""
    try:
        # No file: no cluster view (decisions needing one fail closed, as online before
        # the first sync), rather than an empty cluster that lacks every priority class.
        state = StaticClusterState.from_file(args.cluster_state) if args.cluster_state else None
    except (ClusterStateError, OSError) as exc:
        raise InputError(f"--cluster-state: {exc}") from exc
    requester = Requester(args.as_user, tuple(args.as_group)) if args.as_user else None
    return Context(requester=requester, state=state)


def run(args: argparse.Namespace) -> int:
    policy = load_policy_or_report(args.policy)
    if policy is None:
        return EXIT_BAD_INPUT
    try:
        context = context_of(args)
        objects = [obj for source in args.files for obj in read_objects(source)]
    except InputError as exc:
        print(f"runguard: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with gcpause.paused(gcpause.LARGE):  # one pass over what was read: no cycles to find
        decisions = [
            evaluate(obj, policy, namespace=args.namespace, context=context) for obj in objects
        ]
    if args.output == "json":
        json.dump([d.to_dict() for d in decisions], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "yaml":
        yaml.dump([d.to_dict() for d in decisions], sys.stdout, Dumper=PlainDumper, sort_keys=False)
    else:
        for d in decisions:
            print(describe(d))
    return EXIT_OK if all(d.allowed for d in decisions) else EXIT_DENIED


class PlainDumper(yaml.SafeDumper):
    """Safe YAML without anchors: a patch value and the object share dicts, and
    ``&id001`` / ``*id001`` would make the output unreadable (and unusable by kubectl)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def describe(d: Decision) -> str:
    """A few human lines per object: verdict, then warnings and violations."""
    where = f"{d.namespace}/{d.name}" if d.namespace else d.name or "(unnamed)"
    if not d.applies:
        return f"{d.kind or 'object'} {where}: not a run, untouched"
    verdict = "allowed" if d.allowed else "DENIED"
    extra = []
    if d.profile:
        extra.append(f"profile {d.profile}")
    if d.patch:
        extra.append(f"{len(d.patch)} patch operations")
    lines = [f"{d.kind} {where}: {verdict}" + (f" ({', '.join(extra)})" if extra else "")]
    lines += [f"  warning: {w}" for w in d.warnings]
    lines += [f"  violation: {v}" for v in d.violations]
    return "\n".join(lines)
