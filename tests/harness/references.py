"""The ways a Pod names another object (``REFERENCES``, one per door) and the RunPolicies that
own what is named: ``OWNED`` (claims, config maps, secrets, device claims of the run),
``STRIP`` and ``DENY`` (the shipped one, stripping or denying what it does not own)."""

from __future__ import annotations

from typing import Any

import kubernetes.client as k8s
import yaml

from webhook.policy.model import Policy, build_run_policy

from .inputs import REPO

RUN_POLICY: dict[str, Any] = {
    "apiVersion": "runguard.io/v1",
    "kind": "RunPolicy",
    "metadata": {"name": "platform"},
    "spec": {
        "selector": {
            "matchLabels": {"app.kubernetes.io/managed-by": "dhcore"},
            "matchExpressions": [{"key": "dhcore/run", "operator": "Exists"}],
        },
        "excludeNamespaces": ["kube-system", "batch-legacy"],
    },
}

OWNED_POLICY: dict[str, Any] = {
    **RUN_POLICY,
    "spec": {
        **RUN_POLICY["spec"],
        "platform": {"identities": ["system:serviceaccount:digitalhub:core"]},
        "volumes": {
            "platformClaims": ["v-{labels[dhcore/run]}-*"],
            "platformConfigMaps": ["init-config-map-{labels[dhcore/run]}"],
        },
        "secrets": {"allowed": ["sec-*-{labels[dhcore/run]}", "registry.pull"]},
        "resources": {"platformDeviceClaims": ["gpu-{labels[dhcore/run]}"]},
    },
}

OWNED = build_run_policy(OWNED_POLICY, [])

REFERENCES: dict[str, dict[str, Any]] = {
    "claim volume": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "v-r1-a"}}]},
    "configMap volume": {"volumes": [{"name": "v", "configMap": {"name": "init-config-map-r1"}}]},
    "secret volume": {"volumes": [{"name": "v", "secret": {"secretName": "sec-db-r1"}}]},
    "projected configMap": {"volumes": [{"name": "v", "projected": {"sources": [
        {"downwardAPI": {}}, {"configMap": {"name": "init-config-map-r1"}}]}}]},
    "projected secret": {"volumes": [{"name": "v", "projected": {"sources": [
        {"secret": {"name": "registry.pull"}}]}}]},
    "env secretKeyRef": {"containers": [{"name": "c", "env": [
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec-db-r1", "key": "k"}}}]}]},
    "env configMapKeyRef": {"containers": [{"name": "c", "env": [
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "init-config-map-r1",
                                                        "key": "k"}}}]}]},
    "envFrom secretRef": {"containers": [{"name": "c", "envFrom": [
        {"secretRef": {"name": "sec-db-r1"}}]}]},
    "envFrom configMapRef": {"containers": [{"name": "c", "envFrom": [
        {"prefix": "X_", "configMapRef": {"name": "init-config-map-r1"}}]}]},
    "init container": {"containers": [{"name": "c"}], "initContainers": [{"name": "i", "envFrom": [
        {"secretRef": {"name": "sec-db-r1"}}]}]},
    "ephemeral container": {"containers": [{"name": "c"}], "ephemeralContainers": [
        {"name": "debug", "envFrom": [{"secretRef": {"name": "sec-db-r1"}}]}]},
    "imagePullSecrets": {"imagePullSecrets": [{"name": "team"}, {"name": "registry.pull"}]},
    # the volume types that name a secret of their own (docs/dev/guarantees.md, "Trust over time",
    # "every door")
    **{f"{vtype} {key}": {"volumes": [{"name": "v", vtype: {key: {"name": "sec-db-r1"}}}]}
       for vtype, key in (("csi", "nodePublishSecretRef"), ("flexVolume", "secretRef"),
                          ("cephfs", "secretRef"), ("rbd", "secretRef"), ("iscsi", "secretRef"),
                          ("cinder", "secretRef"), ("scaleIO", "secretRef"),
                          ("storageos", "secretRef"))},
    "azureFile secretName": {"volumes": [{"name": "v", "azureFile": {"secretName": "sec-db-r1"}}]},
    # a driver given the platform's secret by name in its free map (Azure File's secretName)
    "csi volumeAttributes": {"volumes": [{"name": "v", "csi": {"driver": "file.csi.azure.com",
        "volumeAttributes": {"shareName": "data", "secretName": "sec-db-r1"}}}]},
    "flexVolume options": {"volumes": [{"name": "v", "flexVolume": {"driver": "x/y",
        "options": {"secret": "sec-db-r1"}}}]},
    # a platform claim cloned into a new one by a generic ephemeral volume
    **{f"ephemeral {key}": {"volumes": [{"name": "v", "ephemeral": {"volumeClaimTemplate": {
        "spec": {key: {"kind": "PersistentVolumeClaim", "name": "v-r1-a"}}}}}]}
       for key in ("dataSource", "dataSourceRef")},
    # a platform run's claim of devices, shared by naming it
    "resourceClaimName": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-r1"}]},
}  # fmt: skip

VOLUME_TYPES = tuple(k8s.V1Volume.attribute_map[a] for a in k8s.V1Volume.openapi_types)


def _policy(**modes: str) -> Any:
    """The shipped RunPolicy, with every volume type allowed (at level baseline, so that
    only the door's own rule judges a csi or flexVolume volume) and a pattern for the
    platform's device claims; ``modes``: volumes.onPreExisting and secrets.onForbidden."""
    doc = yaml.safe_load((REPO / "policies" / "runpolicy.yaml").read_text())
    spec = doc["spec"]
    spec["platform"] = yaml.safe_load((REPO / "policies" / "platform.yaml").read_text())["spec"]
    spec["security"]["level"] = "baseline"
    spec["volumes"]["allowedTypes"] = [t for t in VOLUME_TYPES if t not in ("name", "hostPath")]
    spec["resources"]["platformDeviceClaims"] = ["gpu-{labels[dhcore/run]}"]
    spec["profiles"].pop("unknown", None)
    if "pre_existing" in modes:
        spec["volumes"]["onPreExisting"] = modes["pre_existing"]
    if "forbidden" in modes:
        spec["secrets"]["onForbidden"] = modes["forbidden"]
    return Policy.of(build_run_policy(doc, []))


STRIP = _policy()

DENY = _policy(pre_existing="Deny", forbidden="Deny")

NAMESPACE = "digitalhub"  # where the platform's ServiceAccount, core, lives
