"""``webhook/engine/rules/queue_profile.py`` on its own: ``send_to_queue`` writes a queue
profile's labels (and suspends a Job-like object) where Kueue reads them, called directly
on objects, never on one whose controller is queued as a whole."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from harness.cluster_state import Meta, State
from harness.pods import policy_of

from webhook.engine.context import Requester
from webhook.engine.rules.profile import PROFILE_APPLIED
from webhook.engine.rules.queue_profile import (
    ADMISSION_GATE,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    queue_label,
    send_to_queue,
)
from webhook.keys import POLICY_LABEL
from webhook.policy.model import Policy, Profile

JOBS = Requester("system:serviceaccount:kube-system:job-controller")
QUEUED = {QUEUE_LABEL: "gpu", PRIORITY_LABEL: "urgent"}


def policy(tmp_path: Path, **platform: Any) -> Policy:
    return policy_of(
        tmp_path,
        {
            "platform": {
                "identities": ["system:serviceaccount:digitalhub:core"],
                "controllers": [JOBS.username],
                **platform,
            }
        },
        {
            "queued": {"queue": {"name": "gpu", "priorityClass": "urgent"}},
            "plain": {"resources": {"requests": {"cpu": "1"}}},
        },
    )


def profile(p: Policy, name: str = "queued") -> Profile:
    return p.first.profiles[name]


JOB = {
    "kind": "Job",
    "metadata": {"name": "train", "labels": {"app": "run"}},
    "spec": {"template": {"spec": {"containers": []}}},
}


def test_a_job_gets_the_queues_labels_and_is_created_suspended(tmp_path: Path) -> None:
    p = policy(tmp_path)
    before = copy.deepcopy(JOB)
    out, change = send_to_queue(JOB, "Job", profile(p), p.first)
    assert change is not None and change.rule == PROFILE_APPLIED
    assert out == {
        "kind": "Job",
        "metadata": {"name": "train", "labels": {"app": "run", **QUEUED}},
        "spec": {"template": {"spec": {"containers": []}}, "suspend": True},
    }
    assert JOB == before  # the input is not changed
    assert send_to_queue(out, "Job", profile(p), p.first) == (out, None)  # a fixed point


def test_a_cronjob_queues_the_jobs_it_makes(tmp_path: Path) -> None:
    p = policy(tmp_path)
    cron = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {}}}}}
    out, change = send_to_queue(cron, "CronJob", profile(p), p.first)
    assert change is not None
    assert out == {
        "kind": "CronJob",
        "spec": {
            "jobTemplate": {
                "metadata": {"labels": QUEUED},
                "spec": {"template": {}, "suspend": True},
            }
        },
    }


def test_a_pod_is_labelled_and_gated_not_suspended(tmp_path: Path) -> None:
    p = policy(tmp_path)
    out, change = send_to_queue({"kind": "Pod", "metadata": {}}, "Pod", profile(p), p.first)
    assert change is not None
    gates = [{"name": ADMISSION_GATE}]
    assert out == {
        "kind": "Pod",
        "metadata": {"labels": QUEUED},
        "spec": {"schedulingGates": gates},
    }
    assert send_to_queue(out, "Pod", profile(p), p.first) == (out, None)  # a fixed point


def test_an_operators_kind_is_suspended_where_its_entry_says(tmp_path: Path) -> None:
    p = policy(tmp_path)
    ray = {"kind": "RayJob", "spec": {}}
    out, change = send_to_queue(ray, "RayJob", profile(p), p.first, suspend=("spec", "suspend"))
    assert change is not None
    assert out == {"kind": "RayJob", "metadata": {"labels": QUEUED}, "spec": {"suspend": True}}


def test_a_profile_without_a_queue_leaves_the_object_alone(tmp_path: Path) -> None:
    p = policy(tmp_path)
    assert send_to_queue(JOB, "Job", profile(p, "plain"), p.first) == (JOB, None)


def test_a_jobs_pod_made_by_the_job_controller_is_queued_with_its_job(tmp_path: Path) -> None:
    p = policy(tmp_path)
    pod = {"kind": "Pod", "metadata": {"name": "train-x"}}
    owners = ({"kind": "Job", "name": "train", "uid": "u1", "controller": True},)
    job = Meta("Job", "ml", "train", "u1", {QUEUE_LABEL: "gpu", POLICY_LABEL: "p"}, {})
    cluster = State([job])
    assert send_to_queue(pod, "Pod", profile(p), p.first, owners, None, JOBS, cluster) == (
        pod,
        None,
    )
    # a Job the cluster does not hold as queued and recorded: the Pod is queued itself
    for labels in ({QUEUE_LABEL: "gpu"}, {POLICY_LABEL: "p"}):
        unqueued = State([Meta("Job", "ml", "train", "u1", labels, {})])
        _, change = send_to_queue(pod, "Pod", profile(p), p.first, owners, None, JOBS, unqueued)
        assert change is not None
    _, change = send_to_queue(pod, "Pod", profile(p), p.first, owners, requester=JOBS)  # no view
    assert change is not None
    # the same owner written by a user: the Pod is queued itself
    out, change = send_to_queue(
        pod, "Pod", profile(p), p.first, owners, requester=Requester("alice")
    )
    assert change is not None and out["metadata"]["labels"] == QUEUED


def test_the_platforms_queue_controller_names_the_label(tmp_path: Path) -> None:
    kueue = {"identity": "system:serviceaccount:kueue-system:kueue", "queueLabel": "q.io/name"}
    assert queue_label(policy(tmp_path / "k", queues=[kueue]).first) == "q.io/name"
    assert queue_label(policy(tmp_path / "n").first) == QUEUE_LABEL
