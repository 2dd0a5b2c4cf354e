"""Kueue beside the platform through the real apiserver, with the shipped policies.

The platform creates its run Job suspended and naming its queue; Kueue, as its own
ServiceAccount (``system:serviceaccount:kueue-system:kueue-controller-manager``),
starts it the way its ``jobframework`` does: one update of the Job that unsuspends it,
merges the flavor's node labels into the template's ``nodeSelector``, appends the
flavor's toleration and labels the template with its podset. The job-controller then
creates the Pod on the flavor's node. A user with edit rights cannot do the same.
The same update shapes, built from Kueue's source, are judged in ``tests/test_queue.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .cluster import Cluster
from .runs import platform_identity, rule_ids
from .test_trust import (
    NODE_KEY,
    RUN,
    TAINT,
    container,
    get,
    platform_made,
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
