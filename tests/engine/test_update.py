"""Mutation on UPDATE: only ever back to the running spec (kubectl apply of the same
manifest again), never a new change to an immutable Pod spec."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from harness import TESTS

from webhook.engine import mutate, validate
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

POLICY = load_policy(TESTS / "cases" / "_policies" / "platform")
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}


def submitted() -> dict[str, Any]:
    """What the user applies: a disallowed priority class, a mount of a team PVC only."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "labels": dict(RUN)},
        "spec": {
            "priorityClassName": "urgent",
            "containers": [
                {"name": "main", "image": "python:3.11"},
                {
                    "name": "sidecar",
                    "image": "busybox",
                    "volumeMounts": [{"name": "team", "mountPath": "/team"}],
                },
            ],
            "volumes": [{"name": "team", "persistentVolumeClaim": {"claimName": "team-data"}}],
        },
    }


def running_pod() -> dict[str, Any]:
    """The stored Pod: runguard's mutation, then what the apiserver computes at creation."""
    pod = mutate(submitted(), POLICY).object
    pod["spec"]["priority"] = 100000
    pod["spec"]["preemptionPolicy"] = "PreemptLowerPriority"
    return pod


def resent(label: str) -> dict[str, Any]:
    """kubectl apply's three-way merge of the same manifest with one more label."""
    pod = copy.deepcopy(running_pod())
    user = submitted()
    pod["spec"]["priorityClassName"] = user["spec"]["priorityClassName"]
    pod["spec"]["volumes"] = user["spec"]["volumes"]
    pod["spec"]["containers"][1]["volumeMounts"] = user["spec"]["containers"][1]["volumeMounts"]
    pod["metadata"]["labels"]["team"] = label
    return pod


def test_stripped_mounts_leave_no_empty_list() -> None:
    spec = running_pod()["spec"]
    assert "volumes" not in spec
    assert "volumeMounts" not in spec["containers"][1]


def test_changed_priority_class_drops_what_the_apiserver_computes_from_it() -> None:
    pod = submitted()
    pod["spec"]["priority"] = 2000001000
    pod["spec"]["preemptionPolicy"] = "Never"
    spec = mutate(pod, POLICY).object["spec"]
    assert spec["priorityClassName"] == "medium"
    assert "priority" not in spec and "preemptionPolicy" not in spec


def test_reapplying_the_manifest_puts_back_the_running_spec() -> None:
    old, new = running_pod(), resent("vision")
    decision = mutate(new, POLICY, old=old)
    result = jsonpatch.apply_patch(new, decision.patch)
    assert result["spec"] == old["spec"]
    assert result["metadata"]["labels"]["team"] == "vision"
    assert [c.rule for c in decision.mutations] == ["update.spec-kept"]
    assert validate(result, POLICY, old=old).allowed


def test_a_policy_change_is_never_forced_onto_a_running_pod() -> None:
    """The default profile now asks for 2 cpus: a running pod cannot take them, so an
    update (a label) is let through unpatched rather than refused by the apiserver."""
    default = POLICY.first.profiles["default"]
    bigger = default.model_copy(update={"requests": {**default.requests, "cpu": "2"}})
    edited = Policy.of(
        POLICY.first.model_copy(update={"profiles": {**POLICY.first.profiles, "default": bigger}})
    )
    old = running_pod()
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "vision"
    assert mutate(new, edited).patch != []  # what a new pod would get
    decision = mutate(new, edited, old=old)
    assert decision.patch == [] and decision.mutations == []


def test_a_metadata_only_update_needs_no_patch() -> None:
    old = running_pod()
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"note": "x"}
    assert mutate(new, POLICY, old=old).patch == []


def test_a_failing_step_is_an_engine_error_not_bad_input(monkeypatch: Any) -> None:
    """A bug in a step denies the run (fail closed) as ``engine.error`` and hands the
    exception to the caller to log; it is never blamed on the input."""
    from webhook.engine import rules

    def broken(pod: Any) -> None:
        raise KeyError("injected")

    monkeypatch.setattr(rules, "MUTATION_STEPS", (*rules.MUTATION_STEPS, broken))
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {"metadata": {"labels": dict(RUN)}, "spec": submitted()["spec"]}},
    }
    for fn, obj in ((mutate, submitted()), (validate, job)):
        decision = fn(obj, POLICY)
        assert decision.allowed is False
        assert [v.rule for v in decision.violations] == ["engine.error"]
        assert isinstance(decision.error, KeyError)
        assert "input.invalid" not in decision.audit_annotations.get("violations", "")


def test_a_run_cannot_leave_the_selector_or_change_its_identity_labels() -> None:
    """scope.labels: the selector's labels, the profile label and the labels the name
    patterns use are frozen on a running run; other labels stay editable."""
    old = running_pod()
    for key, value in (
        ("app.kubernetes.io/managed-by", None),  # leaves the selector
        ("dhcore/run", "r2"),  # another run's volumes and secrets
        ("dhcore/template", "1xa100"),  # a profile it was not admitted with
    ):
        new = copy.deepcopy(old)
        labels = new["metadata"]["labels"]
        if value is None:
            labels.pop(key)
        else:
            labels[key] = value
        decision = validate(new, POLICY, old=old)
        assert decision.allowed is False, key
        assert [v.rule for v in decision.violations] == ["scope.labels"], decision.message()
        assert key in decision.violations[0].path
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "vision"
    assert validate(new, POLICY, old=old).allowed


def test_a_resize_never_lets_a_value_above_the_maximum_grow() -> None:
    """pods/resize: a value already above the maximum (admitted under an older policy)
    may stay or shrink, never grow; a new excess is denied."""
    old = running_pod()
    old["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "20"}, "requests": {"cpu": "20"}}
    for cpu, allowed in (("20", True), ("18", True), ("24", False)):
        new = copy.deepcopy(old)
        new["spec"]["containers"][0]["resources"] = {
            "limits": {"cpu": cpu},
            "requests": {"cpu": cpu},
        }
        assert validate(new, POLICY, old=old).allowed is allowed, cpu
    new = copy.deepcopy(running_pod())
    new["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "32"}, "requests": {"cpu": "32"}}
    decision = validate(new, POLICY, old=running_pod())
    assert not decision.allowed
    # above the maximum, and away from the exact cpu its profile gave it
    assert {v.rule for v in decision.violations} == {"resources.exceeded", "resources.grown"}
