"""``webhook/engine/rules/pod_security.py`` on its own: the step-5 fixes
``confine_apparmor``, ``confine_selinux`` and ``default_proc_mount``, and
``check_pod_security``, on a ``Pod`` built directly. The guarantee on generated Pods
against upstream's checks is ``tests/engine/test_pod_security.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness.pods import container, pod_of, policy_of

from webhook.engine.rules.pod_security import (
    APPARMOR_ANNOTATION,
    SECURITY_APPARMOR,
    SECURITY_HOST_PORTS,
    SECURITY_PRIVILEGED,
    SECURITY_PROBE_HOST,
    SECURITY_PROC_MOUNT,
    SECURITY_SELINUX,
    SECURITY_SYSCTLS,
    check_pod_security,
    confine_apparmor,
    confine_selinux,
    default_proc_mount,
)
from webhook.policy.model import Policy

UNCONFINED = {"appArmorProfile": {"type": "Unconfined"}}
SELINUX = {"seLinuxOptions": {"user": "system_u", "role": "r", "type": "spc_t", "level": "s0"}}


def policy(tmp_path: Path, on_root: str = "Strip") -> Policy:
    return policy_of(tmp_path, {"security": {"level": "baseline", "onRoot": on_root}})


def with_context(pod_sc: dict[str, Any] | None, sc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(securityContext=sc)]}
    if pod_sc is not None:
        spec["securityContext"] = pod_sc
    return spec


def test_apparmor_unconfined_becomes_runtime_default(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), with_context(dict(UNCONFINED), dict(UNCONFINED)))
    assert [v.rule for v in check_pod_security(run)] == [SECURITY_APPARMOR, SECURITY_APPARMOR]
    change = confine_apparmor(run)
    assert change is not None and change.rule == SECURITY_APPARMOR
    default = {"appArmorProfile": {"type": "RuntimeDefault"}}
    assert run.spec == with_context(default, default)
    assert check_pod_security(run) == []
    assert confine_apparmor(run) is None


def test_apparmor_is_not_fixed_beside_an_unconfined_annotation(tmp_path: Path) -> None:
    key = f"{APPARMOR_ANNOTATION}main"
    spec = with_context(None, dict(UNCONFINED))
    run = pod_of(policy(tmp_path), spec, annotations={key: "unconfined"})
    assert confine_apparmor(run) is None
    assert run.spec == spec
    assert (SECURITY_APPARMOR, f"metadata.annotations[{key}]") in [
        (v.rule, v.path) for v in check_pod_security(run)
    ]


def test_selinux_user_role_and_unlisted_type_are_removed_level_kept(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), with_context(None, SELINUX))
    at = "spec.containers[0].securityContext.seLinuxOptions"
    assert {(v.rule, v.path) for v in check_pod_security(run)} == {
        (SECURITY_SELINUX, f"{at}.type"),
        (SECURITY_SELINUX, f"{at}.user"),
        (SECURITY_SELINUX, f"{at}.role"),
    }
    change = confine_selinux(run)
    assert change is not None and change.rule == SECURITY_SELINUX
    assert run.spec == with_context(None, {"seLinuxOptions": {"level": "s0"}})
    assert check_pod_security(run) == []


def test_proc_mount_unmasked_becomes_default(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), with_context(None, {"procMount": "Unmasked"}))
    assert [(v.rule, v.path) for v in check_pod_security(run)] == [
        (SECURITY_PROC_MOUNT, "spec.containers[0].securityContext.procMount")
    ]
    change = default_proc_mount(run)
    assert change is not None and change.rule == SECURITY_PROC_MOUNT
    assert run.spec == with_context(None, {"procMount": "Default"})


def test_a_confined_pod_is_left_alone(tmp_path: Path) -> None:
    sc = {
        "appArmorProfile": {"type": "Localhost", "localhostProfile": "p"},
        "seLinuxOptions": {"type": "container_t", "level": "s0"},
        "procMount": "Default",
    }
    spec = with_context(None, sc)
    run = pod_of(policy(tmp_path), spec)
    for step in (confine_apparmor, confine_selinux, default_proc_mount):
        assert step(run) is None
    assert run.spec == spec
    assert check_pod_security(run) == []


@pytest.mark.parametrize("windows", [False, True])
def test_without_strip_or_in_a_windows_pod_nothing_is_fixed(tmp_path: Path, windows: bool) -> None:
    spec = with_context(dict(UNCONFINED), {**UNCONFINED, **SELINUX, "procMount": "Unmasked"})
    if windows:
        spec["os"] = {"name": "windows"}
    run = pod_of(policy(tmp_path, "Strip" if windows else "Deny"), spec)
    for step in (confine_apparmor, confine_selinux, default_proc_mount):
        assert step(run) is None
    assert run.spec == spec


def test_what_changes_the_workload_is_denied_not_fixed(tmp_path: Path) -> None:
    spec = {
        "securityContext": {
            "sysctls": [
                {"name": "kernel.msgmax", "value": "1"},
                {"name": "net.ipv4.tcp_syncookies", "value": "1"},
            ]
        },
        "containers": [
            container(
                ports=[{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}],
                livenessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}},
                lifecycle={"preStop": {"tcpSocket": {"host": "db", "port": 5432}}},
                securityContext={"windowsOptions": {"hostProcess": True}},
            )
        ],
    }
    at = "spec.containers[0]"
    assert [(v.rule, v.path) for v in check_pod_security(pod_of(policy(tmp_path), spec))] == [
        (SECURITY_SYSCTLS, "spec.securityContext.sysctls[0].name"),
        (SECURITY_PRIVILEGED, f"{at}.securityContext.windowsOptions.hostProcess"),
        (SECURITY_HOST_PORTS, f"{at}.ports[0].hostPort"),
        (SECURITY_PROBE_HOST, f"{at}.livenessProbe.httpGet.host"),
        (SECURITY_PROBE_HOST, f"{at}.lifecycle.preStop.tcpSocket.host"),
    ]


def test_a_debug_containers_violation_says_how_to_debug(tmp_path: Path) -> None:
    debug = container("debugger", securityContext={"procMount": "Unmasked"})
    run = pod_of(policy(tmp_path), {"containers": [container()], "ephemeralContainers": [debug]})
    [violation] = check_pod_security(run)
    assert violation.path == "spec.ephemeralContainers[0].securityContext.procMount"
    assert violation.message.endswith("kubectl debug --profile=restricted")
