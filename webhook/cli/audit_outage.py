"""``runguard audit --outage``: what holds while runguard is unreachable, read from the
cluster's admission objects (or ``--cluster-state`` files): the mode of the webhooks that
judge runs, the floor, and the rules only runguard judges (``webhook.install.outage``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK, load_policy_or_report
from webhook.cli.cluster import config_reason, connect, failure_reason

_API, _CLASS = "admissionregistration.k8s.io/v1", "AdmissionregistrationV1Api"
# kind, apiVersion, API class, the call that lists it
ADMISSION_LISTS = (
    ("MutatingWebhookConfiguration", _API, _CLASS, "list_mutating_webhook_configuration"),
    ("ValidatingWebhookConfiguration", _API, _CLASS, "list_validating_webhook_configuration"),
    ("ValidatingAdmissionPolicy", _API, _CLASS, "list_validating_admission_policy"),
    ("ValidatingAdmissionPolicyBinding", _API, _CLASS, "list_validating_admission_policy_binding"),
)


def run_outage(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from webhook.audit.clusteraudit import AuditError
    from webhook.inputs.documents import InputError, read_objects
    from webhook.inputs.limits import CLUSTER_STATE_FILES
    from webhook.install.outage import outage

    if args.write or args.policy_objects or args.output not in ("table", "json"):
        print("runguard audit: --outage prints a table or json, from -p's policy",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    policy = load_policy_or_report(args.policy)
    if policy is None:
        return EXIT_BAD_INPUT
    try:
        if args.cluster_state:
            objects = [o for f in args.cluster_state for o in read_objects(f, CLUSTER_STATE_FILES)]
        else:
            with connect(args) as api_client:
                objects = _admission_objects(api_client)
    except InputError as exc:
        print(f"runguard audit: --cluster-state: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConfigException as exc:
        print(f"runguard audit: cannot read the admission objects: {config_reason(exc)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    except (ApiException, AuditError, HTTPError, OSError) as exc:
        print(f"runguard audit: cannot read the admission objects: "
              f"{failure_reason(exc, writing=False)}", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    answer = outage(policy, objects)
    if args.output == "json":
        import json

        print(json.dumps({"lines": answer.lines, "problems": answer.problems}, indent=2))
    else:
        print("\n".join(answer.lines))
    return EXIT_DENIED if answer.problems else EXIT_OK


def _admission_objects(api_client: Any) -> list[dict[str, Any]]:
    """Every webhook configuration, ValidatingAdmissionPolicy and binding."""
    from webhook.cli.audit_rbac import listed_objects

    return listed_objects(api_client, ADMISSION_LISTS)
