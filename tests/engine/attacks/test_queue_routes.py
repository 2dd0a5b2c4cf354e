"""A run leaving its queue through a route other than its own labels.

The attack review's chains: a CronJob's ``jobTemplate`` whose queue label and
``suspend: true`` are patched out after creation, so the Job the cronjob-controller
makes was taken as "queued through its owner" (a CronJob, which no queue holds); a
RayJob unqueued on UPDATE (its run labels live in its templates); a RayJob that skipped
``/mutate`` admitted unqueued; a Deployment's Pods believed queued as a whole. The
queue's records are now frozen on every kind carrying a template, "queued through its
owner" is believed only for an owner a queue holds whole that is itself queued and
recorded (on its stored object), and the backstop covers the operators' templates."""

from __future__ import annotations

import copy
from typing import Any

from harness.cluster_state import Meta, State, owner
from harness.shipped import ALICE, CORE, JOBS, pod, rules
from harness.templates import CRONJOBS, KUEUE, QUEUE, QUEUED, cronjob, queue_policy, rayjob, run_job

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import POLICY_LABEL

GATE = "kueue.x-k8s.io/admission"


def stored(obj: dict[str, Any], who: Requester = CORE, state: State | None = None) -> Any:
    context = Context(who, state or State([]))
    decision = evaluate(obj, queue_policy(), namespace="ml", context=context)
    assert decision.allowed, decision.message()
    return decision.object


def updated(new: Any, old: Any, who: Requester, state: State | None = None) -> Any:
    context = Context(who, state or State([]), "UPDATE")
    policy = queue_policy()
    patched = mutate(new, policy, namespace="ml", old=old, context=context).object
    return validate(patched, policy, namespace="ml", old=old, context=context)


def queued_cronjob() -> dict[str, Any]:
    cron = cronjob()
    cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"] = dict(QUEUED)
    return stored(cron)


# --- a CronJob ------------------------------------------------------------------------


def test_a_cronjobs_queue_label_and_suspend_are_frozen() -> None:
    cron = queued_cronjob()
    out = copy.deepcopy(cron)
    out["spec"]["jobTemplate"]["metadata"]["labels"].pop(QUEUE)
    out["spec"]["jobTemplate"]["spec"]["suspend"] = False
    judged = updated(out, cron, ALICE)
    assert not judged.allowed
    assert {v.path for v in judged.violations if v.rule == "queue.bypassed"} == {
        f"spec.jobTemplate.metadata.labels[{QUEUE}]",
        "spec.jobTemplate.spec.suspend",
    }


def test_a_user_suspends_and_resumes_her_own_cronjob() -> None:
    cron = queued_cronjob()
    paused = copy.deepcopy(cron)
    paused["spec"]["suspend"] = True
    judged = updated(paused, cron, ALICE)
    assert judged.allowed, judged.message()
    assert updated(copy.deepcopy(cron), paused, ALICE).allowed


def job_of(cron: dict[str, Any]) -> dict[str, Any]:
    """The Job the cronjob-controller makes from the stored CronJob's job template."""
    template = copy.deepcopy(cron["spec"]["jobTemplate"])
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "nightly-1", "namespace": "ml", "uid": "uid-nightly-1",
                         "labels": template.get("metadata", {}).get("labels", {}),
                         "ownerReferences": [owner("CronJob", "nightly", "uid-cron")]},
            "spec": template["spec"]}  # fmt: skip


def cron_state(cron: dict[str, Any]) -> State:
    meta = cron["metadata"]
    return State([Meta("CronJob", "ml", "nightly", "uid-cron", meta.get("labels", {}),
                       meta.get("annotations", {}))])  # fmt: skip


def test_a_job_of_a_cronjob_that_left_its_queue_is_queued_itself() -> None:
    """Had the CronJob's job template lost its queue label and suspend (before they were
    frozen, or by the platform), the Job the cronjob-controller makes is still queued: a
    CronJob is not what a queue holds, its Jobs are."""
    cron = queued_cronjob()
    cron["spec"]["jobTemplate"]["metadata"]["labels"].pop(QUEUE)
    cron["spec"]["jobTemplate"]["spec"].pop("suspend")
    job = stored(job_of(cron), CRONJOBS, cron_state(cron))
    assert job["metadata"]["labels"][QUEUE] == "team-a"
    assert job["spec"]["suspend"] is True


def test_a_cronjob_firing_makes_a_queued_job() -> None:
    cron = queued_cronjob()
    job = stored(job_of(cron), CRONJOBS, cron_state(cron))
    assert job["metadata"]["labels"][QUEUE] == "team-a" and job["spec"]["suspend"] is True
    nothing = mutate(job, queue_policy(), namespace="ml",
                     context=Context(CRONJOBS, cron_state(cron)))  # fmt: skip
    assert not [op for op in nothing.patch or () if op["path"].startswith("/spec")]


# --- a Job's Pods, through their owner --------------------------------------------------


def job_pod(job: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(job["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "r1-abc", "namespace": "ml",
                         "labels": template["metadata"].get("labels", {}),
                         "ownerReferences": [owner("Job", "r1", "uid-r1")]},
            "spec": template["spec"]}  # fmt: skip


def job_meta(job: dict[str, Any]) -> Meta:
    return Meta("Job", "ml", "r1", "uid-r1", job["metadata"]["labels"], {})


def test_a_pod_of_a_queued_recorded_job_is_not_queued_again() -> None:
    job = stored(run_job(QUEUED))
    made = stored(job_pod(job), JOBS, State([job_meta(job)]))
    assert QUEUE not in made["metadata"]["labels"]
    assert GATE not in [g["name"] for g in made["spec"].get("schedulingGates", [])]


def test_a_pod_of_an_unqueued_job_is_queued_itself() -> None:
    """The job-controller's Pod of a Job that carries no queue label (or no runguard
    record) is not believed queued through it: it is queued and gated itself."""
    job = stored(run_job(QUEUED))
    unqueued = {k: v for k, v in job["metadata"]["labels"].items() if k != QUEUE}
    for labels in (unqueued, {k: v for k, v in job["metadata"]["labels"].items()
                              if k != POLICY_LABEL}):  # fmt: skip
        state = State([Meta("Job", "ml", "r1", "uid-r1", labels, {})])
        made = stored(job_pod(job), JOBS, state)
        assert made["metadata"]["labels"][QUEUE] == "team-a"
        assert {"name": GATE} in made["spec"]["schedulingGates"]


def test_a_queue_profiles_bare_pod_is_gated_by_runguard() -> None:
    made = stored(pod(labels=QUEUED))
    assert {"name": GATE} in made["spec"]["schedulingGates"]
    again = mutate(made, queue_policy(), namespace="ml", context=Context(CORE, State([])))
    assert not again.patch


def test_a_deployments_pods_are_queued_and_gated() -> None:
    """The replicaset-controller's Pods were believed queued as a whole through their
    ReplicaSet, a kind no queue holds: they ran with the profile's GPU and no queue."""
    rs = Meta("ReplicaSet", "ml", "web-1", "uid-rs", {}, {})
    made = pod(labels=QUEUED)
    made["metadata"]["ownerReferences"] = [owner("ReplicaSet", "web-1", "uid-rs")]
    replicasets = Requester("system:serviceaccount:kube-system:replicaset-controller")
    out = stored(made, replicasets, State([rs]))
    assert out["metadata"]["labels"][QUEUE] == "team-a"
    assert {"name": GATE} in out["spec"]["schedulingGates"]


# --- a RayJob ---------------------------------------------------------------------------


def test_a_rayjob_cannot_be_unqueued_by_its_user() -> None:
    ray = stored(rayjob(QUEUED), ALICE)  # her own RayJob: no platform record to go by
    assert ray["metadata"]["labels"][QUEUE] == "team-a" and ray["spec"]["suspend"] is True
    out = copy.deepcopy(ray)
    out["metadata"]["labels"].pop(QUEUE)
    out["spec"]["suspend"] = False
    judged = updated(out, ray, ALICE)
    assert not judged.allowed
    assert {v.path for v in judged.violations if v.rule == "queue.bypassed"} >= {
        f"metadata.labels[{QUEUE}]",
        "spec.suspend",
    }


def test_kueue_starts_a_rayjob() -> None:
    ray = stored(rayjob(QUEUED))
    started = copy.deepcopy(ray)
    started["spec"]["suspend"] = False
    judged = updated(started, ray, KUEUE)
    assert judged.allowed, judged.message()


def test_a_rayjob_that_skipped_mutate_unqueued_is_refused() -> None:
    ray = stored(rayjob(QUEUED), ALICE)  # her records, as /mutate writes them for her
    ray["metadata"]["labels"].pop(QUEUE)
    ray["spec"].pop("suspend")
    judged = validate(ray, queue_policy(), namespace="ml", context=Context(ALICE, State([])))
    assert not judged.allowed
    assert "profile.applied" in rules(judged)


def deployment(labels: dict[str, str], kind: str = "Deployment") -> dict[str, Any]:
    template = copy.deepcopy(run_job(labels)["spec"]["template"])
    template["spec"].pop("restartPolicy", None)
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": "web", "namespace": "ml", "labels": dict(labels)},
            "spec": {"selector": {"matchLabels": {"dhcore/run": "r1"}},
                     "template": template}}  # fmt: skip


def test_a_deployment_of_a_queue_profile_without_its_queue_is_refused_at_apply() -> None:
    context = Context(ALICE, State([]))
    refused = evaluate(deployment(QUEUED), queue_policy(), namespace="ml", context=context)
    assert rules(refused) == {"queue.kind"}
    assert "add it, or run the work as a Job" in refused.message()
    named = evaluate(deployment({**QUEUED, QUEUE: "team-a"}), queue_policy(), namespace="ml",
                     context=context)  # fmt: skip
    assert named.allowed, named.message()  # Kueue's pod integration holds its Pods
    daemons = evaluate(deployment({**QUEUED, QUEUE: "team-a"}, "DaemonSet"), queue_policy(),
                       namespace="ml", context=context)  # fmt: skip
    assert rules(daemons) == {"queue.kind"}
