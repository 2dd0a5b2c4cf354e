"""A profile edit re-sizing Pods their queue already counted.

The attack review's chain: a project admin's profile gave 1 GPU per Pod when a Job was
created, and its queue counted it so; the profile was then edited to 2 GPUs, and every
Pod the job-controller made got 2 (re-sized from the live profile). A template's size is
now recorded once, at CREATE (``runguard.io/size``, ``webhook/engine/sizes.py``); the
Pods made from it are judged against that record. A record runguard did not write is
removed (or, without ``/mutate``, denied), and a record is frozen on UPDATE."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness import written_policy
from harness.profiles import PROFILES, RUN_POLICY, cluster, project_profile
from harness.shipped import ALICE

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import SIZE_RECORD
from webhook.policy.model import Policy

JOBS = Requester("system:serviceaccount:kube-system:job-controller")
GPU = "nvidia.com/gpu"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/template": "gpus"}


@pytest.fixture
def policy(tmp_path: Any) -> Policy:
    return written_policy(tmp_path, {"runpolicy.yaml": RUN_POLICY, "profiles.yaml": PROFILES})


def gpus(count: str) -> dict[str, Any]:
    return project_profile(
        "team-a", "gpus", resources={"requests": {"cpu": "2", "gpu": count},
                                     "limits": {"gpu": count}},
    )  # fmt: skip


def job() -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "uid-train",
                         "labels": dict(RUN)},
            "spec": {"suspend": True, "template": {
                "metadata": {"labels": dict(RUN)},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "python:3.12"}]}}}}  # fmt: skip


def created(obj: dict[str, Any], policy: Policy, context: Context) -> dict[str, Any]:
    decision = evaluate(obj, policy, namespace="team-a", context=context)
    assert decision.allowed, decision.message()
    return decision.object


def pod_of(stored: dict[str, Any]) -> dict[str, Any]:
    """The Pod the job-controller makes from the stored Job's template."""
    template = copy.deepcopy(stored["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train-abc", "namespace": "team-a", **template["metadata"],
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": "train", "uid": "uid-train",
                                              "controller": True}]},
            "spec": template["spec"]}  # fmt: skip


def main_gpu(obj: dict[str, Any]) -> str:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else obj["spec"]
    return str(spec["containers"][0]["resources"]["limits"][GPU])


def test_a_profile_edited_after_a_job_was_counted_leaves_its_pods_at_the_counted_size(
    policy: Policy,
) -> None:
    stored = created(job(), policy, cluster(gpus("1")))
    assert main_gpu(stored) == "1"
    assert SIZE_RECORD in stored["spec"]["template"]["metadata"]["annotations"]
    edited = cluster(gpus("2"), stored)  # the admin edits the profile; the Job is stored
    made = evaluate(pod_of(stored), policy, namespace="team-a",
                    context=Context(JOBS, edited.state))  # fmt: skip
    assert made.allowed, made.message()
    assert main_gpu(made.object) == "1", "the Pod is re-sized from the profile edited since"
    # a new run gets the profile as it is now
    assert main_gpu(created(job(), policy, edited)) == "2"


def test_a_pod_of_a_job_whose_profile_was_deleted_keeps_its_size(policy: Policy) -> None:
    stored = created(job(), policy, cluster(gpus("1")))
    gone = cluster(stored)
    made = evaluate(pod_of(stored), policy, namespace="team-a",
                    context=Context(JOBS, gone.state))  # fmt: skip
    assert made.allowed, made.message()
    assert main_gpu(made.object) == "1"


def test_a_forged_size_record_on_a_users_pod_is_removed_or_refused(policy: Policy) -> None:
    stored = created(job(), policy, cluster(gpus("1")))
    forged = pod_of(stored)
    forged["metadata"].pop("ownerReferences")
    record = forged["metadata"]["annotations"][SIZE_RECORD].replace('"1"', '"2"')
    forged["metadata"]["annotations"][SIZE_RECORD] = record
    context = Context(ALICE, cluster(gpus("1"), stored).state)
    made = mutate(forged, policy, namespace="team-a", context=context)
    assert SIZE_RECORD not in made.object["metadata"].get("annotations", {})
    skipped = validate(forged, policy, namespace="team-a", context=context)
    assert "resources.size-record" in {v.rule for v in skipped.violations}


def test_a_size_record_is_frozen_on_update(policy: Policy) -> None:
    context = cluster(gpus("1"))
    stored = created(job(), policy, context)
    changed = copy.deepcopy(stored)
    annotations = changed["spec"]["template"]["metadata"]["annotations"]
    annotations[SIZE_RECORD] = annotations[SIZE_RECORD].replace('"1"', '"2"')
    update = Context(ALICE, context.state, "UPDATE")
    judged = validate(changed, policy, namespace="team-a", old=stored, context=update)
    assert "resources.size-record" in {v.rule for v in judged.violations}
    same = validate(copy.deepcopy(stored), policy, namespace="team-a", old=stored, context=update)
    assert same.allowed, same.message()


def test_a_project_profile_under_builds_is_bounded_by_the_other_run_policies() -> None:
    """The shipped ``builds`` RunPolicy has no maximums (the platform's image builds): a
    project's profile a build names still gives no more than ``digitalhub`` allows
    (cpu 18), or it is not applied."""
    from harness.shipped import CORE, SHIPPED

    from webhook.clusterstate import StaticClusterState

    build = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "build", "namespace": "ml",
                          "labels": {"app.kubernetes.io/managed-by": "dhcore",
                                     "dhcore/framework": "k8sbuild", "dhcore/run": "r1",
                                     "dhcore/template": "huge"}},
             "spec": {"containers": [{"name": "kaniko", "image": "kaniko:1"}]}}  # fmt: skip

    def judged(cpu: str) -> Any:
        profile = project_profile("ml", "huge", resources={"requests": {"cpu": cpu}})
        profile["metadata"]["namespace"] = "ml"
        state = StaticClusterState.from_documents(
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}, profile]
        )
        return evaluate(build, SHIPPED, namespace="ml", context=Context(CORE, state))

    refused = judged("64")
    assert "profile.project-invalid" in {v.rule for v in refused.violations}
    assert "beyond RunPolicy digitalhub" in refused.message()
    allowed = judged("4")
    assert allowed.allowed, allowed.message()
    assert allowed.object["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "4"
