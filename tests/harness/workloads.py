"""Workloads the tests and the benchmarks share: the Pods they send and how they look
at a server's processes.

* ``gpu_pod``: the typical GPU run Pod of a run (the engine's benchmark, receipts);
* ``typical_run_pod``: a run Pod as a user submits it, most mutation steps firing (the
  HTTP benchmark, the soak);
* ``SERIES``: Pods with a list grown to a given size, ``as_sent`` as the apiserver
  defaults them (``bench/bench_sizes.py``, ``tests/engine/test_sizes.py``);
* ``memory_mb``: a process's resident and proportional memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

GPU_RUN_LABELS = {
    "app.kubernetes.io/managed-by": "dhcore",
    "dhcore/run": "r1",
    "dhcore/template": "1xa100",
}


def gpu_container(name: str, i: int, run: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "image": "ghcr.io/example/trainer:1.4",
        "command": ["python", "train.py"],
        "args": ["--epochs", "10", f"--shard={i}"],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "128Gi"}},
        "env": [
            {"name": "HF_HOME", "value": "/local-data/huggingface"},
            {"name": "DB", "valueFrom": {"secretKeyRef": {"name": f"sec-db-r{run}", "key": "url"}}},
            {"name": "AWS", "valueFrom": {"secretKeyRef": {"name": "aws-creds", "key": "k"}}},
        ],
        "volumeMounts": [
            {"name": "data", "mountPath": "/local-data"},
            {"name": "team", "mountPath": "/team"},
        ],
        "securityContext": {"runAsUser": 0},
    }


def gpu_pod(containers: int, run: int = 1) -> dict[str, Any]:
    """The typical GPU run Pod of run ``run`` (its name, run label, secret and volume)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"train-r{run}",
            "namespace": "ml",
            "labels": {**GPU_RUN_LABELS, "dhcore/run": f"r{run}"},
            "annotations": {"runguard.io/preemption-mode": "prevent"},
        },
        "spec": {
            "containers": [gpu_container(f"c{i}", i, run) for i in range(containers)],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": f"v-r{run}-data"}},
                {"name": "team", "persistentVolumeClaim": {"claimName": "team-shared"}},
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "restartPolicy": "Never",
        },
    }


def typical_run_pod() -> dict[str, Any]:
    """A run Pod as a user submits it: a profile, root, extra resources, a foreign
    secret, a pre-existing volume, a platform volume, a sidecar."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-3f2a",
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/run": "3f2a",
                "dhcore/template": "1xa100",
            },
            "annotations": {"runguard.io/preemption-mode": "prevent"},
        },
        "spec": {
            "securityContext": {"runAsUser": 0, "fsGroup": 0},
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "train.py"],
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi"},
                        "limits": {"memory": "128Gi"},
                    },
                    "env": [
                        {"name": "EPOCHS", "value": "10"},
                        {
                            "name": "TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "other", "key": "t"}},
                        },
                        {
                            "name": "S3",
                            "valueFrom": {"secretKeyRef": {"name": "sec-s3-3f2a", "key": "k"}},
                        },
                    ],
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "old", "mountPath": "/old"},
                    ],
                },
                {"name": "sidecar", "image": "busybox", "securityContext": {"privileged": True}},
            ],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "v-3f2a-data"}},
                {"name": "old", "persistentVolumeClaim": {"claimName": "someone-elses"}},
            ],
        },
    }


# ------------------------------------------------------------------ Pods by size


SIZED_LABELS = {
    "app.kubernetes.io/managed-by": "dhcore",
    "dhcore/run": "r1",
    "dhcore/template": "1xt4",
}


def sized_pod(containers: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "big", "namespace": "ml", "labels": dict(SIZED_LABELS)},
        "spec": spec,
    }


def env_pod(n: int) -> dict[str, Any]:
    """One container, ``n`` env entries: one in ten a secret the platform does not manage
    (stripped), the others names only (as small as an entry gets, so 100k fit in 3 MiB)."""
    env: list[dict[str, Any]] = [
        {"name": f"S{i}", "valueFrom": {"secretKeyRef": {"name": f"x{i}", "key": "k"}}}
        if i % 10 == 0
        else {"name": f"V{i}"}
        for i in range(n)
    ]
    return sized_pod([{"name": "main", "image": "i", "env": env}], [])


def containers_pod(n: int) -> dict[str, Any]:
    """``n`` containers, one in a hundred running as root (stripped)."""
    return sized_pod(
        [
            {"name": f"c{i}", "image": "i", "securityContext": {"runAsUser": 0}}
            if i % 100 == 0
            else {"name": f"c{i}", "image": "i"}
            for i in range(n)
        ],
        [],
    )


def volumes_pod(n: int) -> dict[str, Any]:
    """``n`` volumes: one in ten a claim the run does not own, mounted in the container
    (both stripped), the others emptyDirs."""
    volumes: list[dict[str, Any]] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": "t"}}
        if i % 10 == 0
        else {"name": f"v{i}", "emptyDir": {}}
        for i in range(n)
    ]
    mounts = [{"name": f"v{i}", "mountPath": "/m"} for i in range(0, n, 10)]
    return sized_pod([{"name": "main", "image": "i", "volumeMounts": mounts}], volumes)


SERIES: dict[str, Callable[[int], dict[str, Any]]] = {
    "env entries": env_pod,
    "containers": containers_pod,
    "volumes": volumes_pod,
}


CONTAINER_DEFAULTS = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "imagePullPolicy": "Always",
    "resources": {},
}
POD_DEFAULTS = {
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "securityContext": {},
    "schedulerName": "default-scheduler",
    "enableServiceLinks": True,
    "preemptionPolicy": "PreemptLowerOrEqual",
    "priority": 0,
}


def as_sent(written: dict[str, Any]) -> dict[str, Any]:
    """The Pod as the apiserver sends it to webhooks: decoded and defaulted first."""
    pod: dict[str, Any] = json.loads(json.dumps(written))
    spec = pod["spec"]
    for key, value in POD_DEFAULTS.items():
        spec.setdefault(key, value)
    for container in spec["containers"]:
        for key, value in CONTAINER_DEFAULTS.items():
            container.setdefault(key, json.loads(json.dumps(value)))
    return pod


# ------------------------------------------------------------------ processes


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident, proportional) set size in MB."""
    rss = pss = 0.0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) / 1024
    return rss, pss
