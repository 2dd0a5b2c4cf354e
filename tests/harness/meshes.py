"""A service mesh's injection, as Istio's sidecar injector writes it into a Pod: the
unit tests of the neighbours and the e2e test through the real apiserver build their
meshed runs from it."""

from __future__ import annotations

import copy
from typing import Any

JSON = dict[str, Any]

CA_VOLUMES = [
    {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
    {"name": "istio-ca-crl", "configMap": {"name": "istio-ca-crl", "optional": True}},
]
CA_MOUNTS = [
    {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
    {"name": "istio-ca-crl", "mountPath": "/var/run/secrets/istio/crl"},
]
ISTIO_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "2", "memory": "1Gi"},
}
ISTIO_UNPRIVILEGED = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsGroup": 1337,
    "runAsUser": 1337,
    "runAsNonRoot": True,
}


def istio_injected(pod: JSON, cni: bool = True) -> JSON:
    """A copy of ``pod`` as Istio's injector leaves it (native sidecar): its init container (CNI
    mode: istio-validation, unprivileged; else istio-init, root with NET_ADMIN), the
    istio-proxy sidecar with Istio's default resources, and its volumes."""
    init: dict[str, Any] = {
        "name": "istio-validation" if cni else "istio-init",
        "image": "docker.io/istio/proxyv2:1.28.0",
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337"]
        + (["--run-validation", "--skip-rule-apply"] if cni else []),
        "resources": copy.deepcopy(ISTIO_RESOURCES),
        "securityContext": copy.deepcopy(ISTIO_UNPRIVILEGED)
        if cni
        else {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
            "readOnlyRootFilesystem": False,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "runAsUser": 0,
        },
    }
    proxy = {
        "name": "istio-proxy",
        "image": "docker.io/istio/proxyv2:1.28.0",
        "restartPolicy": "Always",
        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
        "resources": copy.deepcopy(ISTIO_RESOURCES),
        "securityContext": copy.deepcopy(ISTIO_UNPRIVILEGED),
        "volumeMounts": [
            {"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"},
            {"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"},
            *CA_MOUNTS,
            {"name": "istio-data", "mountPath": "/var/lib/istio/data"},
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
            {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
            {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"},
        ],
    }
    volumes = [
        {"name": "workload-socket", "emptyDir": {}},
        {"name": "workload-certs", "emptyDir": {}},
        {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
        {"name": "istio-data", "emptyDir": {}},
        {
            "name": "istio-podinfo",
            "downwardAPI": {
                "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
            },
        },
        {
            "name": "istio-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "path": "istio-token",
                            "expirationSeconds": 43200,
                            "audience": "istio-ca",
                        }
                    }
                ]
            },
        },
        *copy.deepcopy(CA_VOLUMES),
    ]
    out = copy.deepcopy(pod)
    spec = out["spec"]
    spec["initContainers"] = [*spec.get("initContainers", []), init, proxy]
    spec["volumes"] = [*spec.get("volumes", []), *volumes]
    annotations = out["metadata"].setdefault("annotations", {})
    annotations["sidecar.istio.io/status"] = '{"initContainers":[]}'
    return out
