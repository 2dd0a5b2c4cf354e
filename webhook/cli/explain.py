"""``runguard explain``: which RunPolicy and profile governed a run, each change and why,
and the profiles its namespace may use. Offline over manifest files (as ``apply``), or
for a Pod or Job in the cluster (``explain pod NAME -n NS``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from webhook.audit.explain import Explanation, explain, to_text
from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.cli.cluster import Session, on_cluster
from webhook.clusterstate.model import KINDS, LAST_APPLIED
from webhook.engine.context import Context
from webhook.engine.review import TEMPLATES_MUTATED
from webhook.inputs.documents import InputError, read_objects

# What ``explain KIND NAME`` reads from the cluster.
CLUSTER_KINDS = {"pod": "Pod", "pods": "Pod", "po": "Pod", "job": "Job", "jobs": "Job"}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "explain",
        help="say why a run was changed or refused, and which profiles it could name",
        description="Which RunPolicy and profile govern a run, each change runguard makes and "
        "why, what it refuses, and the profiles the run's namespace may use with their "
        "ranges. Give manifest files (offline, as apply), or `pod NAME` / `job NAME` to "
        "read one from the cluster. Exit 0 allowed, 1 denied, 2 bad input.",
    )
    p.add_argument("-p", "--policy", default="policies", help="policy directory")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("-n", "--namespace", help="the run's namespace (cluster: default 'default')")
    p.add_argument(
        "--cluster-state",
        metavar="FILE",
        help="offline: objects the decisions need, as for apply (the Namespace with its "
        "labels tells which profiles it may use)",
    )
    p.add_argument("--as", dest="as_user", metavar="USER", help="offline: the requesting user")
    p.add_argument("--as-group", action="append", default=[], metavar="GROUP")
    p.add_argument(
        "--policy-objects",
        action="store_true",
        help="cluster: judge with the cluster's RunPolicy, Platform and Profile objects "
        "instead of -p",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "targets",
        nargs="+",
        metavar="FILE | KIND NAME",
        help="YAML or JSON files (- for stdin), or pod NAME / job NAME in the cluster",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kind = CLUSTER_KINDS.get(args.targets[0]) if len(args.targets) == 2 else None
    if kind is not None:
        return _run_cluster(args, kind, args.targets[1])
    if args.policy_objects or args.kubeconfig or args.context:
        print("runguard explain: --policy-objects, --kubeconfig and --context go with "
              "`pod NAME` or `job NAME`", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    policy = load_policy_or_report(args.policy)
    if policy is None:
        return EXIT_BAD_INPUT
    from webhook.cli.apply import context_of

    try:
        context = context_of(args)
        objects = [obj for source in args.targets for obj in read_objects(source)]
    except InputError as exc:
        print(f"runguard explain: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    found = [explain(o, policy, namespace=args.namespace, context=context) for o in objects]
    return _print(found, args.output)


def _print(found: list[Explanation], output: str) -> int:
    if output == "json":
        json.dump([e.to_dict() for e in found], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n\n".join(to_text(e) for e in found) + "\n")
    return EXIT_OK if all(e.allowed for e in found) else EXIT_DENIED


def _run_cluster(args: argparse.Namespace, kind: str, name: str) -> int:
    if args.cluster_state or args.as_user or args.as_group:
        print("runguard explain: --cluster-state, --as and --as-group go with files; "
              "`pod NAME` reads the cluster", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    found = on_cluster(args, "explain", _explained(kind, args.namespace or "default", name))
    if found is None:
        return EXIT_BAD_INPUT
    return _print([found], args.output)


def _explained(kind: str, namespace: str, name: str) -> Callable[[Session], Explanation | None]:
    """The explanation of the object ``kind`` ``namespace/name`` as the cluster holds it,
    judged as it was sent where that is known (None: said why not)."""
    from webhook.audit.liveview import read_object, read_view

    def work(session: Session) -> Explanation | None:
        session.doing = f"read {kind} {namespace}/{name}"
        obj = read_object(session.api_client, kind, namespace, name)
        if obj is None:
            print(f"runguard explain: no {kind} {name} in namespace {namespace}",
                  file=sys.stderr)  # fmt: skip
            return None
        judged, notes = obj, list[str]()
        session.doing = "read what the Pod was made from"
        if kind == "Pod":
            judged, what, notes = _submitted(session.api_client, obj, namespace)
        elif (sent := _as_applied(obj)) is not None:
            judged, what = sent, f"{kind} {name} as kubectl applied it (last-applied-configuration)"
        else:
            what = f"{kind} {name} as stored"
        if judged is obj and kind in TEMPLATES_MUTATED:
            notes.append(
                "a Job's or CronJob's template as stored already carries runguard's changes "
                "(made when it was created), and the manifest is not recorded: the changes "
                "listed are those the policy would make to it now"
            )
        session.doing = "read the cluster view"
        state, left_out = read_view(session.api_client, (*KINDS, "ProjectProfile"), namespace)
        notes += [f"not read ({line}): decisions needing it fail closed" for line in left_out]
        context = Context(state=state)
        return explain(
            judged, session.policy, namespace=namespace, context=context, judged=what,
            notes=tuple(notes),
        )  # fmt: skip

    return work


def _as_applied(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest kubectl applied to make ``obj`` (its last-applied configuration, of
    the same kind), if it was applied."""
    applied = ((obj.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not applied:
        return None
    try:
        sent = json.loads(applied)
    except ValueError:
        return None
    return sent if isinstance(sent, dict) and sent.get("kind") == obj.get("kind") else None


def _submitted(
    api_client: Any, pod: dict[str, Any], namespace: str
) -> tuple[dict[str, Any], str, list[str]]:
    """What a stored Pod was made from, the best there is: the manifest kubectl applied
    (its last-applied configuration), else its controller's template (a Job's), else the
    Pod as stored, which already carries runguard's changes."""
    from webhook.audit.liveview import TEMPLATE_OWNERS, read_object

    meta = pod.get("metadata") or {}
    name = meta.get("name", "")
    sent = _as_applied(pod)
    if sent is not None:
        return sent, f"Pod {name} as kubectl applied it (last-applied-configuration)", []
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") in TEMPLATE_OWNERS:
            owner = read_object(api_client, ref["kind"], namespace, ref.get("name", ""))
            if owner is not None:
                # (a Job's stored template already carries runguard's changes: its manifest)
                owner = _as_applied(owner) or owner
                return owner, f"{ref['kind']} {ref['name']}, whose template made Pod {name}", []
    note = (
        "the Pod as stored already carries runguard's changes and the manifest it was "
        "created from is not recorded (kubectl create, not apply): the changes listed are "
        "those the policy would make to it now (none when the policy is unchanged)"
    )
    return pod, f"Pod {name} as stored", [note]
