"""The static manifests: admission objects the API server loads from files on the control
plane's disk (manifest-based admission configuration, Kubernetes 1.37; object names end
``.static.k8s.io``), active from its start, out of etcd's and the API's reach.

``runguard manifests --static DIR`` writes, per admission plugin, the directory its
``staticManifestsDir`` names, and an AdmissionConfiguration naming them:

- ``validating-admission-policy/``: a ValidatingAdmissionPolicy and its binding refusing
  UPDATE and DELETE of runguard's webhook configurations, its floor's policies and
  bindings, its CRDs, and a scale of its Deployment to zero, to everyone but the
  break-glass identities the admin names;
- with ``--url``, ``validating-webhook/`` and ``mutating-webhook/``: runguard's webhooks
  themselves, calling that URL (static webhooks cannot name a Service).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath
from typing import Any

from webhook.install.cel import _cel_string
from webhook.install.floor import FLOOR_PREFIX
from webhook.install.names import (
    CONFIGURATION_NAME,
    DEFAULT_NAMESPACE,
    LABELS,
    POLICY_CONFIGURATION_NAME,
    SHELLS_CONFIGURATION_NAME,
    ManifestError,
)
from webhook.install.webhooks import webhook_configurations
from webhook.policy.model import Policy

STATIC_SUFFIX = ".static.k8s.io"
PROTECT_NAME = f"runguard-protect{STATIC_SUFFIX}"
DEPLOYMENT = "runguard"
CRD_SUFFIX = ".runguard.io"
GROUP_PREFIX = "group:"
# plugin -> (its configuration kind, the directory under DIR its files are in)
PLUGINS = {
    "ValidatingAdmissionPolicy": (
        "ValidatingAdmissionPolicyConfiguration",
        "validating-admission-policy",
    ),
    "ValidatingAdmissionWebhook": ("WebhookAdmissionConfiguration", "validating-webhook"),
    "MutatingAdmissionWebhook": ("WebhookAdmissionConfiguration", "mutating-webhook"),
}
_ADMISSION = "admissionregistration.k8s.io"
_WEBHOOK_CONFIGURATIONS = (CONFIGURATION_NAME, POLICY_CONFIGURATION_NAME, SHELLS_CONFIGURATION_NAME)


def _cel_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_cel_string(v) for v in values) + "]"


def break_glass_expression(identities: Sequence[str]) -> str:
    """CEL: the request is made by one of ``identities`` (a user name, or ``group:NAME``)."""
    users = [i for i in identities if not i.startswith(GROUP_PREFIX)]
    groups = [i.removeprefix(GROUP_PREFIX) for i in identities if i.startswith(GROUP_PREFIX)]
    terms = []
    if users:
        terms.append(f"request.userInfo.username in {_cel_list(users)}")
    if groups:
        terms.append(f"request.userInfo.?groups.orValue([]).exists(g, g in {_cel_list(groups)})")
    return " || ".join(terms)


def protect_policy(
    identities: Sequence[str], *, namespace: str = DEFAULT_NAMESPACE
) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and binding that keep runguard in the path."""
    if not identities or any(not i.strip() or i == GROUP_PREFIX for i in identities):
        raise ManifestError("--break-glass: name at least one identity (a user, or group:NAME)")
    webhooks = (
        f"request.resource.group == '{_ADMISSION}'"
        " && request.resource.resource in ['mutatingwebhookconfigurations', "
        "'validatingwebhookconfigurations']"
        f" && request.name in {_cel_list(_WEBHOOK_CONFIGURATIONS)}"
    )
    floor = (
        f"request.resource.group == '{_ADMISSION}'"
        " && request.resource.resource in ['validatingadmissionpolicies', "
        "'validatingadmissionpolicybindings']"
        f" && request.name.startsWith('{FLOOR_PREFIX}')"
    )
    crds = (
        f"request.resource.group == 'apiextensions.k8s.io' && request.name.endsWith('{CRD_SUFFIX}')"
    )
    # a Deployment asking for no replica (absent: 1), or its scale subresource (a Scale,
    # whose replicas are left out when 0)
    scaled_to_zero = (
        f"request.resource.group == 'apps' && request.namespace == '{namespace}'"
        f" && request.name == '{DEPLOYMENT}'"
        " && (request.operation == 'DELETE'"
        " || (request.subResource == 'scale' ? object.?spec.?replicas.orValue(0)"
        " : object.?spec.?replicas.orValue(1)) == 0)"
    )
    protected = " || ".join(f"({term})" for term in (webhooks, floor, crds, scaled_to_zero))
    named = ", ".join(identities)
    policy = {
        "apiVersion": f"{_ADMISSION}/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": PROTECT_NAME, "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    _rule(
                        _ADMISSION,
                        [
                            "mutatingwebhookconfigurations",
                            "validatingwebhookconfigurations",
                            "validatingadmissionpolicies",
                            "validatingadmissionpolicybindings",
                        ],
                        "Cluster",
                    ),
                    _rule("apiextensions.k8s.io", ["customresourcedefinitions"], "Cluster"),
                    _rule("apps", ["deployments", "deployments/scale"], "Namespaced"),
                ]
            },  # fmt: skip
            "matchConditions": [
                {"name": "runguards-own", "expression": protected},
                {
                    "name": "not-break-glass",
                    "expression": f"!({break_glass_expression(identities)})",
                },
            ],
            "validations": [
                {
                    "expression": "false",
                    "message": "runguard's admission objects, CRDs and Deployment are kept by the "
                    f"control plane's static manifests: only {named} may change or delete them "
                    '(docs/operations.md, "Protected from the API")',
                }
            ],
        },
    }
    binding = {
        "apiVersion": f"{_ADMISSION}/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": PROTECT_NAME, "labels": dict(LABELS)},
        "spec": {"policyName": PROTECT_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def _rule(group: str, resources: list[str], scope: str) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["*"],
        "operations": ["UPDATE", "DELETE"],
        "resources": resources,
        "scope": scope,
    }


def static_webhooks(
    policy: Policy, *, url: str, ca_bundle: bytes | None, available: bool
) -> list[dict[str, Any]]:
    """runguard's run webhooks as static configurations calling ``url``."""
    out = webhook_configurations(policy, url=url, ca_bundle=ca_bundle, available=available)
    for configuration in out:
        configuration["metadata"]["name"] = f"{CONFIGURATION_NAME}{STATIC_SUFFIX}"
    return out


def admission_configuration(directory: PurePath, plugins: Sequence[str]) -> dict[str, Any]:
    """The AdmissionConfiguration (``--admission-control-config-file``) naming each
    plugin's directory under ``directory``, as the control plane sees it."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": plugin,
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": PLUGINS[plugin][0],
                    "staticManifestsDir": str(directory / PLUGINS[plugin][1]),
                },
            }
            for plugin in plugins
        ],
    }


HEADER = "# Generated by `runguard manifests --static`: a control plane's static manifests.\n"


def static_text(objects: Sequence[dict[str, Any]]) -> str:
    """The YAML of a static file: the API server splits it on ``---`` and refuses a
    document without a kind, so the header comment is inside the first document."""
    from webhook.install.files import to_yaml

    return "---\n" + HEADER + to_yaml(objects).removeprefix("---\n")


def static_files(
    policy: Policy,
    identities: Sequence[str],
    control_plane_dir: PurePath,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    url: str | None = None,
    ca_bundle: bytes | None = None,
    available: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """The files of ``--static``, by path under the directory: their objects."""
    plugins = ["ValidatingAdmissionPolicy"]
    files = {
        f"{PLUGINS['ValidatingAdmissionPolicy'][1]}/runguard-protect.yaml": protect_policy(
            identities, namespace=namespace
        )
    }
    if url is not None:
        mutating, validating = static_webhooks(
            policy, url=url, ca_bundle=ca_bundle, available=available
        )
        files[f"{PLUGINS['MutatingAdmissionWebhook'][1]}/runguard.yaml"] = [mutating]
        files[f"{PLUGINS['ValidatingAdmissionWebhook'][1]}/runguard.yaml"] = [validating]
        plugins += ["ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"]
    files["admission-configuration.yaml"] = [admission_configuration(control_plane_dir, plugins)]
    return files
