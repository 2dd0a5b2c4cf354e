"""Run templates under the shipped policies: Jobs and CronJobs of a run, a RayJob, and a
RunPolicy that queues them (``QUEUE``, ``QUEUED``) through Kueue (``KUEUE``)."""

from __future__ import annotations

import copy
from typing import Any

from webhook.engine.context import Requester
from webhook.policy.model import Policy, Profile

from .shipped import RUN, SHIPPED, pod

GPU = {**RUN, "dhcore/template": "1xa100"}

CRONJOBS = Requester("system:serviceaccount:kube-system:cronjob-controller")


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


QUEUE = "kueue.x-k8s.io/queue-name"


def queue_policy() -> Any:
    """The shipped RunPolicy with a queue profile: A100 resources, placed by team-a's queue."""
    run = SHIPPED.named("digitalhub")
    assert run is not None
    a100 = run.profiles["1xa100"]
    queued = Profile.model_validate(
        {
            "name": "queued-a100",
            "resources": {
                "requests": dict(a100.resources.requests),
                "limits": dict(a100.resources.limits),
            },
            "runtimeClassName": "nvidia",
            "env": [dict(v) for v in a100.env],
            "queue": {"name": "team-a", "priorityClass": "research"},
        }  # fmt: skip
    )
    return Policy.of(run.model_copy(update={"profiles": {**run.profiles, "queued-a100": queued}}))


QUEUED = {**RUN, "dhcore/template": "queued-a100"}


def rayjob(labels: dict[str, str]) -> dict[str, Any]:
    """A RayJob whose head, worker and submitter templates are a run's (its own metadata
    carries no run label: the templates are what KubeRay makes the Pods from)."""
    template = run_job(labels)["spec"]["template"]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "r1", "namespace": "ml", "uid": "uid-rayjob"},
            "spec": {"entrypoint": "python main.py", "submissionMode": "K8sJobMode",
                     "submitterPodTemplate": copy.deepcopy(template),
                     "rayClusterSpec": {
                         "headGroupSpec": {"rayStartParams": {},
                                           "template": copy.deepcopy(template)},
                         "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2,
                                               "template": copy.deepcopy(template)}]}}}  # fmt: skip


KUEUE = Requester(
    "system:serviceaccount:kueue-system:kueue-controller-manager",
    ("system:serviceaccounts", "system:serviceaccounts:kueue-system", "system:authenticated"),
)
