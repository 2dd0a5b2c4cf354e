"""Profiles applied where capacity is decided: the pod template of a run Job, of a CronJob's
job template (and of the operators' kinds, through the templates each operator entry
declares) carries the profile once it is stored, since a queue (Kueue) counts a run by its
template before any Pod exists. Mutated at CREATE only, idempotent, and a fixed point: the
Pods made from such a template get no further change, and are still judged.
"""

from __future__ import annotations

import copy
from typing import Any

from test_ownership import Meta, State, owner
from test_trust import ALICE, CORE, JOBS, RUN, SHIPPED, created, pod, update

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester

GPU = {**RUN, "dhcore/template": "1xa100"}
CRONJOBS = Requester("system:serviceaccount:kube-system:cronjob-controller")
# What the profile 1xa100 (policies/profiles.yaml) writes into the main container and spec.
A100_RESOURCES = {
    "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
    "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
}


def run_job(labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The Core's run Job naming a GPU profile, with the user's own (small) resources."""
    spec = pod()["spec"]
    spec["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "r1", "namespace": "ml", "uid": "uid-r1",
                         "labels": dict(labels or GPU)},
            "spec": {"template": {"metadata": {"labels": dict(labels or GPU)},
                                  "spec": spec}}}  # fmt: skip


def cronjob() -> dict[str, Any]:
    job = run_job()
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "ml", "uid": "uid-cron",
                         "labels": dict(GPU)},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": job["spec"]}}}  # fmt: skip


def spec_ops(decision: Any) -> list[dict[str, Any]]:
    """The patch's operations on the object's spec (runguard's records are metadata)."""
    return [op for op in decision.patch or () if op["path"].startswith("/spec")]


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    """The Pod the job-controller makes from the stored Job's template (its own labels too)."""
    template = copy.deepcopy(job["spec"]["template"])
    labels = {**template["metadata"].get("labels", {}),
              "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
              "batch.kubernetes.io/job-name": job["metadata"]["name"]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{job['metadata']['name']}-", "namespace": "ml",
                         "labels": labels,
                         "annotations": template["metadata"].get("annotations", {}),
                         "ownerReferences": [owner("Job", job["metadata"]["name"],
                                                   job["metadata"]["uid"])]},
            "spec": template["spec"]}  # fmt: skip


def state_of(*objects: dict[str, Any]) -> State:
    return State(Meta(o["kind"], "ml", o["metadata"]["name"], o["metadata"]["uid"],
                      o["metadata"].get("labels", {}), o["metadata"].get("annotations", {}))
                 for o in objects)  # fmt: skip


def test_a_run_jobs_template_is_stored_with_the_profile() -> None:
    stored = created(run_job(), CORE)
    spec = stored["spec"]["template"]["spec"]
    main = spec["containers"][0]
    assert main["resources"] == A100_RESOURCES
    assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"} in main["env"]
    assert spec["runtimeClassName"] == "nvidia" and spec["priorityClassName"] == "high"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        spec["tolerations"]
    )
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_templates_mutation_is_idempotent() -> None:
    stored = created(run_job(), CORE)
    again = mutate(stored, SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert spec_ops(again) == [] and again.object == stored
    judged = validate(stored, SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert judged.allowed and judged.warnings == [], judged.warnings


def test_an_update_leaves_the_template_as_sent() -> None:
    """No spurious rollout: an update of the stored Job changes nothing in its template,
    and one of a Job stored before (its template as the user wrote it) is not mutated
    either, only judged."""
    stored = created(run_job(), CORE)
    unsuspended = copy.deepcopy(stored)
    unsuspended["spec"]["suspend"] = False
    mutation, validation = update(unsuspended, stored, CORE)
    assert mutation.patch == [] and validation.allowed, validation.message()
    written = mutate(run_job(), SHIPPED, namespace="ml", context=Context(CORE, State([])))
    as_before = copy.deepcopy(run_job())
    as_before["metadata"] = written.object["metadata"]  # recorded, template untouched
    changed = copy.deepcopy(as_before)
    changed["metadata"]["labels"]["extra"] = "yes"
    mutation, validation = update(changed, as_before, CORE)
    assert spec_ops(mutation) == [], mutation.patch
    assert validation.allowed and any("kept as written" in w for w in validation.warnings)


def test_a_pod_from_a_mutated_template_gets_no_further_change() -> None:
    stored = created(run_job(), CORE)
    child = pod_of(stored)
    context = Context(JOBS, state_of(stored))
    mutation = mutate(child, SHIPPED, namespace="ml", context=context)
    assert spec_ops(mutation) == [], mutation.patch
    assert mutation.object["spec"] == stored["spec"]["template"]["spec"]
    validation = validate(mutation.object, SHIPPED, namespace="ml", context=context)
    assert validation.allowed and validation.profile == "1xa100", validation.message()


def test_a_pod_from_a_mutated_template_is_still_judged() -> None:
    """The fixed point is not a pass: the same Pod with a privileged container is denied
    (stripped by /mutate, refused by the backstop when /mutate is bypassed)."""
    stored = created(run_job(), CORE)
    child = pod_of(stored)
    child["spec"]["containers"][0]["securityContext"]["privileged"] = True
    context = Context(JOBS, state_of(stored))
    assert spec_ops(mutate(child, SHIPPED, namespace="ml", context=context))
    assert not validate(child, SHIPPED, namespace="ml", context=context).allowed


def test_a_cronjobs_job_template_and_its_jobs_and_pods() -> None:
    stored = created(cronjob(), CORE)
    template = stored["spec"]["jobTemplate"]["spec"]["template"]
    assert template["spec"]["containers"][0]["resources"] == A100_RESOURCES
    # the cronjob-controller's Job copies the job template: nothing left to change
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "nightly-1", "namespace": "ml", "uid": "uid-n1",
                        "labels": dict(GPU),
                        "ownerReferences": [owner("CronJob", "nightly", "uid-cron")]},
           "spec": copy.deepcopy(stored["spec"]["jobTemplate"]["spec"])}  # fmt: skip
    context = Context(CRONJOBS, state_of(stored))
    mutation = mutate(job, SHIPPED, namespace="ml", context=context)
    assert spec_ops(mutation) == [], mutation.patch
    job = mutation.object
    assert validate(job, SHIPPED, namespace="ml", context=context).allowed
    child = pod_of(job)
    pod_mutation = mutate(child, SHIPPED, namespace="ml", context=Context(JOBS, state_of(job)))
    assert spec_ops(pod_mutation) == [], pod_mutation.patch


def test_a_users_job_gets_the_profile_in_its_template_too() -> None:
    """The profile is not the platform's privilege: a user's run Job is counted as it runs."""
    decision = evaluate(run_job(), SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    main = decision.object["spec"]["template"]["spec"]["containers"][0]
    assert main["resources"] == A100_RESOURCES


def test_a_deployments_template_is_kept_as_written_and_its_pods_get_the_profile() -> None:
    """Deployments (and StatefulSets, ReplicaSets...) are left to their Pods."""
    job = run_job()
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "serve", "namespace": "ml", "uid": "uid-d"},
                  "spec": {"selector": {"matchLabels": {"app": "serve"}},
                           "template": job["spec"]["template"]}}  # fmt: skip
    decision = evaluate(deployment, SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed and spec_ops(decision) == [], decision.patch
    assert decision.object["spec"]["template"] == job["spec"]["template"]
