"""``runguard whatif``: what a proposed policy directory would do to the runs that exist.

A command of its own rather than an option of ``audit``: it judges under two policies,
its outcomes are not a PolicyReport's (denied, changed, unchanged: what the edit does,
not what is wrong now) and its exit code says whether any run is affected. It lists as
``runguard audit`` does (pages, the server's selection made for both policies, each
page judged and dropped), or reads ``--cluster-state`` files offline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from webhook.audit.clusteraudit import LISTINGS, PAGE_SIZE, listed_pages
from webhook.audit.whatif import JsonWriter, TableWriter, Tally, compare_all, markdown
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.engine.context import Context
from webhook.policy.model import Policy

RUN_KINDS = frozenset(listing.kind for listing in LISTINGS)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "whatif",
        help="judge the runs that exist under a proposed policy, beside the current one",
        description="Each run (Pods and pod controllers, from the cluster or from "
        "--cluster-state files) is admitted as now under the current policy (-p) and under "
        "the proposed one (--proposed): it would be denied, changed (moved to another "
        "profile, clamped) or unchanged, counted per namespace and project. Exit 0 no run "
        "affected, 1 some denied or changed, 2 error.",
    )
    p.add_argument("-p", "--policy", default="policies", help="the current policy directory")
    p.add_argument("--proposed", required=True, metavar="DIR", help="the proposed policy directory")
    p.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "markdown"),
        default="table",
        help="a row per run denied or changed and the counts (table), every run (json), or "
        "a summary for a pull request (markdown)",
    )
    p.add_argument(
        "--cluster-state",
        action="append",
        metavar="FILE",
        help="judge the runs in this file (kubectl get pods,jobs,cronjobs,deployments,"
        "statefulsets,daemonsets,namespaces,priorityclasses,runtimeclasses -A -o yaml; "
        "repeatable) instead of the cluster's",
    )
    p.add_argument(
        "--policy-objects",
        action="store_true",
        help="the current policy is the cluster's RunPolicy, Platform and Profile objects, not -p",
    )
    p.add_argument("--page-size", type=int, default=PAGE_SIZE, metavar="N")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.cluster_state and (args.policy_objects or args.kubeconfig or args.context):
        print("runguard whatif: --policy-objects, --kubeconfig and --context read the "
              "cluster, not --cluster-state", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    proposed = load_policy_or_report(args.proposed)
    if proposed is None:
        return EXIT_BAD_INPUT
    tally = Tally()
    out = sys.stdout
    writer = TableWriter(out) if args.output == "table" else JsonWriter(out)
    started = time.monotonic()
    try:
        if args.cluster_state:
            current = load_policy_or_report(args.policy)
            if current is None:
                return EXIT_BAD_INPUT
            code = _offline(args, current, proposed, tally, writer)
            current_name = args.policy
        else:
            code, current_name = _live(args, proposed, tally, writer)
        if code != EXIT_OK:
            return code
        if args.output == "markdown":
            out.write(markdown(tally, current_name, args.proposed))
        else:
            writer.close(tally)
        out.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    print(f"runguard whatif: {tally.describe()}, {time.monotonic() - started:.1f}s",
          file=sys.stderr)  # fmt: skip
    return EXIT_DENIED if tally.affected else EXIT_OK


def selecting(current: Policy, proposed: Policy) -> Policy:
    """A policy whose RunPolicies are both policies': the server selects for either."""
    return Policy((*current.run_policies, *proposed.run_policies), current.digest)


def _offline(
    args: argparse.Namespace,
    current: Policy,
    proposed: Policy,
    tally: Tally,
    writer: TableWriter | JsonWriter,
) -> int:
    from webhook.clusterstate.model import ClusterStateError
    from webhook.clusterstate.static import StaticClusterState
    from webhook.inputs.documents import InputError, read_objects
    from webhook.inputs.limits import CLUSTER_STATE_FILES

    try:
        objects = [o for f in args.cluster_state for o in read_objects(f, CLUSTER_STATE_FILES)]
        state = StaticClusterState.from_documents(objects)
    except (InputError, ClusterStateError) as exc:
        print(f"runguard whatif: --cluster-state: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    runs = [
        o
        for o in objects
        if isinstance(o, dict)
        and o.get("kind") in RUN_KINDS
        and (args.namespace is None or (o.get("metadata") or {}).get("namespace") == args.namespace)
    ]
    del objects  # the state keeps what it needs
    verdicts = list(compare_all(runs, current, proposed, Context(state=state)))
    tally.add(verdicts)
    if args.output != "markdown":
        writer.write(verdicts)
    return EXIT_OK


def _live(
    args: argparse.Namespace, proposed: Policy, tally: Tally, writer: TableWriter | JsonWriter
) -> tuple[int, str]:
    from webhook.audit.liveview import WHATIF_KINDS, read_view
    from webhook.cli.cluster import Session, kube_fetch, on_cluster

    def work(session: Session) -> int:
        current = session.policy
        session.doing = "read the namespaces and classes"
        state, left_out = read_view(session.api_client, WHATIF_KINDS)
        for line in left_out:
            print(f"runguard whatif: not read ({line})", file=sys.stderr)
        context = Context(state=state)
        session.doing = "list objects"
        for _, _, items in listed_pages(
            kube_fetch(session.api_client),
            selecting(current, proposed),
            namespace=args.namespace,
            page_size=args.page_size,
            notice=lambda message: print(f"runguard whatif: {message}", file=sys.stderr),
        ):
            verdicts = list(compare_all(items, current, proposed, context))
            tally.add(verdicts)
            if args.output != "markdown":
                writer.write(verdicts)
        return EXIT_OK

    name = "the cluster's policy objects" if args.policy_objects else args.policy
    code = on_cluster(args, "whatif", work)
    return (EXIT_BAD_INPUT if code is None else code), name
