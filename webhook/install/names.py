"""What runguard's admission objects are called and where they call it: the webhooks'
names, paths and timeouts, the generated files, the labels, the subresources routed,
a webhook's rules and its client configuration.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

DEFAULT_NAMESPACE = "runguard"
DEFAULT_SERVICE = "runguard"
SERVICE_PORT = 443
CONFIGURATION_NAME = "runguard"
# matchConditions are GA (on by default, and their CEL environment with optional
# types, `?.` and `orValue`) from this version on.
MIN_KUBERNETES = "1.30"
# Run Pods, by objectSelector.
MUTATING_WEBHOOK = "mutate.runguard.io"
VALIDATING_WEBHOOK = "validate.runguard.io"
# Pod controllers whose template is a run's or names the platform's objects, by CEL
# (the template is out of an objectSelector's sight). Mutated only to be stamped.
MUTATING_CONTROLLERS_WEBHOOK = "mutate-controllers.runguard.io"
CONTROLLERS_WEBHOOK = "validate-controllers.runguard.io"
# Ownership on: Pods outside the selector naming the platform's objects (stamped at
# CREATE, judged by ownership.not-a-run), and objects created with a platform name.
MUTATING_REFERENCES_WEBHOOK = "mutate-references.runguard.io"
VALIDATING_REFERENCES_WEBHOOK = "validate-references.runguard.io"
RESERVED_NAMES_WEBHOOK = "validate-reserved-names.runguard.io"
# Platform operators' objects (Argo Workflows, RayClusters, ...), by kind.
MUTATING_OPERATORS_WEBHOOK = "mutate-operators.runguard.io"
OPERATORS_WEBHOOK = "validate-operators.runguard.io"
MUTATE_PATH, VALIDATE_PATH = "/mutate", "/validate"
CONFIG_MAP_NAME = "runguard-policies"
# Pod subresources that change a Pod's spec after creation: each is a door into a running
# run (``kubectl debug`` adds containers, ``pods/resize`` changes resources), so each is
# routed to runguard. The e2e suite reads the real apiserver's list and fails on a new one.
POD_SPEC_SUBRESOURCES = ("pods/ephemeralcontainers", "pods/resize")
# The status subresource of a Pod and of every pod controller may change labels,
# annotations and (except a Pod's) ownerReferences: the apiserver's status strategies put
# back only the spec. So it is routed too, but only when it changes one of them (the
# ``status-changes-metadata`` condition): the kubelet's and the controllers' status
# updates never wait on runguard.
STATUS = "status"
POD_STATUS = f"pods/{STATUS}"
STATUS_METADATA = {"labels": "{}", "annotations": "{}", "ownerReferences": "[]"}
WEBHOOKS_FILE = "webhooks.yaml"
# The floor's ValidatingAdmissionPolicies (``floor.py``), and the component that makes
# the webhooks judging runs fail open.
FLOOR_FILE = "floor.yaml"
AVAILABLE_MODE_FILE = "available-mode/kustomization.yaml"
CONFIG_MAP_FILE = "policy-configmap.yaml"
# The policy-objects component: RunPolicy, Platform and Profile as custom resources (its CRDs and
# the webhook that checks them are generated; its kustomization and RBAC are written).
POLICY_OBJECTS_DIR = "policy-objects"
POLICY_WEBHOOK_FILE = f"{POLICY_OBJECTS_DIR}/webhook.yaml"
POLICY_WEBHOOK = "validate-policies.runguard.io"
POLICY_CONFIGURATION_NAME = "runguard-policies"
VALIDATE_POLICY_PATH = "/validate-policy"
# The cluster-state component: a shell opened into a Pod (``kubectl exec``, ``attach``:
# CONNECT, whose object is the command, not the Pod) is judged on the Pod runguard reads
# with that component's credentials, so its webhook ships with them.
SHELLS_WEBHOOK_FILE = "cluster-state/shells-webhook.yaml"
SHELLS_WEBHOOK = "validate-shells.runguard.io"
POD_TOKENS_WEBHOOK = "validate-pod-tokens.runguard.io"
SHELLS_CONFIGURATION_NAME = "runguard-shells"
# Doors into a running Pod (``webhook.engine.rules.debug.SHELLS``), and the token a
# TokenRequest binds to a Pod (which its bearer could present as that Pod's).
# A Service's proxy reaches the Pods behind it (judged on each).
SHELL_SUBRESOURCES = (
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "pods/proxy",
    "services/proxy",
)
TOKEN_SUBRESOURCE = "serviceaccounts/token"
TIMEOUT_SECONDS = 5
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
LABELS = {"app.kubernetes.io/name": "runguard", "app.kubernetes.io/part-of": "runguard"}
# Lets an admin apply everything else first: `kubectl apply -k manifests/ -l
# 'app.kubernetes.io/component!=admission'`, then the webhooks once runguard is Ready.
ADMISSION_LABELS = {**LABELS, "app.kubernetes.io/component": "admission"}

# The pod controllers whose templates runguard judges, by API group (every kind
# webhook.engine.podspec finds a template in).
POD_CONTROLLERS = {
    "apps": ("deployments", "statefulsets", "replicasets", "daemonsets"),
    "batch": ("jobs", "cronjobs"),
    "": ("replicationcontrollers",),
}
# The objects whose names the platform's patterns reserve: resource -> kind (the kind
# ownership.reserved_patterns knows them by).
PLATFORM_OBJECTS = {
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "secrets": "Secret",
    "configmaps": "ConfigMap",
    "resourceclaims": "ResourceClaim",
}
# The API group of those outside the core group (v1: resource.k8s.io from Kubernetes 1.34,
# where dynamic resource allocation is on by default; matchPolicy Equivalent sends a
# v1beta2 request too, converted).
PLATFORM_OBJECT_GROUPS = {"resourceclaims": "resource.k8s.io"}


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
