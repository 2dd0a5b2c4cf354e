"""The attack review of the merged queue-size, run-time, DRA, floor and reports work.

Tried offline with the shipped policies (and a run-time and a queue profile where the
shipped ones have none), as a user with ``edit`` in the run namespace and as a project
admin: every container kind, CREATE, UPDATE and subresources, volume sources, secret
references, the size record, the queue's run-time label and ``activeDeadlineSeconds``.
Three chains got through: a resize of a container other than the main one, and naming
another main container before a resize (both ``resources.grown`` now), and a Job's
retries, each Pod with the full run time (still open: the Job's own deadline is an
object-level mutation). The blocked chains are kept as guards."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from harness import written_policy
from harness.attack_chains import update as update_under
from harness.cluster_state import State
from harness.growth import EXACT, exact_policy, resize
from harness.profiles import PROFILES, RUN_POLICY, run
from harness.run_time import TIMED, queued_job, queued_policy
from harness.shipped import ALICE, CORE, SHIPPED, created, pod, rules, update
from harness.templates import GPU, run_job

from webhook.engine import evaluate, validate
from webhook.engine.context import Context
from webhook.engine.pod import DEFAULT_CONTAINER_ANNOTATION
from webhook.engine.rules.runtime import MAX_EXEC_TIME
from webhook.keys import MAIN_CONTAINER_ANNOTATION, SIZE_RECORD

GROWN = "resources.grown"
FORGED = json.dumps({"profile": "1xa100", "requests": {"nvidia.com/gpu": "2"},
                     "limits": {"nvidia.com/gpu": "2"}})  # fmt: skip


def by_alice(obj: dict[str, Any]) -> Any:
    return evaluate(obj, SHIPPED, namespace="ml", context=Context(ALICE, State([])))


def two_containers() -> tuple[Any, dict[str, Any]]:
    """A run of an exact profile (cpu 4, 16Gi) with a second container and a sidecar."""
    policy = exact_policy()
    base = pod(labels=EXACT)
    base["spec"]["containers"].append({"name": "helper", "image": "python:3.11"})
    base["spec"]["initContainers"] = [{"name": "side", "image": "envoy", "restartPolicy": "Always"}]
    decision = evaluate(base, policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    return policy, decision.object


# --- through, now refused ----------------------------------------------------------------


@pytest.mark.parametrize(("where", "index"), [("containers", 1), ("initContainers", 0)])
def test_a_resize_growing_a_container_other_than_the_main_one_is_refused(
    where: str, index: int
) -> None:
    """``pods/resize`` of the helper (or the sidecar) from 100m to 9 cores: under the
    maximums (18), and the run grows from the 4.2 cores its queue counted to 13."""
    policy, stored = two_containers()
    grown = copy.deepcopy(stored)
    resources = grown["spec"][where][index]["resources"]
    resources["requests"]["cpu"] = resources.setdefault("limits", {})["cpu"] = "9"
    judged = resize(grown, stored, ALICE, policy)
    assert not judged.allowed
    assert {v.path for v in judged.violations if v.rule == GROWN} == {
        f"spec.{where}[{index}].resources.requests.cpu"
    }
    lowered = copy.deepcopy(stored)
    lowered["spec"][where][index]["resources"]["requests"]["memory"] = "128Mi"
    assert resize(lowered, stored, ALICE, policy).allowed


@pytest.mark.parametrize("key", [MAIN_CONTAINER_ANNOTATION, DEFAULT_CONTAINER_ANNOTATION])
def test_naming_another_main_container_on_update_is_refused(key: str) -> None:
    """First the helper is named the main container (a plain UPDATE of an annotation),
    then resized towards the profile's 4 cores: "coming closer" to the profile, and the
    container the profile sized keeps its 4 as well."""
    policy, stored = two_containers()
    renamed = copy.deepcopy(stored)
    renamed["metadata"].setdefault("annotations", {})[key] = "helper"
    judged = update_under(renamed, stored, policy, ALICE)
    assert [(v.rule, v.path) for v in judged.violations] == [(GROWN, "metadata.annotations")]
    assert "main container was main when it was admitted" in judged.message()


# --- a Job's retries: closed by the Job's own run time --------------------------------------


def test_a_jobs_retries_do_not_hold_the_run_past_its_maximum(tmp_path: Path) -> None:
    """Each Pod of a Job gets the profile's run time, and the Job retries a Pod that hit
    it up to ``backoffLimit`` times: 1,000 retries of an hour hold the devices 1,000
    hours under a maximum of 8. The Job's own ``activeDeadlineSeconds`` bounds them all."""
    timed = RUN_POLICY.rstrip(" ") + "      runTime: {maximum: 86400}\n"
    policy = written_policy(
        tmp_path, {"runpolicy.yaml": timed, "profiles.yaml": PROFILES, "timed.yaml": TIMED}
    )
    template = run("team-b", "notebook")
    labels = template["metadata"]["labels"]
    spec = {**template["spec"], "restartPolicy": "Never"}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train", "namespace": "team-b", "labels": labels},
           "spec": {"backoffLimit": 1000, "template": {"metadata": {"labels": labels},
                                                       "spec": spec}}}  # fmt: skip
    decision = evaluate(job, policy, namespace="team-b")
    assert decision.allowed, decision.message()
    assert decision.object["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 3600
    assert decision.object["spec"].get("activeDeadlineSeconds") == 28800


# --- blocked: kept as guards ---------------------------------------------------------------


def test_an_init_containers_root_and_privilege_are_stripped() -> None:
    run_pod = pod(labels=GPU)
    run_pod["spec"]["initContainers"] = [
        {"name": "i", "image": "x", "securityContext": {"privileged": True, "runAsUser": 0}}
    ]
    decision = by_alice(run_pod)
    assert decision.allowed, decision.message()
    context = decision.object["spec"]["initContainers"][0]["securityContext"]
    assert (context["privileged"], context["runAsUser"]) == (False, 8877)


def test_a_sidecars_gpu_counts_with_the_run() -> None:
    run_pod = pod(labels=GPU)
    two = {"nvidia.com/gpu": "2"}
    sidecar = {"name": "s", "image": "x", "restartPolicy": "Always",
               "resources": {"requests": two, "limits": two}}  # fmt: skip
    run_pod["spec"]["initContainers"] = [sidecar]
    assert "resources.exceeded" in rules(by_alice(run_pod))


def test_a_sidecars_secret_a_pull_secret_and_a_projected_secret_are_stripped() -> None:
    run_pod = pod(labels=GPU)
    sidecar = {"name": "s", "image": "x", "restartPolicy": "Always",
               "envFrom": [{"secretRef": {"name": "theirs"}}]}  # fmt: skip
    run_pod["spec"]["initContainers"] = [sidecar]
    run_pod["spec"]["imagePullSecrets"] = [{"name": "their-registry"}]
    run_pod["spec"]["volumes"].append(
        {"name": "p", "projected": {"sources": [{"secret": {"name": "theirs"}}]}}
    )
    decision = by_alice(run_pod)
    assert decision.allowed, decision.message()
    spec = decision.object["spec"]
    assert "envFrom" not in spec["initContainers"][0]
    assert not spec.get("imagePullSecrets")
    assert all(v["name"] != "p" or not v["projected"]["sources"] for v in spec.get("volumes", []))


def test_a_debug_container_with_root_privilege_and_secrets_is_refused() -> None:
    stored = created(pod(labels=GPU), CORE)
    debugged = copy.deepcopy(stored)
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "image": "busybox",
         "securityContext": {"privileged": True, "runAsUser": 0},
         "envFrom": [{"secretRef": {"name": "theirs"}}],
         "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "theirs", "key": "k"}}}]}
    ]  # fmt: skip
    _, judged = update(debugged, stored, ALICE, subresource="ephemeralcontainers")
    assert {"secrets.forbidden", "security.privileged", "security.root"} <= rules(judged)


def test_an_ephemeral_volume_cloning_a_snapshot_and_a_csi_volume_are_kept_out() -> None:
    run_pod = pod(labels=GPU)
    run_pod["spec"]["volumes"].append({"name": "clone", "ephemeral": {"volumeClaimTemplate": {
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io",
                                   "kind": "VolumeSnapshot", "name": "theirs"}}}}})  # fmt: skip
    decision = by_alice(run_pod)
    assert decision.allowed, decision.message()
    assert "clone" not in {v["name"] for v in decision.object["spec"].get("volumes", [])}
    run_pod["spec"]["volumes"].append({"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}})
    assert "volumes.forbidden-type" in rules(by_alice(run_pod))


def test_a_size_record_forged_at_create_or_changed_on_update_does_not_hold() -> None:
    forged = pod(labels=GPU)
    forged["metadata"]["annotations"] = {SIZE_RECORD: FORGED}
    decision = by_alice(forged)
    assert SIZE_RECORD not in decision.object["metadata"].get("annotations", {})
    assert decision.object["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    stored = created(pod(labels=GPU), CORE)
    added = copy.deepcopy(stored)
    added["metadata"].setdefault("annotations", {})[SIZE_RECORD] = FORGED
    assert "resources.size-record" in rules(update(added, stored, ALICE)[1])
    job = run_job()
    job["spec"]["suspend"] = True
    suspended = created(job, CORE)
    for edit in ("raised", "removed"):
        edited = copy.deepcopy(suspended)
        annotations = edited["spec"]["template"]["metadata"]["annotations"]
        if edit == "raised":
            annotations[SIZE_RECORD] = annotations[SIZE_RECORD].replace('gpu":"1"', 'gpu":"2"')
        else:
            del annotations[SIZE_RECORD]
        assert "resources.size-record" in rules(update(edited, suspended, ALICE)[1]), edit


def test_a_queued_runs_own_longer_execution_time_is_overwritten_or_refused(
    tmp_path: Path,
) -> None:
    policy = queued_policy(tmp_path)
    job = queued_job()
    job["metadata"]["labels"][MAX_EXEC_TIME] = "99999999"
    decision = evaluate(job, policy, namespace="ml")
    assert decision.allowed and decision.object["metadata"]["labels"][MAX_EXEC_TIME] == "28800"
    assert not validate(job, policy, namespace="ml").allowed  # /mutate skipped
