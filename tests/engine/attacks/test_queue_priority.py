"""A run's Kueue priority class, bounded like its ``priorityClassName``.

An attack review found two ways to a higher Kueue priority: a user with ``edit``
relabelling a queued Job's ``kueue.x-k8s.io/priority-class``, and a project admin's
profile naming a Kueue priority class the RunPolicy never allowed (only
``priorityClassName`` was bounded). The RunPolicy now names the classes
(``scheduling.workloadPriorityClasses``): a profile naming another is refused (lint, the
policy objects' check, the engine), a run naming one is refused
(``queue.priority-class``), and a queued run's class is frozen like its queue label
(``queue.bypassed``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from harness import write, written_policy
from harness.cluster_state import State
from harness.profiles import PROFILES, RUN_POLICY, cluster, project_profile, run
from harness.shipped import ALICE, CORE, rules
from harness.templates import QUEUED, queue_policy, run_job

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context
from webhook.engine.rules.profile import PROFILE_PROJECT_INVALID
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

PRIORITY = "kueue.x-k8s.io/priority-class"
BOUNDED = RUN_POLICY.replace(
    "priorityClasses: {allowed: [low, high]}",
    "priorityClasses: {allowed: [low, high]}\n        workloadPriorityClasses: [research]",
)


def bounded_queue_policy() -> Any:
    """The shipped RunPolicy with the queue profile queued-a100 (Kueue class research),
    allowing the Kueue classes research and batch."""
    run = queue_policy().first
    scheduling = run.scheduling.model_copy(
        update={"workload_priority_classes": frozenset({"research", "batch"})}
    )
    return Policy.of(run.model_copy(update={"scheduling": scheduling}))


def queued_job(policy: Any) -> dict[str, Any]:
    decision = evaluate(run_job(QUEUED), policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    return decision.object


def relabelled(policy: Any, stored: dict[str, Any], value: str, who: Any) -> Any:
    new = copy.deepcopy(stored)
    new["metadata"]["labels"][PRIORITY] = value
    context = Context(who, State([]), "UPDATE")
    patched = mutate(new, policy, namespace="ml", old=stored, context=context).object
    return validate(patched, policy, namespace="ml", old=stored, context=context)


def test_a_user_relabelling_a_queued_runs_kueue_priority_class_is_refused() -> None:
    policy = bounded_queue_policy()
    stored = queued_job(policy)
    assert stored["metadata"]["labels"][PRIORITY] == "research"
    judged = relabelled(policy, stored, "batch", ALICE)  # an allowed class, still not hers
    assert not judged.allowed
    assert [v.path for v in judged.violations] == [f"metadata.labels[{PRIORITY}]"]
    assert "queue.bypassed" in rules(judged)


def test_the_platform_may_change_a_queued_runs_kueue_priority_class() -> None:
    policy = bounded_queue_policy()
    stored = queued_job(policy)
    assert relabelled(policy, stored, "batch", CORE).allowed
    outside = relabelled(policy, stored, "urgent", CORE)
    assert rules(outside) == {"queue.priority-class"}


def test_a_run_naming_a_kueue_priority_class_not_allowed_is_refused() -> None:
    policy = bounded_queue_policy()
    job = run_job()  # no queue profile: the user writes her own queue and class
    job["metadata"]["labels"].update({"kueue.x-k8s.io/queue-name": "team-a", PRIORITY: "urgent"})
    decision = evaluate(job, policy, namespace="ml", context=Context(ALICE, State([])))
    assert rules(decision) == {"queue.priority-class"}
    job["metadata"]["labels"][PRIORITY] = "batch"
    assert evaluate(job, policy, namespace="ml", context=Context(ALICE, State([]))).allowed


@pytest.fixture
def bounded(tmp_path: Path) -> Policy:
    return written_policy(tmp_path, {"runpolicy.yaml": BOUNDED, "profiles.yaml": PROFILES})


def queue_run(name: str) -> dict[str, Any]:
    return run("team-a", name)


def test_a_project_profile_naming_a_kueue_class_not_allowed_is_not_applied(
    bounded: Policy,
) -> None:
    urgent = project_profile(
        "team-a", "urgent-queue", queue={"name": "team-a", "priorityClass": "urgent"}
    )
    research = project_profile(
        "team-a", "research-queue", queue={"name": "team-a", "priorityClass": "research"}
    )
    context = cluster(urgent, research)
    refused = evaluate(queue_run("urgent-queue"), bounded, namespace="team-a", context=context)
    assert PROFILE_PROJECT_INVALID in rules(refused)
    assert "not an allowed Kueue priority class (research)" in refused.message()
    legal = evaluate(queue_run("research-queue"), bounded, namespace="team-a", context=context)
    assert legal.allowed, legal.message()
    assert legal.object["metadata"]["labels"][PRIORITY] == "research"


def test_an_installation_profile_naming_a_kueue_class_not_allowed_does_not_load(
    tmp_path: Path,
) -> None:
    write(tmp_path, "runpolicy.yaml", BOUNDED)
    write(tmp_path, "profiles.yaml", PROFILES)
    write(
        tmp_path,
        "queue.yaml",
        "{apiVersion: runguard.io/v1, kind: Profile, metadata: {name: q},\n"
        " spec: {queue: {name: team-a, priorityClass: urgent}}}\n",
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path)
    assert any(
        "spec.queue.priorityClass" in str(e) and "not an allowed Kueue priority class" in str(e)
        for e in caught.value.errors
    ), caught.value.errors
