"""Time is part of a profile (``rules/runtime.py``): a profile's ``runTime`` default and
maximum land in ``activeDeadlineSeconds`` (a Pod's, a Job's pod template's), the smaller
of the run's and the maximum; removing or raising it is refused; a project's profile is
bounded by the RunPolicy's ``runTime.maximum``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from harness import write
from harness.profiles import PROFILES, RUN_POLICY, cluster, project_profile, run
from harness.run_time import TIMED, queued_job, queued_policy

from webhook.engine import evaluate, mutate, validate
from webhook.engine.rules.profile import PROFILE_PROJECT_INVALID
from webhook.engine.rules.runtime import MAX_EXEC_TIME
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    write(tmp_path, "runpolicy.yaml", RUN_POLICY.rstrip(" ") + "      runTime: {maximum: 86400}\n")
    write(tmp_path, "profiles.yaml", PROFILES)
    write(tmp_path, "timed.yaml", TIMED)
    return load_policy(tmp_path)


def deadline(decision: Any) -> Any:
    assert decision.error is None, decision.message()
    return decision.object["spec"].get("activeDeadlineSeconds")


def test_a_run_gets_the_default_and_never_more_than_the_maximum(policy: Policy) -> None:
    assert deadline(evaluate(run("team-b", "notebook"), policy, namespace="team-b")) == 3600
    assert deadline(evaluate(run("team-b", "capped"), policy, namespace="team-b")) == 7200
    asked = run("team-b", "notebook")
    asked["spec"]["activeDeadlineSeconds"] = 600  # shorter: the user's
    assert deadline(evaluate(asked, policy, namespace="team-b")) == 600
    asked["spec"]["activeDeadlineSeconds"] = 10**6
    decision = evaluate(asked, policy, namespace="team-b")
    assert decision.allowed and deadline(decision) == 28800
    assert "runguard: run time lowered: activeDeadlineSeconds 1000000 -> 28800 (max)" in (
        decision.warnings
    )
    # A profile without a run time leaves it alone.
    assert deadline(evaluate(run("team-b", "small"), policy, namespace="team-b")) is None


def timed_job(kind: str = "Job") -> dict[str, Any]:
    pod = run("team-b", "notebook")
    labels = pod["metadata"]["labels"]
    template = {"metadata": {"labels": labels}, "spec": {**pod["spec"], "restartPolicy": "Never"}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train", "namespace": "team-b", "labels": labels},
           "spec": {"backoffLimit": 6, "template": template}}  # fmt: skip
    if kind == "Job":
        return job
    job_template = {"metadata": {"labels": labels}, "spec": job["spec"]}
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": job["metadata"],
            "spec": {"schedule": "0 * * * *", "jobTemplate": job_template}}  # fmt: skip


def test_a_job_template_gets_it_too_and_the_job_its_maximum(policy: Policy) -> None:
    """Each Pod gets the default; the Job as a whole (its retries) the maximum."""
    decision = mutate(timed_job(), policy, namespace="team-b")
    assert decision.object["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 3600
    assert decision.object["spec"]["activeDeadlineSeconds"] == 28800
    assert "runguard: the Job's run time set: spec.activeDeadlineSeconds 28800" in (
        decision.warnings
    )
    cron = mutate(timed_job("CronJob"), policy, namespace="team-b").object
    assert cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 28800
    shorter = timed_job()
    shorter["spec"]["activeDeadlineSeconds"] = 600  # the user's own, shorter: kept
    assert (
        mutate(shorter, policy, namespace="team-b").object["spec"]["activeDeadlineSeconds"] == 600
    )
    longer = timed_job()
    longer["spec"]["activeDeadlineSeconds"] = 10**6
    lowered = mutate(longer, policy, namespace="team-b")
    assert lowered.object["spec"]["activeDeadlineSeconds"] == 28800
    assert "runguard: the Job's run time set: spec.activeDeadlineSeconds 1000000 -> 28800 " \
        "(max)" in lowered.warnings  # fmt: skip


def test_a_jobs_run_time_removed_raised_or_skipped_is_refused(policy: Policy) -> None:
    admitted = evaluate(timed_job(), policy, namespace="team-b")
    assert admitted.allowed, admitted.message()
    skipped = validate(timed_job(), policy, namespace="team-b")
    assert not skipped.allowed
    assert "the Job's activeDeadlineSeconds must be set to at most that" in skipped.message()
    for value in (None, 10**6):
        changed = copy.deepcopy(admitted.object)
        if value is None:
            del changed["spec"]["activeDeadlineSeconds"]
        else:
            changed["spec"]["activeDeadlineSeconds"] = value
        decision = validate(changed, policy, namespace="team-b", old=admitted.object)
        assert not decision.allowed
        assert "profile notebook gives runs at most 28800 seconds" in decision.message()
    lowered = copy.deepcopy(admitted.object)
    lowered["spec"]["activeDeadlineSeconds"] = 60
    assert validate(lowered, policy, namespace="team-b", old=admitted.object).allowed


def test_a_pod_that_skipped_mutate_and_an_update_raising_or_removing_it_are_refused(
    policy: Policy,
) -> None:
    admitted = evaluate(run("team-b", "notebook"), policy, namespace="team-b").object
    skipped = validate(run("team-b", "notebook"), policy, namespace="team-b")
    assert not skipped.allowed and "profile.run-time" in {v.rule for v in skipped.violations}
    raised = copy.deepcopy(admitted)
    raised["spec"]["activeDeadlineSeconds"] = 10**6
    decision = validate(raised, policy, namespace="team-b", old=admitted)
    assert not decision.allowed
    assert "activeDeadlineSeconds 1000000 is above profile notebook's maximum run time 28800" in (
        decision.message()
    )
    removed = copy.deepcopy(admitted)
    del removed["spec"]["activeDeadlineSeconds"]
    decision = validate(removed, policy, namespace="team-b", old=admitted)
    assert not decision.allowed and "must be set (at most 28800 seconds), not removed" in (
        decision.message()
    )
    lowered = copy.deepcopy(admitted)
    lowered["spec"]["activeDeadlineSeconds"] = 60
    assert validate(lowered, policy, namespace="team-b", old=admitted).allowed


def test_a_project_profile_above_the_run_policys_maximum_is_not_applied(policy: Policy) -> None:
    context = cluster(project_profile("team-a", "forever", runTime={"maximum": 10**7}))
    decision = evaluate(run("team-a", "forever"), policy, namespace="team-a", context=context)
    assert not decision.allowed
    (violation,) = [v for v in decision.violations if v.rule == PROFILE_PROJECT_INVALID]
    assert "runTime.maximum" in violation.message
    assert "10000000 seconds is above the RunPolicy's maximum 86400" in violation.message
    within = cluster(project_profile("team-a", "day", runTime={"maximum": 86400}))
    assert evaluate(run("team-a", "day"), policy, namespace="team-a", context=within).allowed


# --- queued runs: Kueue's maximum execution time ---------------------------------------


def test_a_queued_run_carries_kueues_maximum_execution_time(tmp_path: Path) -> None:
    p = queued_policy(tmp_path)
    decision = mutate(queued_job(), p, namespace="ml")
    assert decision.error is None, decision.message()
    job = decision.object
    assert job["metadata"]["labels"][MAX_EXEC_TIME] == "28800"
    assert job["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 3600


def test_removing_or_raising_kueues_maximum_execution_time_is_refused(tmp_path: Path) -> None:
    p = queued_policy(tmp_path)
    admitted = mutate(queued_job(), p, namespace="ml").object
    for value in (None, "999999"):
        changed = copy.deepcopy(admitted)
        if value is None:
            del changed["metadata"]["labels"][MAX_EXEC_TIME]
        else:
            changed["metadata"]["labels"][MAX_EXEC_TIME] = value
        decision = validate(changed, p, namespace="ml", old=admitted)
        assert not decision.allowed
        assert "profile.run-time" in {v.rule for v in decision.violations}
        assert f"{MAX_EXEC_TIME} was 28800" in decision.message()
    lowered = copy.deepcopy(admitted)
    lowered["metadata"]["labels"][MAX_EXEC_TIME] = "600"
    assert "profile.run-time" not in {
        v.rule for v in validate(lowered, p, namespace="ml", old=admitted).violations
    }
