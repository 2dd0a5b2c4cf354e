"""The Pod Security Standards guarantee (docs/dev/guarantees.md, "Every admitted object"), as
properties on generated Pods.

``upstream_failures`` is an oracle written for this test from the upstream checks, not
from runguard's code: a port of ``k8s.io/pod-security-admission`` v0.36.2 (Kubernetes
1.36) ``policy/check_*.go``, each check at the version the ``latest`` policy evaluates,
with Go's reading of JSON (an absent or null pointer is nil, an absent bool is false, an
absent string is ""). ``UserNamespacesPodSecurityStandards`` is alpha and off by default,
so the checks that it relaxes for ``hostUsers: false`` (runAsNonRoot, runAsUser,
procMount) are ported without the relaxation.

The property: whatever runguard admits as a run, the oracle finds nothing wrong with.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from harness import TESTS
from harness.pod_security import (
    JSON,
    LINUX_ONLY_CONTAINER,
    LINUX_ONLY_POD,
    VOLUME_SOURCES,
    _containers,
    _windows,
    check_sysctls,
    containers,
    run_pods,
    upstream_failures,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.engine import evaluate, mutate, validate
from webhook.engine.rules.pod_security import SAFE_SYSCTLS
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

POLICIES = TESTS / "cases" / "_policies"

# --- the oracle against upstream's own documented examples ---------------------------


def _pod(spec: JSON, annotations: dict[str, str] | None = None) -> JSON:
    meta: JSON = {"name": "p"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


RESTRICTED_OK: JSON = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
}


def test_the_oracle_passes_a_restricted_pod_and_fails_a_bare_one() -> None:
    assert upstream_failures(_pod(RESTRICTED_OK)) == []
    bare = _pod({"containers": [{"name": "c"}]})
    assert upstream_failures(bare) == [
        "allowPrivilegeEscalation",
        "capabilities_restricted",
        "runAsNonRoot",
        "seccompProfile_restricted",
    ]
    assert upstream_failures(bare, "baseline") == []
    windows = _pod({"os": {"name": "windows"}, "containers": [{"name": "c"}]})
    assert upstream_failures(windows) == ["runAsNonRoot"]  # no OS exemption upstream


NAMES = ["platform", "strict", "permissive", "baseline"]


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    """Strip, Deny, a policy looser than the level wherever a key allows it, and the same
    at ``level: baseline``."""
    return {name: load_policy(POLICIES / name) for name in NAMES}


SETTINGS = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FEWER = settings(SETTINGS, max_examples=250)
POLICY_NAMES = st.sampled_from(NAMES)


@SETTINGS
@given(pod=run_pods(), name=POLICY_NAMES)
def test_what_runguard_admits_the_pod_security_admission_admits(
    pod: JSON, name: str, policies: dict[str, Policy]
) -> None:
    policy = policies[name]
    decision = evaluate(pod, policy)
    assert decision.applies
    if decision.allowed:
        failures = upstream_failures(decision.object, policy.first.security.level)
        assert failures == [], decision.object["spec"]


@FEWER
@given(pod=run_pods(ephemeral=False), debug=containers("debugger", "ephemeral"), name=POLICY_NAMES)
def test_a_debug_container_runguard_admits_keeps_the_pod_compliant(
    pod: JSON, debug: JSON, name: str, policies: dict[str, Policy]
) -> None:
    """``kubectl debug``: /mutate then /validate on the UPDATE of pods/ephemeralcontainers."""
    policy = policies[name]
    created = evaluate(pod, policy)
    if not created.allowed:
        return
    running = created.object
    sent = copy.deepcopy(running)
    sent["spec"]["ephemeralContainers"] = [debug]
    patched = mutate(sent, policy, old=running)
    assert patched.allowed
    judged = validate(patched.object, policy, old=running)
    if judged.allowed:
        failures = upstream_failures(patched.object, policy.first.security.level)
        assert failures == [], patched.object["spec"]


# One field at a time, every value, on every kind of container and OS: the combinations
# above find interactions, this finds each single hole for sure.
CONTEXT_VALUES: dict[str, list[Any]] = {
    "runAsUser": [0, 1000],
    "runAsGroup": [0],
    "runAsNonRoot": [True, False],
    "seccompProfile": [{"type": t} for t in ("RuntimeDefault", "Unconfined", "Bogus")]
    + [{"type": "Localhost", "localhostProfile": "p.json"}, {}],
    "appArmorProfile": [{"type": t} for t in ("RuntimeDefault", "Unconfined", "Bogus")]
    + [{"type": "Localhost", "localhostProfile": "p"}],
    "seLinuxOptions": [
        {"type": "spc_t"},
        {"type": "container_engine_t"},
        {"user": "system_u"},
        {"role": "system_r"},
        {"level": "s0:c1"},
        {"type": "container_t", "user": "u", "role": "r", "level": "s0"},
    ],
    "windowsOptions": [{"hostProcess": True}, {"hostProcess": False}],
}
POD_VALUES: dict[str, list[Any]] = {
    **CONTEXT_VALUES,
    "fsGroup": [0],
    "supplementalGroups": [[0], [0, 5]],
    "sysctls": [[{"name": n, "value": "1"}] for n in ("kernel.shm_rmid_forced", "kernel.msgmax")],
}
CONTAINER_VALUES: dict[str, list[Any]] = {
    **CONTEXT_VALUES,
    "privileged": [True, False],
    "allowPrivilegeEscalation": [True, False],
    "procMount": ["Default", "Unmasked"],
    "capabilities": [
        {"add": [cap]} for cap in ("NET_BIND_SERVICE", "CHOWN", "SYS_ADMIN", "NET_RAW")
    ]
    + [{"drop": ["all"]}, {"drop": ["NET_RAW"]}, {"add": ["SYS_ADMIN"], "drop": ["ALL"]}],
}


def single_field_pods() -> Iterator[tuple[str, JSON]]:
    """(what was set, the Pod) for each field and value, on a Pod that is otherwise bare."""

    def base(os_name: str | None) -> JSON:
        pod = _pod({"containers": [{"name": "c0", "image": "python:3.11"}]})
        pod["metadata"].update(
            namespace="ml", labels={"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
        )
        if os_name:
            pod["spec"]["os"] = {"name": os_name}
        return pod

    for os_name in (None, "linux", "windows"):
        for key, values in POD_VALUES.items():
            for value in values:
                pod = base(os_name)
                pod["spec"]["securityContext"] = {key: copy.deepcopy(value)}
                yield f"{os_name} pod {key}={value}", pod
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            pod = base(os_name)
            pod["spec"][key] = True
            yield f"{os_name} {key}", pod
        for kind in sorted(VOLUME_SOURCES):
            pod = base(os_name)
            pod["spec"]["volumes"] = [{"name": "v", kind: dict(VOLUME_SOURCES[kind])}]
            yield f"{os_name} volume {kind}", pod
        for value in ("runtime/default", "localhost/p", "unconfined", ""):
            pod = base(os_name)
            pod["metadata"]["annotations"] = {
                "container.apparmor.security.beta.kubernetes.io/c0": value
            }
            yield f"{os_name} annotation {value!r}", pod
        for list_name, extra in (
            ("containers", {}),
            ("initContainers", {}),
            ("initContainers", {"restartPolicy": "Always"}),
        ):
            fields: list[tuple[str, Any]] = [
                ("securityContext", {key: copy.deepcopy(value)})
                for key, values in CONTAINER_VALUES.items()
                for value in values
            ]
            fields += [("ports", [{"containerPort": 80, "hostPort": p}]) for p in (0, 8080)]
            fields += [
                (probe, {action: {"port": 80, "host": host}})
                for probe in ("livenessProbe", "readinessProbe", "startupProbe")
                for action in ("httpGet", "tcpSocket")
                for host in ("", "10.0.0.1")
            ]
            fields += [
                ("lifecycle", {hook: {"httpGet": {"port": 80, "host": "10.0.0.1"}}})
                for hook in ("postStart", "preStop")
            ]
            for key, value in fields:
                pod = base(os_name)
                container = {"name": "x0", "image": "python:3.11", **extra, key: value}
                pod["spec"].setdefault(list_name, []).append(container)
                yield f"{os_name} {list_name}{extra} {key}={value}", pod


SINGLE_FIELD_PODS = list(single_field_pods())


@pytest.mark.parametrize("name", NAMES)
def test_one_field_at_a_time(name: str, policies: dict[str, Policy]) -> None:
    policy = policies[name]
    admitted = 0
    for what, pod in SINGLE_FIELD_PODS:
        decision = evaluate(pod, policy)
        if decision.allowed:
            admitted += 1
            failures = upstream_failures(decision.object, policy.first.security.level)
            assert failures == [], (what, decision.object["spec"])
    assert admitted > len(SINGLE_FIELD_PODS) // 3  # not vacuous: most are fixed or fine


def linux_only_fields(spec: JSON) -> set[str]:
    """Paths of the fields a Windows Pod may not carry."""
    found = {key for key in ("hostPID", "hostIPC", "hostUsers") if key in spec}
    psc = spec.get("securityContext") or {}
    found |= {f"securityContext.{key}" for key in LINUX_ONLY_POD if key in psc}
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        found |= {f"{c['name']}.{key}" for key in LINUX_ONLY_CONTAINER if key in sc}
    return found


def apiserver_refusals(pod: JSON) -> set[str]:
    """What the apiserver's own validation (k8s.io/kubernetes pkg/apis/core/validation,
    1.33) refuses among the fields runguard writes: Linux-only fields in a Windows Pod
    (validateWindows), ``allowPrivilegeEscalation: false`` beside ``privileged: true`` or
    ``CAP_SYS_ADMIN`` (ValidateSecurityContext), an AppArmor field that disagrees with the
    container's annotation (validateAppArmorAnnotationsAndFieldsMatchOnCreate)."""
    spec = pod["spec"]
    found = linux_only_fields(spec) if _windows(spec) else set()
    annotations = pod["metadata"].get("annotations") or {}
    pod_profile = (spec.get("securityContext") or {}).get("appArmorProfile")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is False:
            adds = (sc.get("capabilities") or {}).get("add") or ()
            if sc.get("privileged") is True or "CAP_SYS_ADMIN" in adds:
                found.add(f"{c['name']}.allowPrivilegeEscalation")
        profile = sc.get("appArmorProfile") or pod_profile
        note = annotations.get(f"container.apparmor.security.beta.kubernetes.io/{c['name']}")
        if profile and note is not None and not _windows(spec):
            kind = profile.get("type")
            agree = (
                (kind == "Unconfined" and note == "unconfined")
                or (kind == "RuntimeDefault" and note == "runtime/default")
                or (kind == "Localhost" and note == f"localhost/{profile.get('localhostProfile')}")
                or kind not in ("Unconfined", "RuntimeDefault", "Localhost")
            )
            if not agree:
                found.add(f"{c['name']}.appArmorProfile")
    return found


@FEWER
@given(pod=run_pods(), name=POLICY_NAMES)
def test_runguard_never_writes_what_the_apiserver_refuses(
    pod: JSON, name: str, policies: dict[str, Policy]
) -> None:
    """A valid Pod stays valid: runguard's patch adds no refusal (which would also hide
    runguard's own message behind the apiserver's)."""
    result = mutate(pod, policies[name]).object
    assert apiserver_refusals(result) <= apiserver_refusals(pod)


@FEWER
@given(pod=run_pods(ephemeral=False), debug=containers("debugger", "ephemeral"), name=POLICY_NAMES)
def test_a_debug_container_is_never_made_invalid(
    pod: JSON, debug: JSON, name: str, policies: dict[str, Policy]
) -> None:
    running = evaluate(pod, policies[name]).object
    sent = copy.deepcopy(running)
    sent["spec"]["ephemeralContainers"] = [debug]
    result = mutate(sent, policies[name], old=running).object
    assert apiserver_refusals(result) <= apiserver_refusals(sent)


@FEWER
@given(pod=run_pods(), name=POLICY_NAMES)
def test_a_windows_pod_gets_only_what_the_apiserver_accepts_for_windows(
    pod: JSON, name: str, policies: dict[str, Policy]
) -> None:
    pod["spec"]["os"] = {"name": "windows"}
    result = mutate(pod, policies[name]).object
    assert linux_only_fields(result["spec"]) <= linux_only_fields(pod["spec"])


# The rules that stand for one upstream check each: runguard denies for them only what
# upstream fails (no stricter reading of the standard than upstream's own).
SAME_AS_UPSTREAM = {
    "security.host-ports": "hostPorts",
    "security.sysctls": "sysctls",
    "security.selinux": "seLinuxOptions",
    "security.apparmor": "appArmorProfile",
    "security.proc-mount": "procMount_restricted",
    "security.probe-host": "hostProbesAndHostLifecycle",
}


@FEWER
@given(pod=run_pods(), name=POLICY_NAMES)
def test_runguard_denies_for_the_standard_only_what_upstream_denies(
    pod: JSON, name: str, policies: dict[str, Policy]
) -> None:
    level = policies[name].first.security.level
    failures = set(upstream_failures(pod, level))
    for violation in validate(pod, policies[name]).violations:
        check = SAME_AS_UPSTREAM.get(violation.rule)
        if check is not None:
            if level == "baseline" and check == "procMount_restricted":
                check = "procMount"  # the same function, by its baseline name
            assert check in failures, (violation, failures)


def test_kubectl_debug_without_a_profile_gets_a_compliant_container(
    policies: dict[str, Policy],
) -> None:
    """The legacy profile sends no securityContext at all; runguard fills it."""
    run = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "run",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"},
        },
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
    }
    for name in ("platform", "strict"):
        policy = policies[name]
        running = evaluate(run, policy).object
        sent = copy.deepcopy(running)
        sent["spec"]["ephemeralContainers"] = [
            {"name": "debugger", "image": "busybox:1.36", "targetContainerName": "main"}
        ]
        patched = mutate(sent, policy, old=running)
        assert [m.rule for m in patched.mutations] == ["security.debug-container"]
        assert {op["path"] for op in patched.patch} == {
            "/spec/ephemeralContainers/0/securityContext"
        }
        assert validate(patched.object, policy, old=running).allowed
        assert upstream_failures(patched.object) == []


def test_the_sysctls_1_37_added_are_safe() -> None:
    """The latest standard (1.37) allows two more sysctls; the e2e generators leave them
    out, since 1.33's and 1.30's PodSecurity still refuse them."""
    for name in ("net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"):
        spec = {"securityContext": {"sysctls": [{"name": name, "value": "1"}]},
                "containers": [{"name": "c", "image": "x"}]}  # fmt: skip
        assert check_sysctls({}, spec), name
        assert name in SAFE_SYSCTLS
