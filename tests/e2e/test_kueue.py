"""A real Kueue beside runguard (``tests/e2e/kueue.py``), with the shipped policies.

runguard serves ``policies/`` as shipped plus one queue profile, ``gpu-queued`` (a GPU,
placement left to the queue's flavors), in place of the session's runguard. Kueue runs as
its own account with its webhooks called before runguard's, and the controller-manager,
scheduler and kwok's nodes run: the ResourceFlavors ``a100`` and ``t4`` are the kwok GPU
nodes' ``nvidia.com/gpu.product`` labels (with their taint's toleration), each test's
namespace is a team with its own ClusterQueue (one GPU of each flavor) and LocalQueue
``gpu``.

The platform creates its run Jobs naming the queue; Kueue counts what runguard stored
(the profile's resources in the Job's template), starts them on the flavor it picked, and
the job-controller's Pods land on that flavor's node. A run beyond the quota waits until
the first one finishes, and a user with edit rights cannot start it herself. Where a
team's queue preempts, a higher-priority run stops a running one (Kueue suspends it and
the job-controller removes its Pod) and the stopped run starts again once there is room.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import Cluster
from .devcluster import Runguard
from .kueue import (
    QUEUE_LABEL,
    Kueue,
    condition,
    resource_flavor,
    workload_priority_class,
)
from .nodes import A100_PRODUCT, GPU_PRODUCT_LABEL, GPU_RESOURCE
from .runs import (
    REPO,
    Webhook,
    platform_identity,
    rule_ids,
    shipped_on_the_whole_path,
    until,
)
from .test_trust import RUN, WAIT, get, run_pods, user, wait_pods

pytestmark = pytest.mark.e2e

QUEUE = "gpu"  # every team's LocalQueue
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# ResourceFlavor -> (its node labels, the kwok node that has them: cluster.SIMULATED_NODES)
FLAVORS = {
    "a100": ({GPU_PRODUCT_LABEL: A100_PRODUCT}, "kwok-gpu-a100-0"),
    "t4": ({GPU_PRODUCT_LABEL: "Tesla-T4"}, "kwok-gpu-t4-0"),
}
# Per team: one GPU of each flavor, cpu and memory enough for either node's runs.
QUOTAS = {
    "a100": {"cpu": "64", "memory": "512Gi", GPU_RESOURCE: "1"},
    "t4": {"cpu": "32", "memory": "128Gi", GPU_RESOURCE: "1"},
}
QUEUED_PROFILE = {
    "apiVersion": "runguard.io/v1",
    "kind": "Profile",
    "metadata": {"name": "gpu-queued"},
    "spec": {
        "description": "One GPU of whichever flavor the team's queue has room on",
        "resources": {"requests": {"cpu": "4", "memory": "16Gi", "gpu": "1"},
                      "limits": {"memory": "24Gi", "gpu": "1"}},
        "runtimeClassName": "nvidia",
        "queue": {"name": QUEUE},
    },
}  # fmt: skip
# What Kueue counts for a run of each profile (the shipped 1xa100, and gpu-queued).
A100_REQUESTS = {"cpu": "8", "memory": "32Gi", GPU_RESOURCE: "1"}
QUEUED_REQUESTS = {"cpu": "4", "memory": "16Gi", GPU_RESOURCE: "1"}
# kwok completes a Job's Pod this long after it runs: never within a test, which
# finishes a run itself (finish()).
HOLD = {"pod-complete.stage.kwok.x-k8s.io/delay": "3600s"}


def with_queued_profile(base: Path) -> Path:
    """``policies/`` as shipped, copied under ``base``, plus ``QUEUED_PROFILE``."""
    policies = base / "policies"
    shutil.copytree(REPO / "policies", policies)
    (policies / "queued-profile.yaml").write_text(yaml.safe_dump(QUEUED_PROFILE))
    return policies


def resource_flavors() -> list[dict[str, Any]]:
    """The ResourceFlavors of ``FLAVORS``, with the GPU taint's toleration."""
    return [resource_flavor(name, labels, [GPU_TOLERATION])
            for name, (labels, _) in FLAVORS.items()]  # fmt: skip


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Kueue]:
    """The shipped policies' runguard with a queue profile, the controllers, and Kueue
    with its ResourceFlavors."""
    base = tmp_path_factory.mktemp("kueue")
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base / "runguard", with_queued_profile(base), serve_args=state)
    with shipped_on_the_whole_path(webhook, cluster, server):
        with Kueue(cluster, base / "kueue").running(*resource_flavors()) as running:
            yield running


@pytest.fixture
def team(cluster: Cluster, kueue: Kueue) -> Iterator[str]:
    """A team's namespace, its ClusterQueue (named after it) and its LocalQueue ``gpu``."""
    with kueue.team("t-kueue", QUEUE, QUOTAS) as name:
        yield name


PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PRIORITIES = {"e2e-runs-low": 100, "e2e-runs-high": 1000}  # WorkloadPriorityClasses


@pytest.fixture
def preempting_team(cluster: Cluster, kueue: Kueue) -> Iterator[str]:
    """As ``team``, its ClusterQueue preempting lower-priority Workloads for higher ones,
    and the WorkloadPriorityClasses of ``PRIORITIES``."""
    kueue.apply(*(workload_priority_class(c, value) for c, value in PRIORITIES.items()))
    preemption = {"withinClusterQueue": "LowerPriority"}
    with kueue.team("t-kueue-p", QUEUE, QUOTAS, preemption) as name:
        yield name


def run_job(
    name: str, profile: str, *, queue: str | None = QUEUE, priority: str | None = None
) -> dict[str, Any]:
    """A run Job as the platform creates it: the run labels, its queue (when given) and
    Kueue priority class (when given), the profile on the template, the user's own
    modest resources."""
    labels = {**RUN, QUEUE_LABEL: queue} if queue else dict(RUN)
    if priority is not None:
        labels[PRIORITY_LABEL] = priority
    main = {"name": "main", "image": "python:3.11", "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}  # fmt: skip
    template = {"metadata": {"labels": {**RUN, "app": name, "dhcore/template": profile},
                             "annotations": dict(HOLD)},
                "spec": {"restartPolicy": "Never", "containers": [main]}}  # fmt: skip
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {"backoffLimit": 0, "template": template}}  # fmt: skip


def create(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    platform_identity(cluster).kubectl("create", "-n", namespace, "-f", "-",
                                       input=json.dumps(job), check=True)  # fmt: skip


def admitted(kueue: Kueue, namespace: str, job: str) -> dict[str, Any]:
    """Job ``job``'s Workload once Kueue admitted it."""

    def probe() -> dict[str, Any] | None:
        workload = kueue.workload_of(namespace, job)
        found = condition(workload, "Admitted") if workload else None
        return workload if found and found["status"] == "True" else None

    return until(f"Kueue admits {job}", probe, WAIT)


def started(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    """Job ``job`` once Kueue unsuspended it."""

    def probe() -> dict[str, Any] | None:
        stored: dict[str, Any] = get(cluster, namespace, f"job/{job}")
        return stored if stored["spec"].get("suspend") is False else None

    return until(f"Kueue starts {job}", probe, WAIT)


def running_pod(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    (pod,) = wait_pods(cluster, namespace, f"batch.kubernetes.io/job-name={job}", 1)
    return pod


def flavors(workload: dict[str, Any]) -> dict[str, str]:
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    found: dict[str, str] = assignment["flavors"]
    return found


def finish(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> None:
    """The Pod's container exits 0, as its kubelet (kwok) would report it."""
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": pod["status"]["startTime"],
        "finishedAt": pod["status"]["startTime"],
    }
    statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                 "restartCount": 0, "started": False, "state": {"terminated": terminated}}
                for c in pod["spec"]["containers"]]  # fmt: skip
    patch = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
    cluster.kubectl("patch", "-n", namespace, "pod", pod["metadata"]["name"],
                    "--subresource=status", "--type=merge", "-p", json.dumps(patch),
                    check=True)  # fmt: skip


def test_a_gpu_run_is_counted_with_its_profile_and_runs_on_the_flavor_kueue_picked(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    create(cluster, team, run_job("train", "1xa100"))
    workload = admitted(kueue, team, "train")
    # Kueue counted the template runguard stored: the profile's resources, not the user's
    (podset,) = workload["spec"]["podSets"]
    assert podset["count"] == 1
    assert podset["template"]["spec"]["containers"][0]["resources"]["requests"] == A100_REQUESTS
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["resourceUsage"] == A100_REQUESTS
    # the only flavor the profile's node selector allows
    assert flavors(workload) == dict.fromkeys(A100_REQUESTS, "a100")
    job = started(cluster, team, "train")
    template = job["spec"]["template"]
    assert template["spec"]["nodeSelector"] == FLAVORS["a100"][0]
    assert GPU_TOLERATION in template["spec"]["tolerations"]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/podset"] == podset["name"]
    pod = running_pod(cluster, team, "train")
    assert pod["spec"]["nodeName"] == FLAVORS["a100"][1]
    assert pod["spec"]["containers"][0]["resources"]["requests"] == A100_REQUESTS


def test_a_run_beyond_the_quota_waits_for_the_first_and_a_user_cannot_start_it(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    create(cluster, team, run_job("first", "1xa100"))
    admitted(kueue, team, "first")
    first = running_pod(cluster, team, "first")
    create(cluster, team, run_job("second", "1xa100"))

    def waiting() -> dict[str, Any] | None:
        workload = kueue.workload_of(team, "second")
        found = condition(workload, "QuotaReserved") if workload else None
        return found if found and found["status"] == "False" else None

    # Kueue looked at it and found no quota: a100's GPU is the first run's, t4's is not
    # what its profile's node selector allows
    reason = until("Kueue finds no quota for the second run", waiting, WAIT)
    assert reason["reason"] == "Pending", reason
    assert get(cluster, team, "job/second")["spec"]["suspend"] is True
    assert run_pods(cluster, team, "batch.kubernetes.io/job-name=second") == []

    mallory = user(cluster)
    unsuspend = json.dumps({"spec": {"suspend": False}})
    done = mallory.kubectl("patch", "-n", team, "job/second", "--type=merge", "-p", unsuspend)
    assert done.returncode != 0 and rule_ids(done.stderr) == {"queue.bypassed"}, done.stderr
    assert get(cluster, team, "job/second")["spec"]["suspend"] is True

    finish(cluster, team, first)
    workload = admitted(kueue, team, "second")
    assert flavors(workload) == dict.fromkeys(A100_REQUESTS, "a100")
    finished = condition(get(cluster, team, "job/first"), "Complete")
    assert finished is not None and finished["status"] == "True"
    started(cluster, team, "second")
    assert running_pod(cluster, team, "second")["spec"]["nodeName"] == FLAVORS["a100"][1]


def test_a_queue_profiles_runs_land_where_the_queues_flavors_have_room(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    """The run names only its profile: runguard sends it to the profile's queue
    (suspended, with the queue label) and sets no node selector; Kueue's flavor places it,
    a100 while that has room, then t4."""
    for name, flavor in (("q-first", "a100"), ("q-second", "t4")):
        create(cluster, team, run_job(name, "gpu-queued", queue=None))
        stored = get(cluster, team, f"job/{name}")
        assert stored["metadata"]["labels"][QUEUE_LABEL] == QUEUE
        workload = admitted(kueue, team, name)
        (podset,) = workload["spec"]["podSets"]
        assert "nodeSelector" not in podset["template"]["spec"]
        assert podset["template"]["spec"]["containers"][0]["resources"]["requests"] == (
            QUEUED_REQUESTS
        )
        assert flavors(workload) == dict.fromkeys(QUEUED_REQUESTS, flavor)
        job = started(cluster, team, name)
        assert job["spec"]["template"]["spec"]["nodeSelector"] == FLAVORS[flavor][0]
        assert running_pod(cluster, team, name)["spec"]["nodeName"] == FLAVORS[flavor][1]


def test_a_higher_priority_run_preempts_a_running_one_which_starts_again_after(
    cluster: Cluster, kueue: Kueue, preempting_team: str
) -> None:
    """Kueue's preemption through runguard: its update suspending a running platform Job
    (and restoring its template) is let through, the job-controller removes the Pod, the
    higher-priority run starts on the GPU it freed; the stopped run waits (a user cannot
    start it) and starts again when the GPU is free."""
    team = preempting_team
    create(cluster, team, run_job("low", "1xa100", priority="e2e-runs-low"))
    admitted(kueue, team, "low")
    started(cluster, team, "low")
    running_pod(cluster, team, "low")

    create(cluster, team, run_job("high", "1xa100", priority="e2e-runs-high"))

    def preempted() -> dict[str, Any] | None:
        workload = kueue.workload_of(team, "low")
        found = condition(workload, "Evicted") if workload else None
        return found if found and found["status"] == "True" else None

    evicted = until("Kueue evicts the lower-priority run", preempted, WAIT)
    assert evicted["reason"] == "Preempted", evicted
    until(
        "Kueue suspends the preempted run",
        lambda: get(cluster, team, "job/low")["spec"].get("suspend") is True or None,
        WAIT,
    )
    until(
        "the job-controller removes its Pod",
        lambda: run_pods(cluster, team, "batch.kubernetes.io/job-name=low") == [] or None,
        WAIT,
    )
    workload = admitted(kueue, team, "high")
    assert flavors(workload) == dict.fromkeys(A100_REQUESTS, "a100")
    started(cluster, team, "high")
    high = running_pod(cluster, team, "high")
    assert high["spec"]["nodeName"] == FLAVORS["a100"][1]
    assert high["spec"]["containers"][0]["resources"]["requests"] == A100_REQUESTS

    mallory = user(cluster)
    unsuspend = json.dumps({"spec": {"suspend": False}})
    done = mallory.kubectl("patch", "-n", team, "job/low", "--type=merge", "-p", unsuspend)
    assert done.returncode != 0 and rule_ids(done.stderr) == {"queue.bypassed"}, done.stderr

    finish(cluster, team, high)
    workload = admitted(kueue, team, "low")
    assert flavors(workload) == dict.fromkeys(A100_REQUESTS, "a100")
    job = started(cluster, team, "low")
    # the template Kueue restored and set again is still the profile's
    template = job["spec"]["template"]
    assert template["spec"]["containers"][0]["resources"]["requests"] == A100_REQUESTS
    assert running_pod(cluster, team, "low")["spec"]["nodeName"] == FLAVORS["a100"][1]
