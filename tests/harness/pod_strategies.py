"""Hypothesis strategies for Pods (``pods``) and the policies they are judged under
(``POLICY_SET``), with the ``SETTINGS`` the property tests run them at."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from webhook.policy.loader import load_policy

from .inputs import REPO

POLICIES = REPO / "tests" / "cases" / "_policies"

PLATFORM = load_policy(POLICIES / "platform")

STRICT = load_policy(POLICIES / "strict")

POLICY_SET = [PLATFORM, STRICT, load_policy(POLICIES / "lenient"), load_policy(POLICIES / "warn")]

quantities = st.sampled_from(
    ["0.5", "500m", "1e3", "1G", "1Gi", "64Gi", "70G", "128Gi", "2", "16", "32", 1, 0.25, "100Mi"]
)

resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"])

resource_map = st.dictionaries(resource_names, quantities, max_size=4)

ids = st.sampled_from([0, 0, 1000, 8877])

secret_names = st.sampled_from(["sec-db-r1", "aws-creds", "sec-x-r2", "github"])

claim_names = st.sampled_from(["v-r1-data", "team-data", "v-r2-x"])

config_maps = st.sampled_from(["init-config-map-r1", "shared"])

capabilities = st.lists(st.sampled_from(["SYS_ADMIN", "NET_BIND_SERVICE", "NET_ADMIN"]), max_size=3)


@st.composite
def security_contexts(draw: Any, *, pod: bool) -> dict[str, Any]:
    sc: dict[str, Any] = {}
    keys = ["runAsUser", "runAsGroup"] + (["fsGroup"] if pod else [])
    for key in keys:
        if draw(st.booleans()):
            sc[key] = draw(ids)
    if draw(st.booleans()):
        sc["runAsNonRoot"] = draw(st.booleans())
    if draw(st.booleans()):
        sc["seccompProfile"] = {"type": draw(st.sampled_from(["Unconfined", "RuntimeDefault"]))}
    if not pod:
        for key in ("privileged", "allowPrivilegeEscalation"):
            if draw(st.booleans()):
                sc[key] = draw(st.booleans())
        if draw(st.booleans()):
            sc["capabilities"] = {"add": draw(capabilities), "drop": draw(capabilities)}
    return sc


@st.composite
def containers(draw: Any, name: str, volume_names: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "python:3.11"}
    if draw(st.booleans()):
        c["resources"] = {"requests": draw(resource_map), "limits": draw(resource_map)}
    if draw(st.booleans()):
        c["securityContext"] = draw(security_contexts(pod=False))
    if draw(st.booleans()):
        c["env"] = [
            {
                "name": f"E{i}",
                "valueFrom": {"secretKeyRef": {"name": draw(secret_names), "key": "k"}},
            }
            if draw(st.booleans())
            else {"name": f"E{i}", "value": "v"}
            for i in range(draw(st.integers(0, 3)))
        ]
    if draw(st.booleans()):
        c["envFrom"] = [{"secretRef": {"name": draw(secret_names)}}]
    if volume_names and draw(st.booleans()):
        c["volumeMounts"] = [{"name": v, "mountPath": f"/{v}"} for v in volume_names]
    return c


@st.composite
def volumes(draw: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["pvc", "cm", "secret", "projected", "emptyDir", "hostPath"]))
        name = f"v{i}"
        if kind == "pvc":
            out.append({"name": name, "persistentVolumeClaim": {"claimName": draw(claim_names)}})
        elif kind == "cm":
            out.append({"name": name, "configMap": {"name": draw(config_maps)}})
        elif kind == "secret":
            out.append({"name": name, "secret": {"secretName": draw(secret_names)}})
        elif kind == "projected":
            srcs = [
                {"secret": {"name": draw(secret_names)}} for _ in range(draw(st.integers(0, 2)))
            ]
            out.append({"name": name, "projected": {"sources": srcs}})
        elif kind == "emptyDir":
            out.append({"name": name, "emptyDir": {}})
        elif kind == "hostPath" and draw(st.integers(0, 4)) == 0:
            out.append({"name": name, "hostPath": {"path": "/"}})
    return out


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "dhcore"}
    if draw(st.booleans()):
        labels["dhcore/run"] = "r1"
    profile = draw(st.sampled_from([None, "default", "1xa100", "1xa100", "missing"]))
    if profile:
        labels["dhcore/template"] = profile
    annotations = {}
    mode = draw(st.sampled_from([None, "allow", "constrain", "prevent", "none"]))
    if mode:
        annotations["runguard.io/preemption-mode"] = mode
    vols = draw(volumes())
    names = [v["name"] for v in vols]
    spec: dict[str, Any] = {
        "containers": [draw(containers(f"c{i}", names)) for i in range(draw(st.integers(1, 3)))],
    }
    if draw(st.booleans()):
        spec["initContainers"] = [draw(containers("init", names))]
    if vols:
        spec["volumes"] = vols
    if draw(st.booleans()):
        spec["securityContext"] = draw(security_contexts(pod=True))
    if draw(st.booleans()):
        spec["priorityClassName"] = draw(st.sampled_from(["low", "high", "urgent"]))
    if draw(st.booleans()):
        spec["tolerations"] = [
            {"key": "node-lifecycle", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "t4", "effect": "NoSchedule"},
        ][: draw(st.integers(1, 2))]
    if draw(st.booleans()):
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        }
    if draw(st.integers(0, 5)) == 0:
        spec["hostNetwork"] = True
    meta: dict[str, Any] = {"name": "p", "namespace": "ml", "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
