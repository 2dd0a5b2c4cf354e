"""``runguard audit``: scan the Pods and pod controllers already in the cluster."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import yaml

from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report

# (kind, apiVersion, client class, list-all method, list-namespaced method)
LISTS = (
    ("Pod", "v1", "CoreV1Api", "list_pod_for_all_namespaces", "list_namespaced_pod"),
    ("Job", "batch/v1", "BatchV1Api", "list_job_for_all_namespaces", "list_namespaced_job"),
    (
        "CronJob",
        "batch/v1",
        "BatchV1Api",
        "list_cron_job_for_all_namespaces",
        "list_namespaced_cron_job",
    ),
    (
        "Deployment",
        "apps/v1",
        "AppsV1Api",
        "list_deployment_for_all_namespaces",
        "list_namespaced_deployment",
    ),
    (
        "StatefulSet",
        "apps/v1",
        "AppsV1Api",
        "list_stateful_set_for_all_namespaces",
        "list_namespaced_stateful_set",
    ),
    (
        "DaemonSet",
        "apps/v1",
        "AppsV1Api",
        "list_daemon_set_for_all_namespaces",
        "list_namespaced_daemon_set",
    ),
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "audit",
        help="report what already in the cluster violates the policy",
        description="List Pods, Jobs, CronJobs, Deployments, StatefulSets and DaemonSets and "
        "judge the runs among them (controllers by their pod template after mutation). "
        "Exit 0 all compliant, 1 violations found, 2 error.",
    )
    p.add_argument("-p", "--policy", default="policies", help="policy directory")
    p.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    p.add_argument("-o", "--output", choices=("table", "json", "policyreport"), default="table")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.set_defaults(func=run)


def list_objects(api_client: Any, namespace: str | None) -> Iterator[dict[str, Any]]:
    """Every object of the listed kinds, as plain dicts with kind and apiVersion set."""
    from kubernetes import client

    for kind, api_version, api_class, all_method, ns_method in LISTS:
        api = getattr(client, api_class)(api_client)
        if namespace:
            items = getattr(api, ns_method)(namespace).items
        else:
            items = getattr(api, all_method)().items
        for item in items:
            obj: dict[str, Any] = api_client.sanitize_for_serialization(item)
            obj["kind"], obj["apiVersion"] = kind, api_version
            yield obj


def run(args: argparse.Namespace) -> int:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from webhook.clusteraudit import audit, to_policy_reports, to_rows, to_table
    policy = load_policy_or_report(args.policy)
    if policy is None:
        return EXIT_BAD_INPUT
    try:
        if args.kubeconfig or not _in_cluster():
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=args.kubeconfig, context=args.context
            )
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        with client.ApiClient() as api_client:
            findings = audit(list_objects(api_client, args.namespace), policy)
    except (ConfigException, ApiException, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        print(f"runguard audit: cannot list objects: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.output == "json":
        json.dump(to_rows(findings), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "policyreport":
        yaml.safe_dump_all(to_policy_reports(findings, policy), sys.stdout, sort_keys=False)
    else:
        print(to_table(findings))
    return EXIT_DENIED if any(f.decision.violations for f in findings) else EXIT_OK


def _in_cluster() -> bool:
    import os

    return "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ
