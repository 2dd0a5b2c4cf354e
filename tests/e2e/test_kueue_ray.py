"""A real Kueue queueing the platform's RayJobs (``tests/e2e/kueue.py``), with the shipped
policies.

KubeRay's own RayJob and RayCluster CRDs (of the version Kueue v0.19.2 is built against,
from the Go module cache: its defaults, ``submissionMode: K8sJobMode`` among them, and
its pruning) are served before Kueue starts with the ``batch/job`` and ``ray.io/rayjob``
integrations; runguard serves ``policies/`` as shipped (the Platform's KubeRay entry
declares the RayJob's head, worker and submitter templates) plus test_kueue.py's queue
profile ``gpu-queued``, in place of the session's.
No KubeRay runs: what is tested is the queue's part, before any RayCluster or Pod.

The platform creates a RayJob run naming its queue, the profile ``1xa100`` on its head
and worker templates: runguard writes the profile into both at CREATE, Kueue's Workload
counts the profile's resources for them, Kueue's patch starting it (``spec.suspend``
false, the flavor's node selector and toleration in each template, the submitter's
template it adds) is let through; a user cannot start a RayJob Kueue holds, which Kueue
starts once the first one is done. A RayJob naming only the queue profile is sent to its
queue by runguard and placed by Kueue.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .kueue import (
    QUEUE_LABEL,
    Kueue,
    condition,
    install_kuberay_crds,
)
from .runs import (
    Webhook,
    instead_of_the_session,
    platform_identity,
    poll,
    rule_ids,
    until,
    wait_for_policy_label,
)
from .test_kueue import (
    A100_REQUESTS,
    FLAVORS,
    GPU_TOLERATION,
    QUEUE,
    QUEUED_REQUESTS,
    resource_flavors,
    with_queued_profile,
)
from .test_operator_watch import RAYJOB, RUN, role
from .test_operator_watch import apply as apply_objects
from .test_trust import WAIT, user

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
RAYJOBS = f"{RAYJOB.plural}.{RAYJOB.group}"
# Per team: a RayJob of two 1xa100 templates (head and one worker) fits a100 once.
QUOTAS = {
    "a100": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "2"},
    "t4": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "1"},
}
RUN_PODSETS = ("head", "gpu")  # the head's and the worker group's (its groupName)


def synced(server: Runguard, group_kind: str) -> bool:
    """runguard's cluster state lists ``group_kind`` (its metric says so)."""
    context = ssl.create_default_context(cafile=str(server.ca_file))
    with urllib.request.urlopen(f"{server.url}/metrics", context=context, timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(
        rf'^runguard_cluster_state_synced{{kind="{re.escape(group_kind)}"}} (\S+)$', text, re.M
    )
    return found is not None and float(found[1]) == 1


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Kueue]:
    """KubeRay's CRDs, the shipped policies' runguard with test_kueue.py's queue profile
    ``gpu-queued``, and Kueue with the rayjob integration and its ResourceFlavors."""
    base = tmp_path_factory.mktemp("kueue-ray")
    crds = install_kuberay_crds(cluster)
    try:
        prepare_cluster(cluster)
        platform_identity(cluster)  # the namespace and ServiceAccount digitalhub/core
        user(cluster)
        # "edit" covers no custom resource: the platform's and the user's rights on RayJobs
        apply_objects(cluster, role(
            "rg-e2e-kueue-ray",
            [{"apiGroups": [RAYJOB.group], "resources": [RAYJOB.plural], "verbs": ["*"]}],
            {"kind": "ServiceAccount", "name": "core", "namespace": "digitalhub"},
            {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"},
        ))  # fmt: skip
        state = ("--cluster-state", str(cluster.kubeconfig))
        server = Runguard(base / "runguard", with_queued_profile(base), serve_args=state)
        with instead_of_the_session(webhook, cluster, server):
            wait_for_policy_label(cluster, "digitalhub", "the shipped policies' runguard called")
            poll("runguard's cache lists RayJobs", lambda: synced(server, RAYJOB.group_kind), WAIT)
            frameworks = ("batch/job", "ray.io/rayjob")
            with Kueue(cluster, base / "kueue", frameworks).running(*resource_flavors()) as running:
                yield running
    finally:
        # the other modules serve reduced CRDs of their own under the same names
        cluster.kubectl("delete", "crd", *crds, "--ignore-not-found", "--wait", "--timeout=60s")


@pytest.fixture
def team(cluster: Cluster, kueue: Kueue) -> Iterator[str]:
    """A team's namespace, its ClusterQueue (named after it) and its LocalQueue ``gpu``."""
    with kueue.team("t-kueue-ray", QUEUE, QUOTAS) as name:
        yield name


def ray_template(name: str, profile: str) -> JSON:
    """A run's Ray pod template as the platform writes it: the run labels and profile,
    the user's own modest resources."""
    main = {"name": "ray", "image": "rayproject/ray:2.9.0",
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}  # fmt: skip
    return {"metadata": {"labels": {**RUN, "app": name, "dhcore/template": profile}},
            "spec": {"containers": [main]}}  # fmt: skip


def run_rayjob(name: str, profile: str, queue: str | None = QUEUE) -> JSON:
    """A RayJob run as the platform creates it: the run labels and its queue (when
    given), a head and one worker of ``profile``, the cluster removed when the job ends
    (Kueue's webhook requires it of a queued RayJob)."""
    cluster = {
        "headGroupSpec": {"rayStartParams": {}, "template": ray_template(name, profile)},
        "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1,
                              "maxReplicas": 1, "rayStartParams": {},
                              "template": ray_template(name, profile)}],
    }  # fmt: skip
    return {"apiVersion": RAYJOB.api_version, "kind": RAYJOB.kind,
            "metadata": {"name": name,
                         "labels": {**RUN, QUEUE_LABEL: queue} if queue else dict(RUN)},
            "spec": {"entrypoint": "python train.py", "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": cluster}}  # fmt: skip


def create(cluster: Cluster, namespace: str, job: JSON) -> JSON:
    done = platform_identity(cluster).kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                                              input=json.dumps(job), check=True)  # fmt: skip
    created: JSON = json.loads(done.stdout)
    return created


def stored(cluster: Cluster, namespace: str, name: str) -> JSON:
    done = cluster.kubectl("get", "-n", namespace, RAYJOBS, name, "-o", "json", check=True)
    found: JSON = json.loads(done.stdout)
    return found


def templates(job: JSON) -> list[JSON]:
    """The head's and the workers' pod templates of a RayJob."""
    spec = job["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"]["template"],
            *(group["template"] for group in spec["workerGroupSpecs"])]  # fmt: skip


def admitted(kueue: Kueue, namespace: str, name: str) -> JSON:
    """RayJob ``name``'s Workload once Kueue admitted it."""

    def probe() -> JSON | None:
        workload = kueue.workload_of(namespace, name, kind=RAYJOB.kind)
        found = condition(workload, "Admitted") if workload else None
        return workload if found and found["status"] == "True" else None

    return until(f"Kueue admits RayJob {name}", probe, WAIT)


def started(cluster: Cluster, namespace: str, name: str) -> JSON:
    """RayJob ``name`` once Kueue's patch unsuspended it (Kueue renders the RayJob as
    KubeRay's Go type, which leaves a false ``suspend`` out)."""

    def probe() -> JSON | None:
        job = stored(cluster, namespace, name)
        return job if job["spec"].get("suspend") is not True else None

    return until(f"Kueue starts RayJob {name}", probe, WAIT)


def test_a_rayjob_run_is_counted_with_its_profile_and_started_by_kueue(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    made = create(cluster, team, run_rayjob("train", "1xa100"))
    assert made["spec"]["suspend"] is True  # queued: Kueue's webhook suspended it
    for template in templates(made):  # runguard's profile, written at CREATE
        main = template["spec"]["containers"][0]
        assert main["resources"]["requests"] == A100_REQUESTS, main
        assert template["spec"]["runtimeClassName"] == "nvidia"

    workload = admitted(kueue, team, "train")
    # Kueue counted the templates runguard stored: the profile's resources, not the user's
    podsets = {p["name"]: p for p in workload["spec"]["podSets"]}
    assignments = {a["name"]: a for a in workload["status"]["admission"]["podSetAssignments"]}
    for name in RUN_PODSETS:
        assert podsets[name]["count"] == 1
        requests = podsets[name]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert requests == A100_REQUESTS, name
        assert assignments[name]["resourceUsage"] == A100_REQUESTS, name
        # the only flavor the profile's node selector allows
        assert assignments[name]["flavors"] == dict.fromkeys(A100_REQUESTS, "a100"), name

    # Kueue's patch starting it went through runguard
    job = started(cluster, team, "train")
    for template in templates(job):
        assert template["spec"]["nodeSelector"] == FLAVORS["a100"][0]
        assert GPU_TOLERATION in template["spec"]["tolerations"]
        assert template["spec"]["containers"][0]["resources"]["requests"] == A100_REQUESTS
    head, worker = templates(job)
    assert head["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "head"
    assert worker["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "gpu"
    # KubeRay's default submitter (K8sJobMode, no template of the platform's), counted by
    # Kueue and written, placed, into the RayJob by its patch: the head's image
    submitter = job["spec"]["submitterPodTemplate"]
    assert submitter["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "submitter"
    (container,) = submitter["spec"]["containers"]
    assert container["image"] == head["spec"]["containers"][0]["image"]
    assert podsets["submitter"]["template"]["spec"]["containers"] == [container]


def test_a_user_cannot_start_a_rayjob_kueue_holds(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    create(cluster, team, run_rayjob("first", "1xa100"))
    admitted(kueue, team, "first")
    started(cluster, team, "first")
    create(cluster, team, run_rayjob("second", "1xa100"))

    def waiting() -> JSON | None:
        workload = kueue.workload_of(team, "second", kind=RAYJOB.kind)
        found = condition(workload, "QuotaReserved") if workload else None
        return found if found and found["status"] == "False" else None

    # a100's two GPUs are the first run's, t4's is not what its profile allows
    reason = until("Kueue finds no quota for the second RayJob", waiting, WAIT)
    assert reason["reason"] == "Pending", reason
    assert stored(cluster, team, "second")["spec"]["suspend"] is True

    unsuspend = json.dumps({"spec": {"suspend": False}})
    done = user(cluster).kubectl("patch", "-n", team, RAYJOBS, "second", "--type=merge",
                                 "-p", unsuspend)  # fmt: skip
    # (as for a Job, queue.bypassed; a RayJob's whole spec is also the platform's)
    assert done.returncode != 0, done.stderr
    assert rule_ids(done.stderr) == {"queue.bypassed", "ownership.changed"}, done.stderr
    assert stored(cluster, team, "second")["spec"]["suspend"] is True

    # KubeRay reports the first one done (no KubeRay runs here): Kueue frees its quota and
    # starts the second on a100
    done_status = {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}
    cluster.kubectl("patch", "-n", team, RAYJOBS, "first", "--subresource=status",
                    "--type=merge", "-p", json.dumps(done_status), check=True)  # fmt: skip
    workload = admitted(kueue, team, "second")
    (assignment, *_) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"] == dict.fromkeys(A100_REQUESTS, "a100")
    started(cluster, team, "second")


def test_a_queue_profiles_rayjob_is_sent_to_its_queue_and_placed_by_kueue(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    """The RayJob names only the queue profile on its templates: runguard writes the
    queue label and ``spec.suspend`` (Kueue's webhook, called first, saw no label) and no
    node selector; Kueue counts the profile and places both templates on a100."""
    made = create(cluster, team, run_rayjob("q-train", "gpu-queued", queue=None))
    assert made["metadata"]["labels"][QUEUE_LABEL] == QUEUE
    assert made["spec"]["suspend"] is True
    workload = admitted(kueue, team, "q-train")
    podsets = {p["name"]: p for p in workload["spec"]["podSets"]}
    for name in RUN_PODSETS:
        spec = podsets[name]["template"]["spec"]
        assert "nodeSelector" not in spec, name
        assert spec["containers"][0]["resources"]["requests"] == QUEUED_REQUESTS, name
    job = started(cluster, team, "q-train")
    for template in templates(job):
        assert template["spec"]["nodeSelector"] == FLAVORS["a100"][0]


def test_a_users_own_rayjob_cannot_leave_its_queue(
    cluster: Cluster, kueue: Kueue, team: str
) -> None:
    """The attack review's chain: a user's RayJob of the queue profile (its run labels on
    its templates only, no platform record) was not found as queued on UPDATE: the label
    removed and the RayJob unsuspended went through. Its RunPolicy is now found from its
    templates as stored, and its queue is frozen."""
    create(cluster, team, run_rayjob("fill", "1xa100"))  # a100's two GPUs taken
    admitted(kueue, team, "fill")
    mallory = user(cluster)
    job = run_rayjob("mine", "gpu-queued", queue=None)
    done = mallory.kubectl("create", "-n", team, "-o", "json", "-f", "-", input=json.dumps(job))
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["metadata"]["labels"][QUEUE_LABEL] == QUEUE and made["spec"]["suspend"] is True

    def waiting() -> JSON | None:
        workload = kueue.workload_of(team, "mine", kind=RAYJOB.kind)
        found = condition(workload, "QuotaReserved") if workload else None
        return found if found and found["status"] == "False" else None

    until("Kueue finds no room for her RayJob", waiting, WAIT)  # (t4 has one GPU, not two)
    # each alone (both at once Kueue's own webhook refuses: the label of a started run)
    for change in ({"op": "remove", "path": "/metadata/labels/kueue.x-k8s.io~1queue-name"},
                   {"op": "replace", "path": "/spec/suspend", "value": False}):  # fmt: skip
        left = mallory.kubectl("patch", "-n", team, RAYJOBS, "mine", "--type=json",
                               "-p", json.dumps([change]))  # fmt: skip
        assert left.returncode != 0, change
        assert rule_ids(left.stderr) >= {"queue.bypassed"}, left.stderr
    kept = stored(cluster, team, "mine")
    assert kept["metadata"]["labels"][QUEUE_LABEL] == QUEUE and kept["spec"]["suspend"] is True
