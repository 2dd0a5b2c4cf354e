"""``runguard manifests``: the webhook configurations rendered from the policy.

    runguard manifests -p DIR [--namespace N] [--service S] [--ca-bundle FILE] [--url URL]
                       [--policy-objects] [--shells] [--no-floor] [--available]
                       [-o yaml|json]
    runguard manifests -p DIR --write OUT      # regenerate the kustomize base's files
    runguard manifests -p DIR --check OUT      # exit 1 when they disagree with DIR
    runguard manifests -p DIR --static STATIC --break-glass ID [--url URL --ca-bundle F]
                                               # a control plane's static manifests

Exit codes: 0 rendered / up to date, 1 ``--check`` found drift, 2 bad policy or input.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.install import manifests


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "manifests",
        help="render the webhook configurations from the policy",
        description=(
            "Render the MutatingWebhookConfiguration and ValidatingWebhookConfiguration "
            "from the policy, routing to runguard only what it judges, every webhook "
            "failing closed: run Pods by objectSelector (the policy's selector); pod "
            "controllers whose template is a run's or names the platform's objects, Pods "
            "outside the selector naming them and objects created with a platform name, "
            "by CEL matchConditions (Kubernetes 1.30+); namespaceSelector leaving out "
            "runguard's namespace and excludeNamespaces. With --write, regenerate the "
            "generated files of the kustomize base (webhook configurations and the policy "
            "ConfigMap); with --check, fail when they disagree with the policy. The floor "
            "(ValidatingAdmissionPolicies of the rules that need no cluster state, which "
            "hold while runguard is unreachable) comes with them unless --no-floor; "
            "--available makes the webhooks judging runs fail open, leaving the floor to "
            'judge runs while runguard is down (docs/operations.md, "Outages").'
        ),
    )
    parser.add_argument(
        "-p",
        "--policy",
        type=Path,
        default=Path("policies"),
        metavar="DIR",
        help="policy directory (default policies)",
    )
    parser.add_argument(
        "--namespace",
        default=manifests.DEFAULT_NAMESPACE,
        help="runguard's namespace (default %(default)s)",
    )
    parser.add_argument(
        "--service",
        default=manifests.DEFAULT_SERVICE,
        help="runguard's Service (default %(default)s)",
    )
    parser.add_argument(
        "--ca-bundle", type=Path, metavar="FILE", help="PEM CA bundle for caBundle (ca.crt)"
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="call runguard at https://URL/mutate and /validate instead of the Service",
    )
    parser.add_argument(
        "--policy-objects",
        action="store_true",
        help="also the webhook configuration that checks RunPolicy, Platform and Profile objects "
        "(docs/policy-objects.md)",
    )
    parser.add_argument(
        "--shells",
        action="store_true",
        help="also the webhook configuration of the doors into a Pod (kubectl exec, "
        "attach, port-forward, pods/proxy, services/proxy, a token bound to it), judged "
        "on the Pods they reach: runguard needs --cluster-state to read them",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="leave out the floor (ValidatingAdmissionPolicies; Kubernetes 1.30+)",
    )
    parser.add_argument(
        "--available",
        action="store_true",
        help="the available mode: the webhooks that judge runs use failurePolicy Ignore, so "
        "runs start unmutated, judged by the floor alone, while runguard is unreachable "
        "(needs the floor)",
    )
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--write", type=Path, metavar="OUT", help="write the generated files of the base in OUT"
    )
    mode.add_argument(
        "--check", type=Path, metavar="OUT", help="exit 1 when OUT's generated files are stale"
    )
    mode.add_argument(
        "--static",
        type=Path,
        metavar="STATIC",
        help="write the control plane's static manifests (Kubernetes 1.37, manifest-based "
        "admission) in STATIC: a policy refusing UPDATE and DELETE of runguard's webhook "
        "configurations, floor, CRDs and a scale of its Deployment to zero to all but "
        "--break-glass, with --url runguard's webhooks too, and the AdmissionConfiguration "
        'naming them (docs/operations.md, "Protected from the API")',
    )
    parser.add_argument(
        "--break-glass",
        action="append",
        default=[],
        metavar="ID",
        help="with --static: a user name (or group:NAME) who may still change or delete them "
        "(repeatable)",
    )
    parser.add_argument(
        "--control-plane-dir",
        metavar="PATH",
        help="with --static: where STATIC is on the control plane's disk, as the "
        "AdmissionConfiguration names it (default: STATIC's absolute path)",
    )
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"runguard manifests: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    policy = load_policy_or_report(args.policy)
    if policy is None:
        return EXIT_BAD_INPUT
    if (problem := _flags_problem(args)) is not None:
        return _fail(problem)
    if args.static:
        return _static(args, policy)
    if args.write or args.check:
        return _base(args, policy)
    try:
        objects = _objects(args, policy)
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    except manifests.ManifestError as exc:
        return _fail(str(exc))
    if args.output == "json":
        items: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": objects}
        print(json.dumps(items, indent=2))
    else:
        sys.stdout.write(manifests.to_yaml(objects, manifests.REQUIRES))
    return EXIT_OK


def _flags_problem(args: argparse.Namespace) -> str | None:
    """The flags that do not go together, said in a line (None: they do)."""
    if args.available and not args.floor:
        return "--available needs the floor: it alone judges runs while runguard is down"
    if (args.break_glass or args.control_plane_dir) and not args.static:
        return "--break-glass and --control-plane-dir go with --static"
    if (
        not args.static
        and (args.write or args.check)
        and (args.ca_bundle or args.url or args.available or not args.floor)
    ):
        return (
            "--ca-bundle, --url, --available and --no-floor do not apply to the kustomize "
            "base (its available-mode component is the available mode)"
        )
    return None


def _base(args: argparse.Namespace, policy: Any) -> int:
    """``--write`` / ``--check``: the kustomize base's files written or compared."""
    try:
        files = manifests.generated_files(
            policy, manifests.read_policy_files(args.policy), namespace=args.namespace
        )
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    return _write(args.write, files) if args.write else _check(args.check, files, args.policy)


def _objects(args: argparse.Namespace, policy: Any) -> list[dict[str, Any]]:
    """The objects printed: the webhook configurations, the floor, the optional ones."""
    ca_bundle = args.ca_bundle.read_bytes() if args.ca_bundle else None
    where = {"namespace": args.namespace, "service": args.service, "ca_bundle": ca_bundle}
    objects = manifests.webhook_configurations(
        policy, url=args.url, available=args.available, **where
    )
    if args.floor:
        objects += manifests.floor_policies(policy, namespace=args.namespace)
    if args.policy_objects:
        objects.append(manifests.policy_object_webhook(url=args.url, **where))
    if args.shells:
        objects.append(manifests.shells_webhook_configuration(policy, url=args.url, **where))
    return objects


def _static(args: argparse.Namespace, policy: Any) -> int:
    from pathlib import PurePosixPath

    from webhook.install.static import static_files, static_text

    where = PurePosixPath(args.control_plane_dir or args.static.absolute())
    if not where.is_absolute():
        return _fail("--control-plane-dir must be an absolute path")
    try:
        ca_bundle = args.ca_bundle.read_bytes() if args.ca_bundle else None
        files = static_files(
            policy,
            args.break_glass,
            where,
            namespace=args.namespace,
            url=args.url,
            ca_bundle=ca_bundle,
            available=args.available,
        )
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    except manifests.ManifestError as exc:
        return _fail(str(exc))
    return _write(args.static, {name: static_text(objects) for name, objects in files.items()})


def _write(out: Path, files: dict[str, str]) -> int:
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text, encoding="utf-8")
            print(f"wrote {out / name}")
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    return EXIT_OK


def _check(out: Path, files: dict[str, str], policy_dir: Path) -> int:
    stale = 0
    for name, text in files.items():
        path = out / name
        try:
            current = path.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"{path}: {exc.strerror}")
            stale += 1
            continue
        # Compare objects, not text: a reformatted but equal file is not drift.
        if list(yaml.safe_load_all(current)) == list(yaml.safe_load_all(text)):
            continue
        stale += 1
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{path} (committed)",
                f"{path} (rendered from the policy)",
            )
        )
    if stale:
        print(
            f"{stale} generated file(s) out of date: run `runguard manifests -p {policy_dir} "
            f"--write {out}`",
            file=sys.stderr,
        )
        return EXIT_DENIED
    return EXIT_OK
