"""What a real Kueue counted is what runs (``tests/e2e/kueue.py``), with the shipped
policies and ``test_kueue.py``'s queue profile ``gpu-queued``.

The attack review's chains, through the real apiserver, controllers and Kueue: a
CronJob's Jobs are queued and counted at their profile's size, and the CronJob cannot
leave its queue (its job template's label is frozen) while its user may still suspend it;
a profile edited between a run's counting and its Pods' creation leaves the Pods at the
counted size (the template's size record), while new runs get the edited profile; a
Deployment naming a queue profile without its queue is refused at apply.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from webhook.policy.loader import load_policy

from .cluster import Cluster
from .devcluster import Runguard
from .kueue import QUEUE_LABEL, Kueue, condition
from .runs import (
    Webhook,
    rule_ids,
    shipped_on_the_whole_path,
    until,
)
from .test_kueue import (
    QUEUE,
    QUEUED_PROFILE,
    QUEUED_REQUESTS,
    QUOTAS,
    admitted,
    create,
    finish,
    resource_flavors,
    run_job,
    running_pod,
    started,
    with_queued_profile,
)
from .test_trust import RUN, WAIT, get, user

pytestmark = pytest.mark.e2e

# The cronjob-controller looks every 10 s and a schedule fires on the minute.
CRON_WAIT = 2 * WAIT


@pytest.fixture(scope="module")
def served(
    cluster: Cluster, webhook: Webhook, tmp_path_factory: Any
) -> Iterator[tuple[Kueue, Runguard]]:
    """As ``test_kueue.kueue``, with the runguard server (its policy directory edited)."""
    base = tmp_path_factory.mktemp("kueue-counted")
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base / "runguard", with_queued_profile(base), serve_args=state)
    with shipped_on_the_whole_path(webhook, cluster, server):
        with Kueue(cluster, base / "kueue").running(*resource_flavors()) as running:
            yield running, server


@pytest.fixture
def team(served: tuple[Kueue, Runguard]) -> Iterator[str]:
    with served[0].team("t-counted", QUEUE, QUOTAS) as name:
        yield name


def requests_of(obj: dict[str, Any]) -> dict[str, str]:
    spec = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]
    found: dict[str, str] = spec["containers"][0]["resources"]["requests"]
    return found


def counted(workload: dict[str, Any]) -> dict[str, str]:
    """What Kueue counted for one Pod of the Workload's one podset."""
    (podset,) = workload["spec"]["podSets"]
    found: dict[str, str] = podset["template"]["spec"]["containers"][0]["resources"]["requests"]
    return found


def test_a_cronjobs_jobs_are_queued_counted_and_it_cannot_leave_its_queue(
    cluster: Cluster, served: tuple[Kueue, Runguard], team: str
) -> None:
    kueue = served[0]
    mallory = user(cluster)
    job = run_job("nightly", "gpu-queued", queue=None)
    cron = {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "labels": dict(RUN)},
            "spec": {"schedule": "* * * * *", "concurrencyPolicy": "Forbid",
                     "jobTemplate": {"spec": job["spec"]}}}  # fmt: skip
    made = mallory.kubectl("create", "-n", team, "-f", "-", input=json.dumps(cron))
    assert made.returncode == 0, made.stderr
    stored = get(cluster, team, "cronjob/nightly")
    assert stored["spec"]["jobTemplate"]["metadata"]["labels"][QUEUE_LABEL] == QUEUE
    assert stored["spec"]["jobTemplate"]["spec"]["suspend"] is True
    # her CronJob cannot leave its queue: the job template's label and suspend are frozen
    out = [{"op": "remove", "path": "/spec/jobTemplate/metadata/labels/kueue.x-k8s.io~1queue-name"},
           {"op": "replace", "path": "/spec/jobTemplate/spec/suspend", "value": False}]  # fmt: skip
    left = mallory.kubectl("patch", "-n", team, "cronjob/nightly", "--type=json",
                           "-p", json.dumps(out))  # fmt: skip
    assert left.returncode != 0 and rule_ids(left.stderr) == {"queue.bypassed"}, left.stderr

    def fired() -> str | None:
        jobs = get(cluster, team, "jobs")["items"]
        owned = [
            j["metadata"]["name"]
            for j in jobs
            if any(o["kind"] == "CronJob" for o in j["metadata"].get("ownerReferences", []))
        ]
        return owned[0] if owned else None

    name = until("the CronJob fires", fired, CRON_WAIT)
    fired_job = get(cluster, team, f"job/{name}")
    assert fired_job["metadata"]["labels"][QUEUE_LABEL] == QUEUE
    workload = admitted(kueue, team, name)
    assert counted(workload) == QUEUED_REQUESTS
    started(cluster, team, name)
    assert requests_of(running_pod(cluster, team, name)) == QUEUED_REQUESTS
    # and she may still suspend and resume her own CronJob
    for value in (True, False):
        patch = json.dumps({"spec": {"suspend": value}})
        done = mallory.kubectl("patch", "-n", team, "cronjob/nightly", "--type=merge", "-p", patch)
        assert done.returncode == 0, done.stderr
    mallory.kubectl("delete", "-n", team, "cronjob/nightly", "--wait=false")


def test_a_profile_edited_after_counting_leaves_the_pods_at_the_counted_size(
    cluster: Cluster, served: tuple[Kueue, Runguard], team: str
) -> None:
    kueue, server = served
    for name in ("fill-a100", "fill-t4"):  # every GPU of the team's queue taken
        create(cluster, team, run_job(name, "gpu-queued", queue=None))
        admitted(kueue, team, name)
    first = running_pod(cluster, team, "fill-a100")
    create(cluster, team, run_job("counted", "gpu-queued", queue=None))

    def waiting() -> dict[str, Any] | None:
        workload = kueue.workload_of(team, "counted")
        found = condition(workload, "QuotaReserved") if workload else None
        return workload if found and found["status"] == "False" else None

    assert counted(until("Kueue counts the run and finds no room", waiting, WAIT)) == (
        QUEUED_REQUESTS
    )
    profile_file = server.policy_dir / "queued-profile.yaml"
    edited = json.loads(json.dumps(QUEUED_PROFILE))
    edited["spec"]["resources"]["requests"]["cpu"] = "6"  # the admin's legal edit
    profile_file.write_text(yaml.safe_dump(edited))
    try:
        digest = load_policy(server.policy_dir).digest
        until("runguard serves the edited profile",
              lambda: server.readyz()[1].get("policy", {}).get("digest") == digest or None,
              WAIT)  # fmt: skip
        finish(cluster, team, first)
        workload = admitted(kueue, team, "counted")
        started(cluster, team, "counted")
        pod = running_pod(cluster, team, "counted")
        assert requests_of(pod) == counted(workload) == QUEUED_REQUESTS
        # a new run gets the profile as it is now
        create(cluster, team, run_job("after", "gpu-queued", queue=None))
        assert requests_of(get(cluster, team, "job/after"))["cpu"] == "6"
    finally:
        profile_file.write_text(yaml.safe_dump(QUEUED_PROFILE))


def test_a_deployment_of_a_queue_profile_without_its_queue_is_refused_at_apply(
    cluster: Cluster, served: tuple[Kueue, Runguard], team: str
) -> None:
    labels = {**RUN, "app": "serve", "dhcore/template": "gpu-queued"}
    main = {"name": "main", "image": "python:3.11"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [main]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "serve", "labels": dict(RUN)},
                  "spec": {"selector": {"matchLabels": {"app": "serve"}},
                           "template": template}}  # fmt: skip
    sent = json.dumps(deployment)
    refused = user(cluster).kubectl("create", "-n", team, "-f", "-", input=sent)
    assert refused.returncode != 0, refused.stderr
    assert rule_ids(refused.stderr) == {"queue.kind"}, refused.stderr
    assert "run the work as a Job" in refused.stderr
