"""Which namespaces may use an installation-wide profile (``namespaceSelector``), and
rule ``profile.not-allowed``: the Namespace's labels come from the cluster view, and a
run whose Namespace the view lacks is refused (fail closed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import write

from webhook.clusterstate import StaticClusterState
from webhook.engine import evaluate, mutate
from webhook.engine.context import Context
from webhook.engine.rules.profile import PROFILE_NOT_ALLOWED
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

RUN_POLICY = """\
    apiVersion: runguard.io/v1
    kind: RunPolicy
    metadata: {name: access}
    spec:
      selector: {matchLabels: {app.kubernetes.io/managed-by: dhcore}}
      profiles: {label: dhcore/template, default: DEFAULT, unknown: Deny}
      resources: {maximums: {cpu: "16", memory: 64Gi, gpu: "2"}}
      security: {runAsUser: 8877}
    """
PROFILES = """\
    apiVersion: runguard.io/v1
    kind: Profile
    metadata: {name: small}
    spec:
      resources: {requests: {cpu: "1", memory: 2Gi}}
    ---
    apiVersion: runguard.io/v1
    kind: Profile
    metadata: {name: a100}
    spec:
      namespaceSelector: {matchLabels: {example.com/team: a}}
      resources: {requests: {cpu: "8", memory: 32Gi, gpu: "1"}}
      nodeSelector: {nvidia.com/gpu.product: A100}
    ---
    apiVersion: runguard.io/v1
    kind: Profile
    metadata: {name: by-name}
    spec:
      namespaceSelector:
        matchExpressions:
          - {key: kubernetes.io/metadata.name, operator: In, values: [team-a, team-c]}
      nodeSelector: {pool: by-name}
    """


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/metadata.name": name, **labels},
        },
    }


CLUSTER = Context(
    state=StaticClusterState.from_documents(
        [namespace("team-a", **{"example.com/team": "a"}), namespace("team-b")]
    )
)


def policy(tmp_path: Path, default: str = "small") -> Policy:
    write(tmp_path, "runpolicy.yaml", RUN_POLICY.replace("DEFAULT", default))
    write(tmp_path, "profiles.yaml", PROFILES)
    return load_policy(tmp_path)


def run(ns: str, profile: str | None) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "dhcore"}
    if profile is not None:
        labels["dhcore/template"] = profile
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "python:3.12"}]},
    }


def refused(policy: Policy, ns: str, profile: str | None, context: Context) -> list[str]:
    """The messages of ``profile.not-allowed`` for a run in ``ns`` (denied: one at least)."""
    decision = evaluate(run(ns, profile), policy, namespace=ns, context=context)
    mine = [v for v in decision.violations if v.rule == PROFILE_NOT_ALLOWED]
    assert decision.allowed == (not mine)
    assert {v.path for v in mine} <= {"metadata.labels[dhcore/template]"}
    return [v.message for v in mine]


@pytest.mark.parametrize(("ns", "profile"), [("team-a", "a100"), ("team-a", "by-name")])
def test_a_namespace_the_selector_picks_uses_the_profile(
    tmp_path: Path, ns: str, profile: str
) -> None:
    decision = evaluate(run(ns, profile), policy(tmp_path), namespace=ns, context=CLUSTER)
    assert decision.allowed and decision.violations == []
    assert decision.profile == profile
    want = {"a100": {"nvidia.com/gpu.product": "A100"}, "by-name": {"pool": "by-name"}}
    assert decision.object["spec"]["nodeSelector"] == want[profile]


def test_another_namespace_is_refused_with_the_profiles_it_may_use(tmp_path: Path) -> None:
    assert refused(policy(tmp_path), "team-b", "a100", CLUSTER) == [
        "profile 'a100' is not for namespace 'team-b' (it may use: small)"
    ]


def test_a_refused_profile_is_not_applied(tmp_path: Path) -> None:
    decision = mutate(run("team-b", "a100"), policy(tmp_path), namespace="team-b", context=CLUSTER)
    assert "nodeSelector" not in decision.object["spec"]
    assert [c.rule for c in decision.mutations if c.rule.startswith("profile.")] == []


def test_a_profile_without_selector_is_for_every_namespace(tmp_path: Path) -> None:
    for context in (CLUSTER, Context()):  # with or without a cluster view
        decision = evaluate(
            run("team-b", "small"), policy(tmp_path), namespace="team-b", context=context
        )
        assert decision.allowed, decision.violations
        assert decision.object["spec"]["containers"][0]["resources"]["requests"] == {
            "cpu": "1",
            "memory": "2Gi",
        }


@pytest.mark.parametrize(
    "context",
    [Context(), Context(state=StaticClusterState.from_documents([namespace("team-a")]))],
    ids=["no cluster view", "namespace absent"],
)
def test_an_unknown_namespace_fails_closed(tmp_path: Path, context: Context) -> None:
    assert refused(policy(tmp_path), "team-c", "by-name", context) == [
        "profile 'by-name' is kept to some namespaces, and the cluster state holds no "
        "Namespace 'team-c' to tell (it may use: small)"
    ]


def test_the_default_profile_is_refused_too(tmp_path: Path) -> None:
    assert refused(policy(tmp_path, default="a100"), "team-b", None, CLUSTER) == [
        "profile 'a100' is not for namespace 'team-b' (it may use: small)"
    ]


def test_audit_judges_a_run_by_its_namespace_as_admission_did(tmp_path: Path) -> None:
    """``runguard audit`` reads the Namespaces beside the runs: a run the webhook admitted
    with a profile kept to its namespace is no failure, one elsewhere is; without the
    view every such run fails closed."""
    from webhook.audit.clusteraudit import judge

    shipped = policy(tmp_path)
    admitted = [
        evaluate(run(ns, "a100"), shipped, namespace=ns, context=CLUSTER).object
        for ns in ("team-a", "team-b")
    ]
    found = {f.namespace: [v.rule for v in f.violations] for f in judge(admitted, shipped, CLUSTER)}
    assert found["team-a"] == []
    assert PROFILE_NOT_ALLOWED in found["team-b"]
    blind = {f.namespace: [v.rule for v in f.violations] for f in judge(admitted, shipped)}
    assert PROFILE_NOT_ALLOWED in blind["team-a"]
