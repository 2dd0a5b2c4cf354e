"""The objects that put runguard in the admission path, rendered from a Policy.

``webhook_configurations(policy)`` returns the ``MutatingWebhookConfiguration`` and
``ValidatingWebhookConfiguration`` as dicts: the policy's ``selector`` is their
``objectSelector``, so the kube-apiserver only calls runguard for platform runs, and
runguard's own namespace plus the policy's ``excludeNamespaces`` are left out by
``namespaceSelector``. ``policy_config_map(files)`` is the ConfigMap the Deployment
mounts as its policy directory.

``generated_files`` renders both into the two files of the kustomize base in
``manifests/`` that are generated (``runguard manifests -p policies --write
manifests``), so the selector the apiserver uses and the policy runguard loads come
from the same ``policies/`` and a test fails when they disagree.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from webhook.policy.model import Policy

__all__ = [
    "CONFIG_MAP_FILE",
    "CONFIG_MAP_NAME",
    "CONFIGURATION_NAME",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVICE",
    "MUTATING_WEBHOOK",
    "VALIDATING_WEBHOOK",
    "CONTROLLERS_WEBHOOK",
    "WEBHOOKS_FILE",
    "ManifestError",
    "generated_files",
    "mutating_webhook_configuration",
    "policy_config_map",
    "read_policy_files",
    "to_yaml",
    "validating_webhook_configuration",
    "webhook_configurations",
]

DEFAULT_NAMESPACE = "runguard"
DEFAULT_SERVICE = "runguard"
SERVICE_PORT = 443
CONFIGURATION_NAME = "runguard"
MUTATING_WEBHOOK = "mutate.runguard.io"
VALIDATING_WEBHOOK = "validate.runguard.io"
# Controllers carry the run labels in their pod *template*, which objectSelector cannot
# see: this webhook has none (the engine reads the template) and fails open, since the
# Pods the controller creates are still judged, fail-closed, by the two above.
CONTROLLERS_WEBHOOK = "validate-controllers.runguard.io"
MUTATE_PATH, VALIDATE_PATH = "/mutate", "/validate"
CONFIG_MAP_NAME = "runguard-policies"
# Pod subresources that change a Pod's spec after creation: each is a door into a running
# run (``kubectl debug`` adds containers, ``pods/resize`` changes resources), so each is
# routed to runguard. The e2e suite reads the real apiserver's list and fails on a new one.
POD_SPEC_SUBRESOURCES = ("pods/ephemeralcontainers", "pods/resize")
WEBHOOKS_FILE = "webhooks.yaml"
CONFIG_MAP_FILE = "policy-configmap.yaml"
TIMEOUT_SECONDS = 5
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
LABELS = {"app.kubernetes.io/name": "runguard", "app.kubernetes.io/part-of": "runguard"}
# Lets an admin apply everything else first: `kubectl apply -k manifests/ -l
# 'app.kubernetes.io/component!=admission'`, then the webhooks once runguard is Ready.
ADMISSION_LABELS = {**LABELS, "app.kubernetes.io/component": "admission"}

# The pod controllers whose templates the validating webhook judges, by API group.
POD_CONTROLLERS = {
    "apps": ("deployments", "statefulsets", "replicasets", "daemonsets"),
    "batch": ("jobs", "cronjobs"),
}


class ManifestError(Exception):
    """An input the manifests cannot be rendered from (a bad --url, a bad CA bundle)."""


def _client_config(
    path: str, namespace: str, service: str, ca_bundle: bytes | None, url: str | None
) -> dict[str, Any]:
    config: dict[str, Any]
    if url is not None:
        config = {"url": url.rstrip("/") + path}
    else:
        config = {
            "service": {"name": service, "namespace": namespace, "path": path, "port": SERVICE_PORT}
        }
    if ca_bundle is not None:
        config["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
    return config


def _rule(group: str, resources: Iterable[str], operations: list[str]) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["v1"],
        "operations": operations,
        "resources": list(resources),
        "scope": "Namespaced",
    }


def namespace_selector(policy: Policy, namespace: str) -> dict[str, Any]:
    """Every namespace but runguard's own (it must start without itself) and the excluded."""
    excluded = sorted({namespace, *policy.exclude_namespaces})
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "NotIn", "values": excluded}]}


def _webhook(
    name: str,
    path: str,
    rules: list[dict[str, Any]],
    policy: Policy,
    namespace: str,
    service: str,
    ca_bundle: bytes | None,
    url: str | None,
) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": _client_config(path, namespace, service, ca_bundle, url),
        "rules": rules,
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "namespaceSelector": namespace_selector(policy, namespace),
        "objectSelector": policy.selector.to_dict(),
    }


def _check_inputs(ca_bundle: bytes | None, url: str | None) -> None:
    if url is not None:
        parts = urlsplit(url)
        # The apiserver only calls https URLs, and rejects user info, queries and fragments.
        if parts.scheme != "https" or not parts.hostname:
            raise ManifestError(f"--url must be an https:// URL with a host, not {url!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ManifestError(f"--url must have no user, query or fragment: {url!r}")
    if ca_bundle is not None and b"-----BEGIN CERTIFICATE-----" not in ca_bundle:
        raise ManifestError("the CA bundle holds no PEM certificate")


def mutating_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """Pods are mutated on CREATE; on UPDATE runguard only puts back the running spec
    (``kubectl apply`` re-sending the user's manifest), since a Pod's spec is immutable."""
    _check_inputs(ca_bundle, url)
    hook = _webhook(
        MUTATING_WEBHOOK,
        MUTATE_PATH,
        # ephemeralcontainers: a debug container added with `kubectl debug` is hardened
        [_rule("", ["pods", "pods/ephemeralcontainers"], ["CREATE", "UPDATE"])],
        policy,
        namespace,
        service,
        ca_bundle,
        url,
    )
    # Mutation is idempotent, so running again after other mutating webhooks is safe.
    hook["reinvocationPolicy"] = "IfNeeded"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": dict(ADMISSION_LABELS)},
        "webhooks": [hook],
    }


def validating_webhook_configuration(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    """Pods (fail closed, objectSelector from the policy) and the pod templates of
    controllers (fail open, no objectSelector: the run labels are in the template)."""
    _check_inputs(ca_bundle, url)
    ops = ["CREATE", "UPDATE"]
    pods = _webhook(
        VALIDATING_WEBHOOK,
        VALIDATE_PATH,
        [_rule("", ["pods", *POD_SPEC_SUBRESOURCES], ops)],
        policy,
        namespace,
        service,
        ca_bundle,
        url,
    )
    controllers = _webhook(
        CONTROLLERS_WEBHOOK,
        VALIDATE_PATH,
        [_rule(group, resources, ops) for group, resources in POD_CONTROLLERS.items()],
        policy,
        namespace,
        service,
        ca_bundle,
        url,
    )
    controllers["failurePolicy"] = "Ignore"
    del controllers["objectSelector"]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": dict(ADMISSION_LABELS)},
        "webhooks": [pods, controllers],
    }


def webhook_configurations(
    policy: Policy,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    ca_bundle: bytes | None = None,
    url: str | None = None,
) -> list[dict[str, Any]]:
    """The mutating then the validating configuration (``ManifestError`` on bad input)."""
    kw: dict[str, Any] = {
        "namespace": namespace,
        "service": service,
        "ca_bundle": ca_bundle,
        "url": url,
    }
    return [
        mutating_webhook_configuration(policy, **kw),
        validating_webhook_configuration(policy, **kw),
    ]


def read_policy_files(directory: Path) -> dict[str, str]:
    """The text of each policy file the loader reads, by file name."""
    # The loader decides which files make a policy; the ConfigMap must hold exactly those.
    from webhook.policy.loader import policy_files

    return {p.name: p.read_text(encoding="utf-8") for p in policy_files(directory)}


def policy_config_map(
    files: Mapping[str, str], *, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, Any]:
    """The ConfigMap mounted as runguard's policy directory: one key per policy file."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP_NAME, "namespace": namespace, "labels": dict(LABELS)},
        "data": dict(sorted(files.items())),
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (policy files in the ConfigMap) as readable literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # kubectl users read these files: no &id001 anchors


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Iterable[Mapping[str, Any]], header: str = "") -> str:
    """Multi-document YAML, keys in the order built (apiVersion, kind, metadata first)."""
    body = yaml.dump_all(
        [dict(o) for o in objects],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
        allow_unicode=True,
        width=100,
    )
    return header + body


_HEADER = (
    "# Generated from policies/ by `runguard manifests -p policies --write manifests`.\n"
    "# Do not edit: edit policies/ and regenerate (tests/test_manifests.py checks it).\n"
)


def generated_files(
    policy: Policy, files: Mapping[str, str], *, namespace: str = DEFAULT_NAMESPACE
) -> dict[str, str]:
    """The generated files of the kustomize base, by name: text to write.

    The webhook configurations carry no ``caBundle``: kustomize copies it from the TLS
    Secret's ``ca.crt`` (see ``manifests/kustomization.yaml``), so it cannot drift either.
    """
    return {
        WEBHOOKS_FILE: to_yaml(webhook_configurations(policy, namespace=namespace), _HEADER),
        CONFIG_MAP_FILE: to_yaml([policy_config_map(files, namespace=namespace)], _HEADER),
    }
