"""Several RunPolicies (docs/policy-reference.md): a Pod is judged by the first, by name, whose
selector matches it; one for runs and a laxer one for the platform's image builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import TESTS

from webhook.engine import evaluate, mutate, validate
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policy

PLATFORM = (TESTS / "cases" / "_policies" / "platform" / "policy.yaml").read_text()
BUILDS = """\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {name: builds}
spec:
  selector:
    matchLabels: {app.kubernetes.io/managed-by: dhcore, app.kubernetes.io/component: build}
  enforcement: Warn
"""


def pod(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", **labels},
        },
        "spec": {"hostNetwork": True, "containers": [{"name": "main", "image": "kaniko"}]},
    }


def test_the_first_run_policy_by_name_whose_selector_matches_judges(tmp_path: Path) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "builds.yaml").write_text(BUILDS)
    policy = load_policy(tmp_path)
    assert [p.name for p in policy.run_policies] == ["builds", "platform"]

    build = validate(pod(**{"app.kubernetes.io/component": "build"}), policy)
    assert build.allowed and build.enforcement == "Warn"  # the builds policy only warns
    assert "security.host-namespace" in {v.rule for v in build.violations}

    run = validate(pod(), policy)  # not a build: the platform policy, which denies
    assert not run.allowed and run.enforcement == "Deny"

    # the builds policy has no profiles default or priority classes: nothing applied
    mutated = mutate(pod(**{"app.kubernetes.io/component": "build"}), policy)
    assert "priorityClassName" not in mutated.object["spec"]
    assert evaluate(pod(), policy).object["spec"]["priorityClassName"] == "medium"


BUILD_POLICY = """\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {name: builds}
spec:
  selector:
    matchLabels: {app.kubernetes.io/managed-by: dhcore, dhcore/framework: k8sbuild}
  security: {level: baseline, onRoot: Allow, seccompProfile: null, dropCapabilities: []}
"""


def test_a_build_may_run_as_root_but_stays_within_baseline(tmp_path: Path) -> None:
    """onRoot: Allow (level baseline): Kaniko's root is left alone, privilege is not."""
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "builds.yaml").write_text(BUILD_POLICY)
    policy = load_policy(tmp_path)
    build = pod(**{"dhcore/framework": "k8sbuild"})
    del build["spec"]["hostNetwork"]
    build["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    decision = evaluate(build, policy)
    assert decision.allowed, decision.message()
    assert decision.object["spec"] == build["spec"]  # nothing hardened, root kept
    build["spec"]["containers"][0]["securityContext"]["privileged"] = True
    denied = evaluate(build, policy)
    assert not denied.allowed
    assert "security.privileged" in {v.rule for v in denied.violations}


def test_allow_root_needs_level_baseline(tmp_path: Path) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "builds.yaml").write_text(BUILD_POLICY.replace("level: baseline, ", ""))
    with pytest.raises(PolicyError, match="onRoot: Allow needs security.level: baseline"):
        load_policy(tmp_path)
