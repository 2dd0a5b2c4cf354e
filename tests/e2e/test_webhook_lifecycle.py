"""Scenarios 7 and 8: runguard stopped and restarted under a live cluster, and its
policy edited while it serves.

Both disturb the session's runguard and put it back before they end (the ``runguard``
fixture checks again afterwards).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client

from webhook.policy.loader import load_policy

from .cluster import Cluster
from .runs import (
    Webhook,
    apply,
    controller,
    exists,
    get,
    kubectl_warnings,
    messy_run_pod,
    noncompliant_run_pod,
    pod,
    poll,
    run_pod,
)

pytestmark = pytest.mark.e2e


def registrations(cluster: Cluster) -> dict[str, Any]:
    """The webhook configurations as stored: name -> (resourceVersion, webhooks)."""
    done = cluster.kubectl(
        "get", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        "-l", "app.kubernetes.io/name=runguard", "-o", "json", check=True,
    )  # fmt: skip
    return {
        f"{item['kind']}/{item['metadata']['name']}": (
            item["metadata"]["resourceVersion"],
            item["webhooks"],
        )
        for item in json.loads(done.stdout)["items"]
    }


# --- 7. stopped, then restarted ---------------------------------------------------------


def test_stopped_webhook_fails_closed_for_runs_then_recovers(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    registered = registrations(cluster)
    assert len(registered) == 2
    port = runguard.port
    runguard.stop()
    try:
        refused = apply(cluster, namespace, messy_run_pod("train"))
        assert refused.returncode != 0
        assert 'failed calling webhook "mutate.runguard.io"' in refused.stderr
        assert "connection refused" in refused.stderr
        assert not exists(cluster, namespace, "pod", "train")

        with pytest.raises(client.ApiException) as raised:
            client.CoreV1Api(api_client).create_namespaced_pod(namespace, run_pod("sdk-run"))
        assert raised.value.status == 500
        assert (
            'failed calling webhook "mutate.runguard.io"'
            in json.loads(raised.value.body)["message"]
        )

        # Pods that are not runs never reach runguard.
        plain = apply(cluster, namespace, pod("plain", {"app": "tool"}))
        assert plain.returncode == 0, plain.stderr
        # Run controllers fail closed too (docs/dev/guarantees.md, "Ownership"): a run Job waits for
        # runguard, a controller that is not a run does not.
        job = apply(cluster, namespace, controller("Job", "job", noncompliant_run_pod("x")))
        assert job.returncode != 0
        assert 'failed calling webhook "mutate-controllers.runguard.io"' in job.stderr
        tool = apply(cluster, namespace, controller("Job", "tool", pod("t", {"app": "tool"})))
        assert tool.returncode == 0, tool.stderr
    finally:
        runguard.start()

    assert runguard.port == port
    created = apply(cluster, namespace, messy_run_pod("train"))
    assert created.returncode == 0, created.stderr
    assert kubectl_warnings(created.stderr)[0].startswith("runguard: profile 1xa100 applied")
    stored = get(cluster, namespace, "pod", "train")["spec"]
    assert stored["securityContext"]["runAsUser"] == 8877
    assert stored["priorityClassName"] == "high"
    denied = apply(cluster, namespace, noncompliant_run_pod("bad"))
    assert denied.returncode != 0 and "validate.runguard.io" in denied.stderr
    # Nothing in the cluster was touched to get there.
    assert registrations(cluster) == registered


# --- 8. policy edited while serving ------------------------------------------------------


def dry_run_cpu(core: Any, namespace: str) -> str:
    """The main container's cpu request runguard gives a run naming no profile."""
    probe = core.create_namespaced_pod(namespace, run_pod("probe"), dry_run="All")
    cpu: str = probe.spec.containers[0].resources.requests["cpu"]
    return cpu


def test_policy_edit_applies_without_restart_and_a_broken_one_changes_nothing(
    cluster: Cluster, api_client: Any, runguard: Webhook, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    master = runguard.pid
    excluded_now = f"{namespace}-x"
    cluster.kubectl("create", "namespace", excluded_now, check=True)
    assert dry_run_cpu(core, namespace) == "1"

    # An admin edits the file: the default profile asks for 3 cores, and one more
    # namespace is excluded (the webhook configurations still send it to runguard).
    edited = runguard.policy()
    edited[0]["spec"]["excludeNamespaces"].append(excluded_now)
    default = next(
        d for d in edited if d["kind"] == "Profile" and d["metadata"]["name"] == "default"
    )
    default["spec"]["resources"]["requests"]["cpu"] = "3"
    runguard.write_policy(edited)
    poll("the edited default profile", lambda: dry_run_cpu(core, namespace) == "3")
    assert runguard.pid == master and runguard.running  # no restart
    good_digest = load_policy(runguard.policy_dir).digest
    assert good_digest != runguard.digest
    runguard.wait_for_policy(good_digest)  # one worker answered; the apiserver may call either
    status, ready = runguard.readyz()
    assert (status, ready["status"], ready["policy"]["digest"]) == (200, "ready", good_digest)

    rootful = run_pod("rootful", securityContext={"runAsUser": 0})
    done = apply(cluster, excluded_now, rootful)
    assert done.returncode == 0, done.stderr
    assert kubectl_warnings(done.stderr) == []
    assert get(cluster, excluded_now, "pod", "rootful")["spec"]["securityContext"] == {
        "runAsUser": 0
    }
    event = cluster.wait_for_audit_event(
        verb="create", resource="pods", namespace=excluded_now, name="rootful"
    )
    called = json.loads(event["annotations"]["mutation.webhook.admission.k8s.io/round_0_index_0"])
    assert called == {
        "configuration": "runguard",
        "webhook": "mutate.runguard.io",
        "mutated": False,
    }

    # A broken edit of the edited file: maximums below what the 1xa100 profile asks for.
    broken = copy.deepcopy(edited)
    broken[0]["spec"]["resources"]["maximums"]["memory"] = "16Gi"
    runguard.write_policy(broken)
    runguard.wait_for_workers(lambda ready: "rejected" in ready, "the broken edit in /readyz")
    status, ready = runguard.readyz()
    assert (status, ready["status"]) == (200, "degraded")
    errors = ready["rejected"]["errors"]
    assert errors and all(error.startswith(f"{runguard.policy_file}:") for error in errors)
    assert any('"48Gi" is above the maximum "16Gi"' in error for error in errors)
    poll("the rejection in runguard's log", lambda: "rejected, the last good one keeps serving"
         in runguard.log.read_text())  # fmt: skip

    # Nothing changed: still the good edit, and a 48Gi sidecar is not clamped to 16Gi.
    assert dry_run_cpu(core, namespace) == "3"
    sidecar = {"name": "sidecar", "image": "busybox:1.36",
               "resources": {"limits": {"memory": "48Gi"}}}  # fmt: skip
    big = run_pod("big", containers=[{"name": "main", "image": "python:3.11"}, sidecar])
    created = core.create_namespaced_pod(namespace, big, dry_run="All")
    assert created.spec.containers[1].resources.limits["memory"] == "48Gi"

    runguard.restore_policy()
    assert dry_run_cpu(core, namespace) == "1"
    assert runguard.pid == master


def readyz_answers(runguard: Webhook, connections: int = 24) -> list[dict[str, Any]]:
    """``/readyz`` over fresh connections, each served by whichever worker accepts it."""
    return [runguard.readyz()[1] for _ in range(connections)]


def last_decision_digest(runguard: Webhook) -> str:
    """The policy digest of runguard's latest admission decision (its JSON log)."""
    for line in reversed(runguard.log.read_text().splitlines()):
        if line.startswith("{") and '"endpoint":"mutate"' in line:
            digest: str = json.loads(line)["policy"]
            return digest
    raise AssertionError("no decision in runguard's log")


def test_a_broken_edit_keeps_the_last_good_policy_in_every_worker(
    api_client: Any, runguard: Webhook, namespace: str
) -> None:
    """A worker that served nothing while a good edit was on disk (the apiserver keeps
    one connection alive, to one worker) serves that good edit, not the policy before
    it, when the next edit is broken: /readyz agrees with itself over every worker."""
    core = client.CoreV1Api(api_client)
    assert {a["policy"]["digest"] for a in readyz_answers(runguard)} == {runguard.digest}

    edited = runguard.policy()
    default = next(
        d for d in edited if d["kind"] == "Profile" and d["metadata"]["name"] == "default"
    )
    default["spec"]["resources"]["requests"]["cpu"] = "3"
    runguard.write_policy(edited)
    poll("the edited default profile", lambda: dry_run_cpu(core, namespace) == "3")
    good = last_decision_digest(runguard)
    assert good != runguard.digest

    edited[0]["spec"]["resources"]["maximums"]["memory"] = "16Gi"
    runguard.write_policy(edited)
    runguard.wait_for_workers(lambda ready: "rejected" in ready, "every worker rejecting it")
    served = {answer["policy"]["digest"] for answer in readyz_answers(runguard)}
    assert served == {good}, f"workers serve {served}; the last good policy is {good}"
