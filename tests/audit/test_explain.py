"""``runguard explain``: the RunPolicy and profile that governed a run, each change the
engine made with its rule id and what the rule is for, what was refused, and the
profiles the run's namespace may use (their ranges), as text and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.team_policies import CONTEXT, NAMESPACES, TEAM_A_ONLY, policy_dir

from webhook.audit.explain import explain, to_text
from webhook.cli import main
from webhook.cli.explain import _submitted
from webhook.clusterstate.model import LAST_APPLIED
from webhook.engine import evaluate
from webhook.engine.registry import RULES
from webhook.engine.rules.profile import PROFILE_APPLIED, PROFILE_NOT_ALLOWED, PROFILE_RANGE
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, RunPolicy


def run(ns: str, profile: str | None, memory: str = "", kind: str = "Pod") -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "dhcore"}
    if profile:
        labels["dhcore/template"] = profile
    container: dict[str, Any] = {"name": "main", "image": "python:3.12"}
    if memory:
        container["resources"] = {"requests": {"memory": memory}}
    spec = {"containers": [container]}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "train", "namespace": ns},
                "spec": {"template": {"metadata": {"labels": labels}, "spec": spec}}}  # fmt: skip
    metadata = {"name": "train", "namespace": ns, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(policy_dir(tmp_path / "p", selector=TEAM_A_ONLY))


def test_a_clamped_run_says_each_change_and_why(policy: Policy) -> None:
    e = explain(run("team-a", "small", "64Gi"), policy, context=CONTEXT)
    decision = evaluate(run("team-a", "small", "64Gi"), policy, context=CONTEXT)
    assert (e.allowed, e.run_policy, e.profile, e.profile_asked, e.asked_by) == (
        True, "runs", "small", "small", "label"
    )  # fmt: skip
    assert list(e.changes) == decision.mutations  # the engine's own, not derived again
    rules = [c.rule for c in e.changes]
    assert PROFILE_RANGE in rules
    out = e.to_dict()
    clamp = next(c for c in out["changes"] if c["rule"] == PROFILE_RANGE)
    assert "memory request 64Gi -> 16Gi" in clamp["warning"]
    assert clamp["why"] == RULES[PROFILE_RANGE].mutation
    assert {"op": "replace", "path": "/spec/containers/0/resources/requests/memory",
            "value": "16Gi"} in out["patch"]  # fmt: skip


def test_the_profiles_a_namespace_may_use_with_their_ranges(policy: Policy) -> None:
    a = explain(run("team-a", "small"), policy, context=CONTEXT).to_dict()["profiles"]
    b = explain(run("team-b", "small"), policy, context=CONTEXT).to_dict()["profiles"]
    assert [(p["name"], p["usable"]) for p in a] == [("a100", True), ("small", True)]
    assert [(p["name"], p["usable"]) for p in b] == [("a100", False), ("small", True)]
    small = b[1]
    assert small["requests"] == {"cpu": "1..4 (default 2)", "memory": "1Gi..16Gi (default 4Gi)"}
    assert small["scope"] == "every namespace"
    assert b[0]["scope"] == "namespaces labelled team=a"
    assert b[0]["requests"] == {"cpu": "8", "memory": "32Gi", "gpu": "1"}


def test_a_refused_profile_is_explained_with_what_to_pick_instead(policy: Policy) -> None:
    e = explain(run("team-b", "a100"), policy, context=CONTEXT)
    assert not e.allowed and e.profile is None and e.profile_asked == "a100"
    assert [v.rule for v in e.violations] == [PROFILE_NOT_ALLOWED]
    text = to_text(e)
    assert text.splitlines()[0] == "Pod team-b/train: DENIED"
    assert "profile:    a100 (named by the label dhcore/template), not applied" in text
    assert "[profile.not-allowed]" in text
    table = text[text.index("profiles namespace team-b may use") :].splitlines()
    assert table[1].split()[:4] == ["NAME", "CPU", "MEMORY", "GPU"]
    assert table[2].split()[:3] == ["small", "1..4", "(default"]
    assert table[3] == "  kept to other namespaces: a100"


def test_without_a_cluster_view_the_kept_profiles_are_unknown(policy: Policy) -> None:
    e = explain(run("team-b", None), policy)
    assert (e.profile, e.asked_by) == ("small", "default")
    assert [(c.name, c.usable) for c in e.choices] == [("a100", None), ("small", True)]
    assert "the RunPolicy's default (the run names none)" in to_text(e)
    assert "give --cluster-state with it): a100" in to_text(e)


def test_a_job_is_explained_by_its_template(policy: Policy) -> None:
    e = explain(run("team-a", "small", "64Gi", kind="Job"), policy, context=CONTEXT)
    assert (e.kind, e.profile) == ("Job", "small")
    # the records, and the profile written into the template (where a queue counts it),
    # with the record of the size it gave
    assert all(
        op["path"].startswith(("/metadata", "/spec/template/spec/", "/spec/template/metadata"))
        for op in e.patch
    )
    assert any(op["path"].startswith("/spec/template/spec/containers") for op in e.patch)
    assert {PROFILE_APPLIED, PROFILE_RANGE} <= {c.rule for c in e.changes}


def test_an_object_no_runpolicy_governs(policy: Policy) -> None:
    web = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "x"},
           "spec": {"containers": [{"name": "web", "image": "nginx"}]}}  # fmt: skip
    e = explain(web, policy)
    assert not e.applies and e.run_policy is None and e.choices == ()
    assert to_text(e) == "Pod x/web: not a run any RunPolicy governs, untouched"


def test_the_command_offline(
    tmp_path: Path, policy: RunPolicy, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, state = tmp_path / "run.yaml", tmp_path / "state.yaml"
    manifest.write_text(yaml.safe_dump(run("team-b", "a100")))
    state.write_text(yaml.safe_dump_all(NAMESPACES))
    args = ["explain", "-p", str(tmp_path / "p"), "--cluster-state", str(state), str(manifest)]
    assert main([*args, "-o", "json"]) == 1
    [out] = json.loads(capsys.readouterr().out)
    assert out["runPolicy"] == "runs" and out["profile"]["asked"] == "a100"
    assert [p["name"] for p in out["profiles"] if p["usable"]] == ["small"]
    manifest.write_text(yaml.safe_dump(run("team-a", "a100")))
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("Pod team-a/train: allowed\n")
    assert main(["explain", "-p", str(tmp_path / "p"), "--kubeconfig", "k", str(manifest)]) == 2


def test_a_stored_pod_is_explained_by_what_kubectl_applied(policy: Policy) -> None:
    sent = run("team-a", "small", "64Gi")
    pod = evaluate(sent, policy, context=CONTEXT).object
    pod["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(sent)
    judged, what, notes = _submitted(None, pod, "team-a")
    assert judged == sent and "last-applied-configuration" in what and notes == []
    del pod["metadata"]["annotations"][LAST_APPLIED]
    judged, what, notes = _submitted(None, pod, "team-a")
    assert judged is pod and what == "Pod train as stored"
    assert "already carries runguard's changes" in notes[0]
    e = explain(judged, policy, context=CONTEXT, judged=what, notes=tuple(notes))
    assert e.profile == "small" and PROFILE_RANGE not in {c.rule for c in e.changes}
