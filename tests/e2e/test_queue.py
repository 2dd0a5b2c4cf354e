"""Kueue beside the platform through the real apiserver, with the shipped policies.

The platform creates its run Job suspended and naming its queue; Kueue, as its own
ServiceAccount (``system:serviceaccount:kueue-system:kueue-controller-manager``),
starts it the way its ``jobframework`` does: one update of the Job that unsuspends it,
merges the flavor's node labels into the template's ``nodeSelector``, appends the
flavor's toleration and labels the template with its podset. The job-controller then
creates the Pod on the flavor's node. A user with edit rights cannot do the same.
The same update shapes, built from Kueue's source, are judged in ``tests/engine/test_queue.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .cluster import Cluster
from .runs import platform_identity, rule_ids, until
from .test_trust import (
    NODE_KEY,
    RUN,
    TAINT,
    WAIT,
    container,
    get,
    platform_made,
    run_pods,
    shipped,
    space,
    user,
    wait_pods,
)

pytestmark = pytest.mark.e2e

__all__ = ["shipped", "space"]  # the fixtures, shared with test_trust.py

KUEUE_ACCOUNT = ("kueue-system", "kueue-controller-manager")  # its chart's default
QUEUE = "kueue.x-k8s.io/queue-name"
# A ResourceFlavor for this module's node: its node label and the toleration of its taint.
FLAVOR = {"nodeLabels": {NODE_KEY: "trust"}, "tolerations": [{**TAINT, "operator": "Equal"}]}


def queued_job(name: str) -> dict[str, Any]:
    running = {"pod-complete.stage.kwok.x-k8s.io/delay": "300s"}  # kwok: no completion yet
    template = {"metadata": {"labels": {**RUN, "app": name}, "annotations": running},
                "spec": {"restartPolicy": "Never", "containers": [container()]}}  # fmt: skip
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {**RUN, QUEUE: "team-a"}},
            "spec": {"suspend": True, "template": template}}  # fmt: skip


def kueue_start(job: dict[str, Any]) -> dict[str, Any]:
    """``RunWithPodSetsInfo``: suspend false and ``podset.Merge`` of the flavor."""
    started = json.loads(json.dumps(job))
    started["spec"]["suspend"] = False
    template = started["spec"]["template"]
    template["metadata"]["labels"]["kueue.x-k8s.io/podset"] = "main"
    spec = template["spec"]
    spec["nodeSelector"] = {**FLAVOR["nodeLabels"], **spec.get("nodeSelector", {})}
    spec["tolerations"] = [*spec.get("tolerations", []), *FLAVOR["tolerations"]]
    return started


def test_kueue_starts_the_platforms_queued_job_and_a_user_cannot(
    cluster: Cluster, space: str
) -> None:
    core = platform_identity(cluster)
    kueue = cluster.service_account(*KUEUE_ACCOUNT)
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(queued_job("queued")),
                 check=True)  # fmt: skip
    mallory = user(cluster)
    unsuspend = json.dumps({"spec": {"suspend": False}})
    done = mallory.kubectl("patch", "-n", space, "job/queued", "--type=merge", "-p", unsuspend)
    assert done.returncode != 0 and rule_ids(done.stderr) == {"queue.bypassed"}, done.stderr
    done = mallory.kubectl("label", "-n", space, "job/queued", f"{QUEUE}=team-b", "--overwrite")
    assert done.returncode != 0 and rule_ids(done.stderr) == {"queue.bypassed"}, done.stderr
    # her attempt changed nothing: the Job waits, with no Pod
    stored = get(cluster, space, "job/queued")
    assert stored["spec"]["suspend"] is True and stored["metadata"]["labels"][QUEUE] == "team-a"
    started = kueue_start(stored)
    kueue.kubectl("replace", "-f", "-", input=json.dumps(started), check=True)
    running = get(cluster, space, "job/queued")
    assert running["spec"]["suspend"] is False
    assert running["spec"]["template"] == started["spec"]["template"]  # nothing patched
    (pod,) = wait_pods(cluster, space, "app=queued", 1)
    assert platform_made(pod)
    assert pod["spec"]["nodeName"] == "kwok-trust-0"  # the flavor's node


# --- the profile where Kueue counts it --------------------------------------------------

# The shipped profile 1xa100 (policies/profiles.yaml), as the stored template carries it.
A100_RESOURCES = {
    "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
    "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
}


def runguard_patches(event: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The runguard webhooks the apiserver called on a request (its audit annotations),
    and every operation of the patches they returned."""
    called, operations = [], []
    for key, value in event.get("annotations", {}).items():
        if key.startswith(("mutation.webhook.admission.k8s.io/", "patch.webhook.admission")):
            record = json.loads(value)
            if record["webhook"].endswith(".runguard.io"):
                if key.startswith("mutation."):
                    called.append(record["webhook"])
                operations.extend(record.get("patch", []))
    return called, operations


def test_a_gpu_run_jobs_template_is_stored_with_the_profile_and_its_pod_left_as_made(
    cluster: Cluster, space: str
) -> None:
    """What Kueue reads is the stored Job: it carries the profile. The job-controller's
    Pod, made from it, reaches runguard's /mutate and gets nothing of the spec changed."""
    core = platform_identity(cluster)
    job = queued_job("gpu-run")
    del job["metadata"]["labels"][QUEUE]  # no queue here: the job-controller starts it
    job["spec"]["suspend"] = False
    job["spec"]["template"]["metadata"]["labels"]["dhcore/template"] = "1xa100"
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "2Gi"}
    }
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(job), check=True)
    stored = get(cluster, space, "job/gpu-run")
    template = stored["spec"]["template"]["spec"]
    assert template["containers"][0]["resources"] == A100_RESOURCES
    assert (template["runtimeClassName"], template["priorityClassName"]) == ("nvidia", "high")
    assert template["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}

    def created() -> dict[str, Any] | None:
        events = cluster.audit_events(verb="create", resource="pods", namespace=space)
        # (a controller's Pod has only its generateName in the audit event)
        made = [
            e
            for e in events
            if e["responseStatus"]["code"] == 201
            and e.get("requestObject", {}).get("metadata", {}).get("generateName") == "gpu-run-"
        ]
        return made[0] if made else None

    event = until("the job-controller's Pod of gpu-run created", created, WAIT)
    called, operations = runguard_patches(event)
    assert any(w.startswith("mutate") for w in called), event.get("annotations")
    assert [op for op in operations if op["path"].startswith("/spec")] == [], operations
    (pod,) = run_pods(cluster, space, "batch.kubernetes.io/job-name=gpu-run")
    assert pod["spec"]["containers"][0]["resources"] == A100_RESOURCES
    assert platform_made(pod)
