"""runguard's validating webhook side by side with OPA on the same rules (not a test).

OPA (the policy engine behind Gatekeeper) is built at a pinned version by
``bench/opa/build.sh`` (cached beside the e2e binaries) and served as an admission
webhook: ``opa run --server`` over TLS with ``bench/opa/runguard.rego`` (the rules, which
say at their top what they cover) and a data document generated here from the runguard
policy directory (the values: selectors, profiles, maximums, name patterns...).

1. Agreement: a shared set of CREATE reviews (``cases``: the typical GPU run Pod as
   runguard's mutating webhook leaves it, allowed, and variants made compliant or not
   along each covered rule, plus a few pods as users submit them) is decided by runguard's
   engine in-process (``admission.review``, what ``/validate`` runs) and by OPA over
   HTTPS; every disagreement is printed with both messages.
2. Throughput: runguard served as ``bench/bench_all.py`` serves its default configuration
   and OPA (``GOMAXPROCS=2``), both over TLS with the same certificate, driven by the same
   client (``bench_http.drive``: keep-alive TLS connections, one process each) with the
   same review (the typical pod's, allowed), in interleaved rounds: requests/s, p50 and
   p99, and server CPU per request (utime + stime of the server process and its workers).

Prints the agreement, a table (median [min-max] over rounds), the load average, and as its
last line one JSON object: ``runguard_validate_rps``, ``opa_validate_rps``,
``runguard_validate_cpu_us``, ``opa_validate_cpu_us``, the p50s and p99s (medians),
``ranges`` ([min, max]) and ``agreement``. Exits 2 when OPA cannot be built, 1 when the
engines disagree. Bounded: ``--rounds`` (<= 5) x ``--seconds`` (<= 20) per server, about
a minute by default (plus OPA's build, once).

    .venv/bin/python bench/bench_opa.py [--rounds 3] [--seconds 5]

From another script: ``side = OpaSide(); side.start(); side.agreement(); side.round(5)``
... ``side.stop()`` (``OpaUnavailable`` when OPA cannot be built or started).
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import bench_engine
import bench_http
from bench_config import BENCH, CONNECTIONS, POLICY_DIR, default_config
from harness import slow_clients
from harness.workloads import typical_run_pod

from webhook.engine.rules.hardening import drop_fill, seccomp_fill  # noqa: E402
from webhook.engine.rules.pod_security import allowed_capabilities  # noqa: E402
from webhook.policy.loader import load_policy  # noqa: E402
from webhook.policy.model import NamePattern, Policy, RunPolicy  # noqa: E402
from webhook.policy.patterns import split  # noqa: E402
from webhook.serving import admission  # noqa: E402

OPA_DIR = BENCH / "opa"
BUILD_SCRIPT = OPA_DIR / "build.sh"
REGO_FILES = ("runguard.rego", "main.rego")
BUILD_TIMEOUT = 1800  # a cold build of OPA takes minutes of CPU on 2 cores
TARGET_CPU_RATIO = 0.6  # issue 12: runguard_validate_cpu_us <= 0.6 x opa_validate_cpu_us
KEYS = ("rps", "cpu_us", "p50_ms", "p99_ms")


class OpaUnavailable(RuntimeError):
    """OPA could not be built or started; the message says why."""


# ------------------------------------------------------------------ OPA: binary and data


def build_opa() -> str:
    """The OPA binary's path, built once per version by ``bench/opa/build.sh``."""
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OpaUnavailable(f"bench/opa/build.sh did not finish: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise OpaUnavailable(f"bench/opa/build.sh failed (exit {done.returncode}):\n{tail}")
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if not path or not os.access(path, os.X_OK):
        raise OpaUnavailable(f"bench/opa/build.sh printed no executable path: {path!r}")
    return path


def _regex_literal(text: str) -> str:
    """A pattern's literal text as an RE2 regex: ``*`` any run of characters."""
    return ".*".join(re.sub(r"([^A-Za-z0-9])", r"\\\1", chunk) for chunk in text.split("*"))


def _pattern(pattern: NamePattern) -> dict[str, Any]:
    """A name pattern for the Rego: its literals as regexes, its placeholders' label keys."""
    literals, keys = split(pattern.text)
    return {"literals": [_regex_literal(lit) for lit in literals], "keys": keys}


def _any_labels(pattern: NamePattern) -> str:
    """The regex of a pattern whose placeholders stand for any label value."""
    literals, _ = split(pattern.text)
    return "^" + ".+".join(_regex_literal(lit) for lit in literals) + "$"


def _number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


def _run_policy(policy: RunPolicy) -> dict[str, Any]:
    """One RunPolicy's values, as ``bench/opa/runguard.rego`` reads them."""
    res, sec, vol, sched = policy.resources, policy.security, policy.volumes, policy.scheduling
    profiles = {
        name: {
            "name": name,
            "resources": {"requests": dict(p.requests), "limits": dict(p.limits)},
            "nodeSelector": dict(p.node_selector),
            "tolerations": [dict(t) for t in p.tolerations],
            "env": [dict(e) for e in p.env],
            "affinity": p.affinity,
            "priorityClassName": p.priority_class_name,
            "runtimeClassName": p.runtime_class_name,
        }
        for name, p in policy.profiles.items()
    }
    allowed_classes = sched.allowed_priority_classes
    return {
        "name": policy.name,
        "enforcement": policy.enforcement,
        "excludeNamespaces": sorted(policy.exclude_namespaces),
        "selector": {
            "matchLabels": dict(policy.selector.match_labels),
            "matchExpressions": [dict(e) for e in policy.selector.match_expressions],
        },
        "profiles": {
            "label": policy.profiles_config.label,
            "default": policy.profiles_config.default,
            "unknown": policy.profiles_config.unknown,
            "byName": profiles,
        },
        "resources": {
            "gpu": res.gpu_resource_name,
            "defaults": {
                "requests": dict(res.default_requests),
                "limits": dict(res.default_limits),
            },
            "memoryLimitFactor": None
            if res.memory_limit_factor is None
            else float(res.memory_limit_factor),
            "maximums": {name: _number(value) for name, value in res.maximum_values.items()},
            "deviceEnv": list(res.device_env),
        },
        "security": {
            "level": sec.level,
            "onRoot": sec.on_root,
            "seccompFill": seccomp_fill(policy),
            "dropFill": list(drop_fill(policy)),
            "allowedCapabilities": sorted(allowed_capabilities(policy)),
        },
        "volumes": {
            "allowedTypes": sorted(vol.allowed_types),
            "platformClaims": [_pattern(p) for p in vol.platform_claims],
            "platformConfigMaps": [_pattern(p) for p in vol.platform_config_maps],
        },
        "secrets": {"allowed": [_pattern(p) for p in policy.secrets.allowed]},
        "scheduling": {
            "allowedPriorityClasses": None if allowed_classes is None else sorted(allowed_classes),
            "defaultPriorityClass": sched.default_priority_class,
            "preemption": None
            if sched.preemption is None
            else {"annotation": sched.preemption.annotation},
        },
        "platform": {
            "identities": list(policy.platform.identities),
            "controllers": list(policy.platform.controllers),
        },
        "anyNames": {
            "PersistentVolumeClaim": [_any_labels(p) for p in vol.platform_claims],
            "ConfigMap": [_any_labels(p) for p in vol.platform_config_maps],
            "Secret": [_any_labels(p) for p in policy.secrets.allowed],
        },
    }


def opa_data(policy: Policy) -> dict[str, Any]:
    """The data document: every RunPolicy, in the order runguard tries them."""
    return {"runguard_data": {"policies": [_run_policy(p) for p in policy.run_policies]}}


# ------------------------------------------------------------------ the shared reviews


def platform_user(policy: Policy) -> str:
    """The platform's identity (the user that creates runs), from the policy."""
    for run_policy in policy.run_policies:
        for identity in run_policy.platform.identities:
            if not identity.startswith("group:"):
                return identity
    return "system:serviceaccount:digitalhub:core"


def review(pod: dict[str, Any], user: str, namespace: str = "ml") -> bytes:
    """A CREATE AdmissionReview of ``pod`` as the apiserver sends it."""
    doc = json.loads(slow_clients.review_of(pod, user=user))
    doc["request"]["namespace"] = namespace
    return json.dumps(doc).encode()


def mutated(pod: dict[str, Any], policy: Policy, user: str, namespace: str = "ml") -> Any:
    """``pod`` as runguard's mutating webhook leaves it (the object /validate then sees)."""
    request = admission.parse_review(review(pod, user, namespace))
    decision = admission.review("mutate", request, policy).decision
    assert decision is not None
    return decision.object


def typical_pod() -> dict[str, Any]:
    """The typical GPU run Pod (``bench_engine.gpu_pod(1)``, as the engine figure uses) as
    the apiserver sends it to the webhooks."""
    return as_sent(bench_engine.gpu_pod(1))


CONTAINER_DEFAULTS = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "imagePullPolicy": "IfNotPresent",
}
POD_DEFAULTS = {
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "serviceAccountName": "default",
    "serviceAccount": "default",
    "schedulerName": "default-scheduler",
    "enableServiceLinks": True,
}
SERVICE_ACCOUNT_VOLUME = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}
NODE_TOLERATIONS = [
    {
        "key": f"node.kubernetes.io/{condition}",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    for condition in ("not-ready", "unreachable")
]


def as_sent(written: dict[str, Any]) -> dict[str, Any]:
    """A Pod as the apiserver sends it to the webhooks: defaulted, with what its admission
    plugins add before them (ServiceAccount's token volume, DefaultTolerationSeconds)."""
    pod: dict[str, Any] = copy.deepcopy(written)
    spec = pod["spec"]
    for key, value in POD_DEFAULTS.items():
        spec.setdefault(key, value)
    spec.setdefault("volumes", []).append(copy.deepcopy(SERVICE_ACCOUNT_VOLUME))
    spec.setdefault("tolerations", []).extend(copy.deepcopy(NODE_TOLERATIONS))
    for container in spec["containers"]:
        for key, value in CONTAINER_DEFAULTS.items():
            container.setdefault(key, value)
        container.setdefault("volumeMounts", []).append(
            {
                "name": SERVICE_ACCOUNT_VOLUME["name"],
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        )
    return pod


def _plain_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def _build_pod() -> dict[str, Any]:
    """An image build as the Core's k8sbuild framework runs it: Kaniko as root."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "build-r7",
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/run": "r7",
                "dhcore/framework": "k8sbuild",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "kaniko",
                    "image": "gcr.io/kaniko-project/executor:v1.23.2",
                    "args": ["--destination=registry.local/app:1"],
                    "securityContext": {"runAsUser": 0},
                    "volumeMounts": [{"name": "docker", "mountPath": "/kaniko/.docker"}],
                }
            ],
            "volumes": [{"name": "docker", "secret": {"secretName": "registry-credentials"}}],
            "restartPolicy": "Never",
        },
    }


Edit = Callable[[dict[str, Any]], None]


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def _sc(pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    context: dict[str, Any] = pod["spec"]["containers"][index].setdefault("securityContext", {})
    return context


def _add_volume(pod: dict[str, Any], volume: dict[str, Any], mount: bool = True) -> None:
    pod["spec"].setdefault("volumes", []).append(volume)
    if mount:
        _main(pod).setdefault("volumeMounts", []).append(
            {"name": volume["name"], "mountPath": f"/mnt/{volume['name']}"}
        )


def _env(pod: dict[str, Any], entry: dict[str, Any]) -> None:
    _main(pod).setdefault("env", []).append(entry)


def _secret_env(name: str) -> dict[str, Any]:
    return {"name": "S", "valueFrom": {"secretKeyRef": {"name": name, "key": "k"}}}


def _sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][1]
    return container


# (name, edit of the typical mutated pod, expected by runguard: True allowed / False denied)
VARIANTS: tuple[tuple[str, Edit, bool], ...] = (
    ("as mutated", lambda p: None, True),
    ("container runAsUser 1000", lambda p: _sc(p).update(runAsUser=1000), True),
    (
        "seccomp Localhost",
        lambda p: p["spec"]["securityContext"].update(
            seccompProfile={"type": "Localhost", "localhostProfile": "train.json"}
        ),
        True,
    ),
    ("emptyDir volume", lambda p: _add_volume(p, {"name": "tmp", "emptyDir": {}}), True),
    (
        "this run's platform claim",
        lambda p: _add_volume(
            p, {"name": "scratch", "persistentVolumeClaim": {"claimName": "v-r1-scratch"}}
        ),
        True,
    ),
    (
        "envFrom the run's secret",
        lambda p: _main(p).setdefault("envFrom", []).append({"secretRef": {"name": "sec-db-r1"}}),
        True,
    ),
    (
        "platform-wide secret in env",
        lambda p: _env(p, _secret_env("digitalhub-common-creds")),
        True,
    ),
    (
        "secret volume of the run",
        lambda p: _add_volume(p, {"name": "tls", "secret": {"secretName": "sec-tls-r1"}}),
        True,
    ),
    (
        "init configMap of the run",
        lambda p: _add_volume(p, {"name": "init", "configMap": {"name": "init-config-map-r1"}}),
        True,
    ),
    (
        "safe sysctl",
        lambda p: p["spec"]["securityContext"].update(
            sysctls=[{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]
        ),
        True,
    ),
    (
        "service account token volume",
        lambda p: _add_volume(
            p,
            {
                "name": "kube-api-access",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"downwardAPI": {"items": [{"path": "namespace"}]}},
                    ]
                },
            },
        ),
        True,
    ),
    (
        "ephemeral volume, a new claim",
        lambda p: _add_volume(
            p,
            {
                "name": "cache",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "10Gi"}},
                        }
                    }
                },
            },
        ),
        True,
    ),
    (
        "unknown profile",
        lambda p: p["metadata"]["labels"].update({"dhcore/template": "9xh100"}),
        False,
    ),
    (
        "cpu request not the profile's",
        lambda p: _main(p)["resources"]["requests"].update(cpu="4"),
        False,
    ),
    (
        "memory limit 128Gi",
        lambda p: _main(p)["resources"]["limits"].update(memory="128Gi"),
        False,
    ),
    (
        "gpu limit 2, request 1",
        lambda p: _main(p)["resources"]["limits"].update({"nvidia.com/gpu": "2"}),
        False,
    ),
    ("nodeSelector removed", lambda p: p["spec"].pop("nodeSelector"), False),
    ("tolerations removed", lambda p: p["spec"].pop("tolerations"), False),
    ("priority class low", lambda p: p["spec"].update(priorityClassName="low"), False),
    ("priority class urgent", lambda p: p["spec"].update(priorityClassName="urgent"), False),
    ("pod runAsUser 0", lambda p: p["spec"]["securityContext"].update(runAsUser=0), False),
    (
        "pod runAsNonRoot false",
        lambda p: p["spec"]["securityContext"].update(runAsNonRoot=False),
        False,
    ),
    ("privileged", lambda p: _sc(p).update(privileged=True), False),
    ("privilege escalation", lambda p: _sc(p).update(allowPrivilegeEscalation=True), False),
    (
        "add NET_ADMIN",
        lambda p: _sc(p).setdefault("capabilities", {}).update(add=["NET_ADMIN"]),
        False,
    ),
    (
        "add NET_BIND_SERVICE",
        lambda p: _sc(p).setdefault("capabilities", {}).update(add=["NET_BIND_SERVICE"]),
        False,
    ),
    ("drop ALL removed", lambda p: _sc(p).pop("capabilities"), False),
    (
        "seccomp Unconfined",
        lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        False,
    ),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), False),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), False),
    (
        "hostPort",
        lambda p: _main(p).update(ports=[{"containerPort": 8080, "hostPort": 8080}]),
        False,
    ),
    (
        "hostPath volume",
        lambda p: _add_volume(p, {"name": "host", "hostPath": {"path": "/var/run"}}),
        False,
    ),
    (
        "nfs volume",
        lambda p: _add_volume(p, {"name": "nfs", "nfs": {"server": "nas", "path": "/x"}}),
        False,
    ),
    (
        "pre-existing claim",
        lambda p: _add_volume(
            p, {"name": "team", "persistentVolumeClaim": {"claimName": "team-shared"}}
        ),
        False,
    ),
    (
        "another run's claim",
        lambda p: _add_volume(
            p, {"name": "other", "persistentVolumeClaim": {"claimName": "v-r2-data"}}
        ),
        False,
    ),
    (
        "claim template cloning a claim",
        lambda p: _add_volume(
            p,
            {
                "name": "clone",
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {
                            "dataSource": {"kind": "PersistentVolumeClaim", "name": "team"},
                            "resources": {"requests": {"storage": "10Gi"}},
                        }
                    }
                },
            },
        ),
        False,
    ),
    ("foreign secret in env", lambda p: _env(p, _secret_env("aws-creds")), False),
    (
        "envFrom another run's secret",
        lambda p: _main(p).setdefault("envFrom", []).append({"secretRef": {"name": "sec-db-r2"}}),
        False,
    ),
    (
        "foreign secret projected",
        lambda p: _add_volume(
            p, {"name": "creds", "projected": {"sources": [{"secret": {"name": "aws-creds"}}]}}
        ),
        False,
    ),
    (
        "foreign image pull secret",
        lambda p: p["spec"].update(imagePullSecrets=[{"name": "someone-registry"}]),
        False,
    ),
    (
        "foreign configMap volume",
        lambda p: _add_volume(p, {"name": "cfg", "configMap": {"name": "team-config"}}),
        False,
    ),
    (
        "projected foreign configMap",
        lambda p: _add_volume(
            p, {"name": "pcfg", "projected": {"sources": [{"configMap": {"name": "team-config"}}]}}
        ),
        False,
    ),
    (
        "NVIDIA_VISIBLE_DEVICES=all",
        lambda p: _env(p, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}),
        False,
    ),
    (
        "unsafe sysctl",
        lambda p: p["spec"]["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "65536"}]
        ),
        False,
    ),
    (
        "probe to another host",
        lambda p: _main(p).update(
            livenessProbe={"httpGet": {"host": "10.0.0.1", "port": 80, "path": "/"}}
        ),
        False,
    ),
    ("procMount Unmasked", lambda p: _sc(p).update(procMount="Unmasked"), False),
    ("SELinux type spc_t", lambda p: _sc(p).update(seLinuxOptions={"type": "spc_t"}), False),
    (
        "AppArmor annotation unconfined",
        lambda p: p["metadata"]["annotations"].update(
            {"container.apparmor.security.beta.kubernetes.io/c0": "unconfined"}
        ),
        False,
    ),
    ("privileged: false removed", lambda p: _sc(p).pop("privileged"), False),
    (
        "pod runAsNonRoot removed",
        lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"),
        False,
    ),
)

# Edits of a two-container run mutated under the 1xt4 profile (its sidecar sized by defaults).
SIDECAR_VARIANTS: tuple[tuple[str, Edit, bool], ...] = (
    ("1xt4 with a sidecar, as mutated", lambda p: None, True),
    (
        "sidecar cpu request removed",
        lambda p: _sidecar(p)["resources"]["requests"].pop("cpu"),
        False,
    ),
    ("sidecar memory limit removed", lambda p: _sidecar(p)["resources"].pop("limits"), False),
    (
        "sidecar request above its limit",
        lambda p: _sidecar(p)["resources"]["requests"].update(memory="512Mi"),
        False,
    ),
    (
        "init container within the total",
        lambda p: p["spec"].update(
            initContainers=[
                {
                    **copy.deepcopy(_sidecar(p)),
                    "name": "fetch",
                    "resources": {
                        "requests": {"cpu": "2", "memory": "1Gi"},
                        "limits": {"cpu": "2", "memory": "1Gi"},
                    },
                }
            ]
        ),
        True,
    ),
    (
        "sidecar init containers above the run's cpu total",
        lambda p: p["spec"].update(
            initContainers=[
                {
                    **copy.deepcopy(_sidecar(p)),
                    "name": f"proxy{i}",
                    "restartPolicy": "Always",
                    "resources": {
                        "requests": {"cpu": "6", "memory": "256Mi"},
                        "limits": {"cpu": "6", "memory": "282Mi"},
                    },
                }
                for i in range(2)
            ]
        ),
        False,
    ),
)


def cases(policy: Policy) -> list[tuple[str, bytes]]:
    """The shared reviews: (name, AdmissionReview body), CREATE in namespace ``ml``."""
    platform = platform_user(policy)
    alice = "alice"
    typical = mutated(typical_pod(), policy, platform)
    out: list[tuple[str, bytes]] = []
    for name, edit, _ in VARIANTS:
        pod = copy.deepcopy(typical)
        edit(pod)
        out.append((f"typical GPU run: {name}", review(pod, platform)))

    two = bench_engine.gpu_pod(1)
    two["metadata"]["labels"]["dhcore/template"] = "1xt4"
    two["spec"]["containers"].append(
        {"name": "sidecar", "image": "busybox", "command": ["sleep", "infinity"]}
    )
    with_sidecar = mutated(as_sent(two), policy, platform)
    for name, edit, _ in SIDECAR_VARIANTS:
        pod = copy.deepcopy(with_sidecar)
        edit(pod)
        out.append((f"run with sidecar: {name}", review(pod, platform)))

    for template in ("cpu-large", "2xa100", None):
        pod = typical_pod()
        if template is None:
            del pod["metadata"]["labels"]["dhcore/template"]
        else:
            pod["metadata"]["labels"]["dhcore/template"] = template
        out.append(
            (f"profile {template}, mutated", review(mutated(pod, policy, platform), platform))
        )

    # who creates the run: the platform's objects are only the platform's runs'
    out.append(("alice's run, mutated", review(mutated(typical_pod(), policy, alice), alice)))
    out.append(("alice submits the platform's mutated run", review(typical, alice)))
    controller = "system:serviceaccount:kube-system:job-controller"
    owned = copy.deepcopy(typical)
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u1", "controller": True}
    ]
    out.append(("a Job's pod using the run's claim (no cluster state)", review(owned, controller)))

    # as users submit them, without runguard's mutating webhook
    out.append(("typical GPU run as submitted (no /mutate)", review(typical_pod(), platform)))
    out.append(("typical_run_pod as submitted", review(typical_run_pod(), platform)))
    out.append(
        (
            "typical_run_pod, mutated (sidecar: run total above 64Gi)",
            review(mutated(typical_run_pod(), policy, platform), platform),
        )
    )
    out.append(("root pod in kube-system (excluded)", review(typical_pod(), alice, "kube-system")))
    out.append(("pod outside the selector", review(_plain_pod("tool"), alice)))
    copied = _plain_pod("copy-of-run")
    copied["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "sec-db-r1"}}]
    out.append(("a run copied without its labels (kubectl debug --copy-to)", review(copied, alice)))

    # the builds RunPolicy (tried first): Kaniko as root at baseline
    build = mutated(_build_pod(), policy, platform)
    out.append(("build as root, mutated", review(build, platform)))
    privileged = copy.deepcopy(build)
    _sc(privileged).update(privileged=True)
    out.append(("build privileged", review(privileged, platform)))
    foreign = copy.deepcopy(build)
    _env(foreign, _secret_env("aws-creds"))
    out.append(("build with a foreign secret", review(foreign, platform)))
    return out


def throughput_review(policy: Policy) -> bytes:
    """The typical GPU run Pod's /validate review as the apiserver sends it after
    runguard's mutating webhook, by the platform's identity: allowed."""
    user = platform_user(policy)
    return review(mutated(typical_pod(), policy, user), user)


# ------------------------------------------------------------------ servers


def _post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> dict[str, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: HTTP {response.status}: {data[:300]!r}")
    answer: dict[str, Any] = json.loads(data)["response"]
    return answer


def _message(answer: dict[str, Any]) -> str:
    return str((answer.get("status") or {}).get("message", ""))


def _wait_tls(port: int, ca_file: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    context = ssl.create_default_context(cafile=ca_file)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OpaUnavailable(f"opa exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise OpaUnavailable("opa did not answer /health over TLS within 30 s")


def _cpu(pid: int) -> float:
    """CPU seconds of a server: the process and its workers (OPA's threads are in its own)."""
    return bench_http.cpu_seconds([pid, *bench_http.workers_of(pid)])


class OpaSide:
    """runguard's validating webhook and OPA on the same rules, side by side.

    ``start()`` builds OPA (once), starts both servers; ``agreement()`` decides the shared
    reviews with both; ``round(seconds)`` measures each server once (runguard, then OPA);
    ``stop()`` stops them. Raises ``OpaUnavailable`` when OPA cannot be built or started.
    """

    def __init__(
        self, connections: int = CONNECTIONS, server: tuple[Any, int, str] | None = None
    ) -> None:
        """``server``: a runguard already served by ``bench_http.start_server`` with the
        repository's policies, as (process, port, its certs folder), measured instead of
        starting one (and left running by ``stop``); OPA then uses its certificate."""
        self.connections = connections
        self.policy = load_policy(POLICY_DIR)
        self.config = default_config()
        self.body = throughput_review(self.policy)
        self.opa_binary = ""
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._given = server
        self.runguard: subprocess.Popen[bytes] | None = None
        self.opa: subprocess.Popen[bytes] | None = None
        self.runguard_port = self.opa_port = 0
        self.ca_file = ""

    def start(self) -> None:
        self.opa_binary = build_opa()
        self._tmp = tempfile.TemporaryDirectory(prefix="runguard-bench-opa-")
        workdir = Path(self._tmp.name)
        try:
            if self._given is not None:
                self.runguard, self.runguard_port, given_certs = self._given
                certs = Path(given_certs)
            else:
                _, worker_class, workers, threads = self.config
                self.runguard, self.runguard_port = bench_http.start_server(
                    workdir, "gthread", workers, threads, worker_class
                )
                certs = workdir / "certs"
            self.ca_file = str(certs / "ca.crt")
            data = workdir / "data.json"
            data.write_text(json.dumps(opa_data(self.policy), indent=1))
            self.opa_port = bench_http.free_port()
            log = workdir / "opa.log"
            env = {**os.environ, "GOMAXPROCS": "2"}
            self.opa = subprocess.Popen(
                [
                    self.opa_binary,
                    "run",
                    "--server",
                    "--addr",
                    f"127.0.0.1:{self.opa_port}",
                    "--tls-cert-file",
                    str(certs / "tls.crt"),
                    "--tls-private-key-file",
                    str(certs / "tls.key"),
                    "--log-level",
                    "error",
                    "--log-level-request",
                    "error",
                    "--skip-version-check",
                    # the documented setting for speed: data kept as AST, not converted
                    # on every read (docs: policy-performance, storage optimization)
                    "--optimize-store-for-read-speed",
                    "--disable-telemetry",
                    *(str(OPA_DIR / name) for name in REGO_FILES),
                    str(data),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(log, "wb"),  # noqa: SIM115 - kept open for the server's life
            )
            _wait_tls(self.opa_port, self.ca_file, self.opa, log)
            self._check_throughput_review()
        except BaseException:
            self.stop()
            raise

    def _connection(self, port: int) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=self.ca_file)
        return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)

    def _check_throughput_review(self) -> None:
        """Both servers allow the measured review (the figures are of the same work)."""
        for name, port, path in (
            ("runguard", self.runguard_port, "/validate"),
            ("opa", self.opa_port, "/"),
        ):
            conn = self._connection(port)
            try:
                answer = _post(conn, path, self.body)
            finally:
                conn.close()
            if answer.get("allowed") is not True:
                raise RuntimeError(f"{name} denies the measured review: {_message(answer)}")

    def agreement(self) -> dict[str, Any]:
        """Decide every shared review with runguard's engine in-process and OPA over HTTPS."""
        conn = self._connection(self.opa_port)
        rows: list[dict[str, Any]] = []
        try:
            for name, body in cases(self.policy):
                request = admission.parse_review(body)
                outcome = admission.review("validate", request, self.policy)
                mine = outcome.response["response"]
                violations = outcome.decision.violations if outcome.decision else []
                theirs = _post(conn, "/", body)
                their_rules = (theirs.get("auditAnnotations") or {}).get("violations", "")
                rows.append(
                    {
                        "case": name,
                        "runguard": bool(mine["allowed"]),
                        "opa": bool(theirs.get("allowed")),
                        "runguard_rules": sorted({v.rule for v in violations}),
                        "opa_rules": sorted(set(filter(None, their_rules.split(",")))),
                        "runguard_message": str((mine.get("status") or {}).get("message", "")),
                        "opa_message": _message(theirs),
                    }
                )
        finally:
            conn.close()
        agree = sum(row["runguard"] == row["opa"] for row in rows)
        return {
            "agree": agree,
            "total": len(rows),
            # a stronger check than allowed/denied: the same rule ids reported
            "same_rules": sum(row["runguard_rules"] == row["opa_rules"] for row in rows),
            "allowed": sum(row["runguard"] for row in rows),
            "denied": sum(not row["runguard"] for row in rows),
            "rows": rows,
            "disagreements": [row for row in rows if row["runguard"] != row["opa"]],
        }

    def round(self, seconds: float) -> dict[str, float]:
        """One measurement of each server with the same review: runguard, then OPA."""
        assert self.runguard is not None and self.opa is not None
        out: dict[str, float] = {}
        for side, proc, port, path in (
            ("runguard", self.runguard, self.runguard_port, "/validate"),
            ("opa", self.opa, self.opa_port, "/"),
        ):
            before = _cpu(proc.pid)
            result = bench_http.drive(
                port, self.ca_file, path, self.body, self.connections, seconds
            )
            used = _cpu(proc.pid) - before
            out[f"{side}_validate_rps"] = result["rps"]
            out[f"{side}_validate_cpu_us"] = 1e6 * used / max(1, result["requests"])
            out[f"{side}_validate_p50_ms"] = result["p50_ms"]
            out[f"{side}_validate_p99_ms"] = result["p99_ms"]
            out[f"{side}_validate_failed"] = result["failures"]
        return out

    def stop(self) -> None:
        """Stop OPA, and runguard unless it was handed in."""
        mine = (self.opa,) if self._given is not None else (self.runguard, self.opa)
        for proc in mine:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in mine:
            if proc is None:
                continue
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.runguard = self.opa = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


# ------------------------------------------------------------------ report


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _fmt(values: tuple[float, float, float], fmt: str) -> str:
    median, low, high = values
    return f"{median:{fmt}} [{low:{fmt}}-{high:{fmt}}]"


def print_agreement(result: dict[str, Any]) -> None:
    print(
        f"decision agreement on {result['total']} shared reviews "
        f"({result['allowed']} allowed, {result['denied']} denied by runguard): "
        f"{result['agree']}/{result['total']} on allowed/denied, {result['same_rules']}/"
        f"{result['total']} with the same rule ids"
    )
    for row in result["rows"]:
        mark = "  " if row["runguard"] == row["opa"] else "!!"
        verdict = "allowed" if row["runguard"] else "denied"
        rules = ",".join(row["runguard_rules"])
        if row["opa_rules"] != row["runguard_rules"]:
            rules += f" (opa: {','.join(row['opa_rules']) or 'none'})"
        print(f"  {mark} {verdict:8} {row['case']}{': ' + rules if rules else ''}")
    for row in result["disagreements"]:
        print(
            f"DISAGREE {row['case']}: runguard allowed={row['runguard']}, opa allowed={row['opa']}"
        )
        print(f"  runguard: {row['runguard_message'] or '(allowed)'}")
        print(f"  opa:      {row['opa_message'] or '(allowed)'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per server and round")
    parser.add_argument("--connections", type=int, default=CONNECTIONS)
    args = parser.parse_args()
    rounds = max(1, min(args.rounds, 5))
    seconds = max(1.0, min(args.seconds, 20.0))
    connections = max(1, min(args.connections, 64))

    side = OpaSide(connections=connections)
    try:
        side.start()
    except OpaUnavailable as exc:
        print(f"OPA is not available, nothing measured: {exc}", file=sys.stderr)
        return 2
    load_before = load_average()
    results: list[dict[str, float]] = []
    try:
        agreement = side.agreement()
        print_agreement(agreement)
        for _ in range(rounds):
            results.append(side.round(seconds))
    finally:
        side.stop()
    load_after = load_average()

    name = side.config[0]
    print(
        f"\nrunguard /validate ({name}, policies/) vs OPA {_opa_version(side)} "
        f"(GOMAXPROCS=2, bench/opa/*.rego): the typical GPU run Pod's review "
        f"({len(side.body)} bytes, allowed), {connections} keep-alive TLS connections, "
        f"{rounds} interleaved rounds x {seconds:g} s per server, {os.cpu_count()} cpus shared "
        "by servers and load generator"
    )
    print(f"load average before: {load_before}; after: {load_after}")
    print(
        f"{'server':<10}"
        + "".join(f"{title:>22}" for title in ("req/s", "CPU us/req", "p50 ms", "p99 ms"))
        + "  failed"
    )
    figures: dict[str, Any] = {}
    ranges: dict[str, list[float]] = {}
    for server in ("runguard", "opa"):
        row = ""
        for key, fmt in zip(KEYS, (".0f", ".0f", ".2f", ".2f"), strict=True):
            name_key = f"{server}_validate_{key}"
            spread = _spread([r[name_key] for r in results])
            row += f"{_fmt(spread, fmt):>22}"
            figures[name_key] = round(spread[0], 2)
            ranges[name_key] = [round(spread[1], 2), round(spread[2], 2)]
        failed = sum(r[f"{server}_validate_failed"] for r in results)
        print(f"{server:<10}{row}  {failed:.0f}")
    ratio = figures["runguard_validate_cpu_us"] / figures["opa_validate_cpu_us"]
    ratios = [r["runguard_validate_cpu_us"] / r["opa_validate_cpu_us"] for r in results]
    held = ratio <= TARGET_CPU_RATIO
    print(
        f"{'ok  ' if held else 'MISS'} runguard CPU per request {ratio:.2f} x OPA's "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}; target <= {TARGET_CPU_RATIO})"
    )
    summary = {
        **figures,
        "cpu_ratio": round(ratio, 3),
        "config": name,
        "rounds": rounds,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "ranges": ranges,
        "agreement": {
            "agree": agreement["agree"],
            "total": agreement["total"],
            "same_rules": agreement["same_rules"],
            "allowed": agreement["allowed"],
            "denied": agreement["denied"],
            "disagreements": [row["case"] for row in agreement["disagreements"]],
        },
    }
    print(json.dumps(summary, separators=(",", ":")))
    return 0 if not agreement["disagreements"] else 1


def _opa_version(side: OpaSide) -> str:
    match = re.search(r"opa-(v[0-9.]+)", side.opa_binary)
    return match.group(1) if match else "(version unknown)"


if __name__ == "__main__":
    sys.exit(main())
