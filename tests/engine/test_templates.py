"""Profiles applied where capacity is decided: the pod template of a run Job, of a CronJob's
job template (and of the operators' kinds, through the templates each operator entry
declares) carries the profile once it is stored, since a queue (Kueue) counts a run by its
template before any Pod exists. Mutated at CREATE only, idempotent, and a fixed point: the
Pods made from such a template get no further change, and are still judged.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from harness import REPO
from harness.cluster_state import Meta, State, owner
from harness.routing import Cel
from harness.shipped import ALICE, CORE, JOBS, SHIPPED, created, pod, update
from harness.templates import CRONJOBS, GPU, QUEUE, QUEUED, cronjob, queue_policy, rayjob, run_job

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.policy.errors import PolicyError
from webhook.policy.loader import load_policy
from webhook.policy.model import Operator, Policy

# What the profile 1xa100 (policies/profiles.yaml) writes into the main container and spec.
A100_RESOURCES = {
    "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
    "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
}


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


def test_kubectl_apply_of_the_same_manifest_keeps_the_stored_template() -> None:
    """Its three-way merge re-sends the user's values where runguard changed them: the
    stored template is put back (a Job's template is immutable: the apiserver would
    refuse the update), and an apply that changes what the profile does not decide is
    left as sent."""
    stored = created(run_job(), CORE)
    reapplied = copy.deepcopy(stored)
    reapplied["spec"]["template"] = copy.deepcopy(run_job()["spec"]["template"])
    mutation, validation = update(reapplied, stored, CORE)
    assert mutation.object["spec"]["template"] == stored["spec"]["template"]
    assert [c.rule for c in mutation.mutations] == ["update.spec-kept"]
    assert validation.allowed, validation.message()
    other = copy.deepcopy(reapplied)
    other["spec"]["template"]["spec"]["containers"][0]["image"] = "python:3.12"
    mutation, _ = update(other, stored, CORE)
    assert spec_ops(mutation) == [], mutation.patch


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


# --- a queue profile ---------------------------------------------------------------------


def test_a_queue_profiles_job_is_labelled_suspended_and_not_placed() -> None:
    policy = queue_policy()
    job = run_job(QUEUED)
    decision = evaluate(job, policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    stored = decision.object
    labels = stored["metadata"]["labels"]
    assert labels[QUEUE] == "team-a" and labels["kueue.x-k8s.io/priority-class"] == "research"
    assert stored["spec"]["suspend"] is True
    spec = stored["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"] == A100_RESOURCES
    assert spec["runtimeClassName"] == "nvidia"
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert QUEUE not in stored["spec"]["template"]["metadata"]["labels"]  # the Job is queued
    again = mutate(stored, policy, namespace="ml", context=Context(CORE, State([])))
    assert again.patch == [], again.patch
    # its Pods name no queue: the Job is what Kueue admits
    child = pod_of(stored)
    pod_mutation = mutate(child, policy, namespace="ml", context=Context(JOBS, state_of(stored)))
    assert pod_mutation.patch is None or spec_ops(pod_mutation) == []
    assert QUEUE not in pod_mutation.object["metadata"]["labels"]


def test_a_queue_profiles_run_that_skipped_mutate_is_refused() -> None:
    """The backstop: without the queue's label and suspension the run would start
    unqueued, on capacity nobody admitted."""
    policy = queue_policy()
    job = created_with(policy, run_job(QUEUED))
    job["metadata"]["labels"].pop(QUEUE)
    job["spec"]["suspend"] = False
    judged = validate(job, policy, namespace="ml", context=Context(CORE, State([])))
    assert not judged.allowed
    (violation,) = [v for v in judged.violations if v.path == "metadata.labels"]
    assert violation.rule == "profile.applied" and violation.backstop, violation
    assert "label kueue.x-k8s.io/queue-name=team-a" in violation.message
    assert "spec.suspend true" in violation.message


def created_with(policy: Any, obj: dict[str, Any]) -> dict[str, Any]:
    decision = evaluate(obj, policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    stored: dict[str, Any] = decision.object
    return stored


def test_a_queue_profile_overrides_the_runs_own_queue_and_unsuspension() -> None:
    job = run_job(QUEUED)
    job["metadata"]["labels"][QUEUE] = "the-fast-one"
    job["spec"]["suspend"] = False
    stored = evaluate(job, queue_policy(), namespace="ml", context=Context(ALICE, State([])))
    assert stored.object["metadata"]["labels"][QUEUE] == "team-a"
    assert stored.object["spec"]["suspend"] is True
    assert any("queued" in w for w in stored.warnings), stored.warnings


def test_a_queue_profiles_cronjob_makes_queued_jobs() -> None:
    cron = cronjob()
    template = cron["spec"]["jobTemplate"]["spec"]["template"]
    template["metadata"]["labels"] = dict(QUEUED)
    stored = evaluate(cron, queue_policy(), namespace="ml", context=Context(CORE, State([])))
    job_template = stored.object["spec"]["jobTemplate"]
    assert job_template["metadata"]["labels"][QUEUE] == "team-a"
    assert job_template["spec"]["suspend"] is True


def test_a_queue_profiles_bare_pod_is_labelled_for_kueues_pod_integration() -> None:
    policy = queue_policy()
    decision = evaluate(pod(labels=QUEUED), policy, namespace="ml",
                        context=Context(CORE, State([])))  # fmt: skip
    assert decision.allowed, decision.message()
    assert decision.object["metadata"]["labels"][QUEUE] == "team-a"
    assert "suspend" not in decision.object["spec"]
    assert "nodeSelector" not in decision.object["spec"]


# --- the operators' kinds, through the templates their entries declare --------------------


def ray_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = obj["spec"]["rayClusterSpec"]
    return [
        cluster["headGroupSpec"]["template"],
        *(g["template"] for g in cluster["workerGroupSpecs"]),
        obj["spec"]["submitterPodTemplate"],
    ]


def test_a_rayjobs_templates_get_the_profile_once() -> None:
    for who in (CORE, ALICE):
        context = Context(who, State([]))
        decision = evaluate(rayjob(GPU), SHIPPED, namespace="ml", context=context)
        assert decision.allowed and decision.profile == "1xa100", decision.message()
        for template in ray_templates(decision.object):
            main = template["spec"]["containers"][0]
            assert main["resources"] == A100_RESOURCES, who
            assert template["spec"]["runtimeClassName"] == "nvidia"
        again = mutate(decision.object, SHIPPED, namespace="ml", context=context)
        assert spec_ops(again) == [], again.patch
        # an update (Kueue's start, a label) leaves the templates as they are
        started = copy.deepcopy(decision.object)
        started["spec"]["suspend"] = False
        assert spec_ops(mutate(started, SHIPPED, namespace="ml", old=decision.object,
                               context=Context(who, State([]), "UPDATE"))) == []  # fmt: skip


def test_a_rayjob_that_is_no_run_is_left_alone() -> None:
    mine = rayjob({"app": "mine"})
    decision = mutate(mine, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    assert not decision.patch and not decision.applies


def test_the_rayjobs_pods_and_cluster_have_nothing_left_to_change() -> None:
    """KubeRay's RayCluster copies the RayJob's cluster spec; its head Pod the template."""
    stored = created(rayjob(GPU), CORE)
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
               "metadata": {"name": "r1-raycluster", "namespace": "ml", "uid": "uid-rc",
                            "ownerReferences": [{**owner("RayJob", "r1", "uid-rayjob"),
                                                 "apiVersion": "ray.io/v1"}]},
               "spec": copy.deepcopy(stored["spec"]["rayClusterSpec"])}  # fmt: skip
    kuberay = Requester("system:serviceaccount:digitalhub:kuberay-operator")
    context = Context(kuberay, state_of(stored))
    made = mutate(cluster, SHIPPED, namespace="ml", context=context)
    assert spec_ops(made) == [], made.patch
    cluster = made.object  # with runguard's records: KubeRay's, for the platform's RayJob
    head = copy.deepcopy(stored["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    pod_ = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "r1-head", "namespace": "ml", **head["metadata"],
                         "ownerReferences": [{**owner("RayCluster", "r1-raycluster", "uid-rc"),
                                              "apiVersion": "ray.io/v1"}]},
            "spec": head["spec"]}  # fmt: skip
    context = Context(kuberay, state_of(stored, cluster))
    assert spec_ops(mutate(pod_, SHIPPED, namespace="ml", context=context)) == []


def test_a_queue_profiles_rayjob_is_labelled_and_suspended() -> None:
    policy = queue_policy()
    decision = evaluate(rayjob(QUEUED), policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    assert decision.object["metadata"]["labels"][QUEUE] == "team-a"
    assert decision.object["spec"]["suspend"] is True
    for template in ray_templates(decision.object):
        assert "nodeSelector" not in template["spec"] and "tolerations" not in template["spec"]


def kubeflow_policy() -> Any:
    """The shipped RunPolicy with the Kubeflow training operator's PyTorchJob declared."""
    run = SHIPPED.named("digitalhub")
    assert run is not None
    operator = Operator.model_validate(
        {
            "identity": "system:serviceaccount:kubeflow:training-operator",
            "kinds": ["kubeflow.org/PyTorchJob"],
            "templates": [
                {
                    "kind": "kubeflow.org/PyTorchJob",
                    "paths": ["spec.pytorchReplicaSpecs[*].template"],
                    "suspend": "spec.runPolicy.suspend",
                }
            ],
        }  # fmt: skip
    )
    platform = run.platform.model_copy(update={"operators": (*run.platform.operators, operator)})
    return Policy.of(run.model_copy(update={"platform": platform}))


def pytorchjob(labels: dict[str, str]) -> dict[str, Any]:
    template = run_job(labels)["spec"]["template"]
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "r1", "namespace": "ml"},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": copy.deepcopy(template)},
                "Worker": {"replicas": 3, "template": copy.deepcopy(template)}}}}  # fmt: skip


def test_a_kubeflow_jobs_replica_templates_get_the_profile() -> None:
    policy = kubeflow_policy()
    decision = evaluate(pytorchjob(GPU), policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    for replica in decision.object["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["spec"]["containers"][0]["resources"] == A100_RESOURCES


def operators_hook(policy: Any) -> dict[str, Any]:
    (found,) = [h for c in manifests.webhook_configurations(policy) for h in c["webhooks"]
                if h["name"].startswith("mutate-operators")]  # fmt: skip
    return found


def routed(hook: dict[str, Any], obj: dict[str, Any], who: Requester) -> bool:
    """The operators' webhook's matchConditions, evaluated as the apiserver does (CEL)."""
    cel = Cel()
    group, _, _ = obj["apiVersion"].rpartition("/")
    request = {"operation": "CREATE", "namespace": "ml",
               "kind": {"group": group, "kind": obj["kind"]},
               "userInfo": {"username": who.username, "groups": list(who.groups)}}  # fmt: skip
    out = True
    for condition in hook["matchConditions"]:
        program = cel.env.compile(condition["expression"])
        value = program.eval(data={"object": obj, "oldObject": None, "request": request})
        assert value.type() == cel.cel.Type.BOOL, condition["name"]  # an error fails the request
        out = out and bool(value.value())
    return out


def test_a_users_operator_object_with_a_runs_templates_reaches_mutate() -> None:
    """Her own RayJob or PyTorchJob whose templates are a run's: /mutate changes them, so
    the operators' webhook is called; one whose templates are no run's is not."""
    for policy, make in ((SHIPPED, rayjob), (kubeflow_policy(), pytorchjob)):
        hook = operators_hook(policy)
        assert routed(hook, make(GPU), ALICE)
        assert not routed(hook, make({"app": "mine"}), ALICE)
        odd = make({"app": "mine"})
        odd["spec"]["rayClusterSpec" if "rayClusterSpec" in odd["spec"] else "x"] = {
            "workerGroupSpecs": ["not-a-group"]
        }
        assert not routed(hook, odd, ALICE)  # judged, never an error


def test_an_operators_templates_are_in_one_of_its_kinds(tmp_path: Path) -> None:
    repo = REPO
    text = (repo / "policies" / "platform.yaml").read_text(encoding="utf-8")
    for name in ("profiles.yaml", "runpolicy.yaml"):
        (tmp_path / name).write_text((repo / "policies" / name).read_text())
    broken = text.replace("- kind: ray.io/RayCluster\n          paths:", "- kind: x.io/Job\n"
                          "          paths:")  # fmt: skip
    assert broken != text
    (tmp_path / "platform.yaml").write_text(broken)
    with pytest.raises(PolicyError, match=r"templates\[1\]\.kind: \"x.io/Job\" is not one of"):
        load_policy(tmp_path)
