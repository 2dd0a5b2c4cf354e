"""``webhook/engine/rules/security.py`` on its own: ``strip_root`` (step 5) and
``check_security`` on a ``Pod`` built directly, each sub-step by what it changes or names.
The end-to-end behaviour (webhooks, Pod Security fixtures) is tested elsewhere; here each
function is held to its contract with nothing else of the engine around it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from harness import write

from webhook.engine.pod import Pod
from webhook.engine.rules.pod_security import SECURITY_PRIVILEGED
from webhook.engine.rules.security import (
    SECURITY_CAPABILITIES,
    SECURITY_DEFAULTS,
    SECURITY_HOST_NAMESPACE,
    SECURITY_ROOT,
    SECURITY_SECCOMP,
    check_security,
    strip_root,
)
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

RUN_POLICY = """\
    apiVersion: runguard.io/v1
    kind: RunPolicy
    metadata: {{name: sec}}
    spec:
      selector: {{matchLabels: {{app: run}}}}
      security: {{level: {level}, onRoot: {on_root}, runAsUser: 8877}}
    """


def policy(tmp_path: Path, *, level: str = "restricted", on_root: str = "Strip") -> Policy:
    write(tmp_path, "runpolicy.yaml", RUN_POLICY.format(level=level, on_root=on_root))
    return load_policy(tmp_path)


def pod(policy: Policy, spec: dict[str, Any]) -> Pod:
    return Pod(copy.deepcopy(spec), {"app": "run"}, {}, policy.first)


ROOTFUL = {
    "securityContext": {"runAsUser": 0, "supplementalGroups": [0, 5], "runAsNonRoot": False},
    "containers": [
        {
            "name": "main",
            "image": "python:3.12",
            "securityContext": {
                "runAsUser": 0,
                "privileged": True,
                "allowPrivilegeEscalation": True,
                "seccompProfile": {"type": "Unconfined"},
                "capabilities": {"add": ["SYS_ADMIN", "NET_BIND_SERVICE"]},
            },
        }
    ],
}


def test_strip_root_fixes_every_root_setting_and_says_each(tmp_path: Path) -> None:
    run = pod(policy(tmp_path), ROOTFUL)
    change = strip_root(run)
    assert change is not None and change.rule == SECURITY_ROOT
    psc = run.spec["securityContext"]
    assert psc["runAsUser"] == 8877 and psc["runAsNonRoot"] is True
    assert psc["supplementalGroups"] == [5]
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = run.spec["containers"][0]["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["capabilities"] == {"drop": ["ALL"]}  # none the policy allows is kept
    assert "runAsUser" not in sc or sc["runAsUser"] != 0
    # the first three in order, then the count of the rest (kubectl shows one line)
    assert change.warning == (
        "runguard: root and privileges stripped: pod runAsUser 0, pod supplementalGroups 0, "
        "runAsNonRoot false (+5 more)"
    )
    assert check_security(run) == []  # nothing left for the check
    assert strip_root(run) is None  # a fixed point


def test_strip_root_fills_only_what_is_missing_when_nothing_is_root(tmp_path: Path) -> None:
    plain = {"containers": [{"name": "main", "image": "python:3.12"}]}
    run = pod(policy(tmp_path), plain)
    change = strip_root(run)
    assert change is not None and change.rule == SECURITY_DEFAULTS
    assert run.spec["securityContext"] == {  # no uid assigned unless assignRunAsUser
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert run.spec["containers"][0]["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_with_on_root_deny_nothing_is_stripped_and_the_check_names_each(
    tmp_path: Path,
) -> None:
    run = pod(policy(tmp_path, on_root="Deny"), ROOTFUL)
    strip_root(run)  # fills what is missing, fixes nothing explicit
    assert run.spec["containers"][0]["securityContext"]["privileged"] is True
    found = {(v.rule, v.path) for v in check_security(run)}
    at = "spec.containers[0].securityContext"
    assert found >= {
        (SECURITY_ROOT, "spec.securityContext.runAsUser"),
        (SECURITY_ROOT, "spec.securityContext.supplementalGroups"),
        (SECURITY_ROOT, "spec.securityContext.runAsNonRoot"),
        (SECURITY_ROOT, f"{at}.runAsUser"),
        (SECURITY_PRIVILEGED, f"{at}.privileged"),
        (SECURITY_PRIVILEGED, f"{at}.allowPrivilegeEscalation"),
        (SECURITY_CAPABILITIES, f"{at}.capabilities.add"),
        (SECURITY_SECCOMP, f"{at}.seccompProfile.type"),
    }


@pytest.mark.parametrize("key", ["hostNetwork", "hostPID", "hostIPC"])
def test_a_host_namespace_is_named_by_its_key(tmp_path: Path, key: str) -> None:
    spec = {key: True, "containers": [{"name": "main", "image": "python:3.12"}]}
    run = pod(policy(tmp_path), spec)
    strip_root(run)
    assert [(v.rule, v.path) for v in check_security(run)] == [
        (SECURITY_HOST_NAMESPACE, f"spec.{key}")
    ]


def test_restricted_asks_what_baseline_does_not(tmp_path: Path) -> None:
    bare = {"containers": [{"name": "main", "image": "python:3.12"}]}
    at = "spec.containers[0].securityContext"
    restricted = {(v.rule, v.path) for v in check_security(pod(policy(tmp_path), bare))}
    assert restricted == {
        (SECURITY_ROOT, f"{at}.runAsNonRoot"),
        (SECURITY_PRIVILEGED, f"{at}.allowPrivilegeEscalation"),
        (SECURITY_CAPABILITIES, f"{at}.capabilities.drop"),
        (SECURITY_SECCOMP, f"{at}.seccompProfile"),
    }
    (tmp_path / "b").mkdir()
    baseline = policy(tmp_path / "b", level="baseline")
    assert check_security(pod(baseline, bare)) == []


def test_on_root_allow_keeps_root_and_its_check_says_nothing_of_it(tmp_path: Path) -> None:
    build = policy(tmp_path, level="baseline", on_root="Allow")
    spec = {"securityContext": {"runAsUser": 0},
            "containers": [{"name": "kaniko", "image": "kaniko:1"}]}  # fmt: skip
    run = pod(build, spec)
    strip_root(run)
    assert run.spec["securityContext"]["runAsUser"] == 0
    assert [v for v in check_security(run) if v.rule == SECURITY_ROOT] == []
