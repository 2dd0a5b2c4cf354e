"""Attacks through status subresources (``pods/status``, ``jobs/status``), which store
labels and annotations and are routed only when they change metadata: a record added to
a user's Job, a run Pod relabelled out of its RunPolicy.

The attacker is a data scientist with the ``edit`` ClusterRole in run namespaces. Each
test judges the request as the webhooks would, after the rendered matchConditions
(evaluated by CEL) have routed it.
"""

from __future__ import annotations

import copy
from typing import Any

from harness.attack_chains import DIGITALHUB, _hook, _status_routed, state, update
from harness.shipped import ALICE, CORE, rules

from webhook.engine import validate
from webhook.engine.context import Context
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY


def test_a_status_update_adding_a_record_to_a_users_job_reaches_runguard_and_is_undone() -> None:
    """Stopped: ``jobs/status`` stores labels and annotations; a user's unrouted Job (no
    run labels, no platform names, never stamped) given ``runguard.io/platform: "true"``
    and the Core's stamp through ``jobs/status`` would make every Pod the job-controller
    creates for it the platform's. The records condition routes it; /mutate puts the
    records back as they were, and /validate alone (mutation bypassed) refuses them."""
    old: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "j", "namespace": "ml", "uid": "j-1"},
           "spec": {"template": {"metadata": {"labels": {"app": "x"}},
                                 "spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}},
           "status": {"active": 1}}  # fmt: skip
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true"}
    for name in (manifests.MUTATING_CONTROLLERS_WEBHOOK, manifests.CONTROLLERS_WEBHOOK):
        assert _status_routed(_hook(DIGITALHUB, name), new, old, "jobs"), name
    # /mutate puts the records back as they were (none); /validate alone refuses them
    verdict = update(new, old, DIGITALHUB, ALICE, subresource="status")
    assert verdict.allowed, verdict.message()
    assert not verdict.object["metadata"].get("annotations", {}).get(PLATFORM_RECORD)
    assert not verdict.object["metadata"].get("annotations", {}).get(REQUESTED_BY)
    context = Context(ALICE, state(), "UPDATE", "status")
    raw = validate(new, DIGITALHUB, namespace="ml", old=old, context=context)
    assert not raw.allowed and "ownership.stamp" in rules(raw), raw.message()


def test_a_status_update_moving_a_run_pod_out_of_its_policy_reaches_runguard() -> None:
    """Stopped: ``pods/status`` relabelling a run out of every selector and dropping
    runguard's policy label is routed (the old object matches the objectSelector, and the
    labels changed) and refused as ``scope.labels``."""
    run = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}
    old: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ml", "uid": "p-1",
                        "labels": {**run, POLICY_LABEL: "digitalhub"},
                        "annotations": {REQUESTED_BY: "alice"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"app": "free"}
    hook = _hook(DIGITALHUB, manifests.VALIDATING_WEBHOOK)
    assert _status_routed(hook, new, old, "pods")
    context = Context(ALICE, state(), "UPDATE", "status")
    verdict = validate(new, DIGITALHUB, namespace="ml", old=old, context=context)
    assert not verdict.allowed and "scope.labels" in rules(verdict), verdict.message()
