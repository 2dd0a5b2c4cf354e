"""``webhook/engine/rules/queue.py`` on its own: what a queue controller (Kueue) may change
of the platform's objects (``queue_kept``) and the two checks of ``QUEUE_CHECKS``,
``check_queue_bypass`` and ``check_queue_labels``, called directly on a ``Review``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from harness.pods import container, policy_of

from webhook.engine.context import Context, Requester
from webhook.engine.rules.queue import (
    QUEUE_BYPASSED,
    QUEUE_RESERVED_LABEL,
    check_queue_bypass,
    check_queue_labels,
    queue_kept,
)
from webhook.engine.subject import review
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import Policy

CORE = Requester("system:serviceaccount:digitalhub:core")
KUEUE = Requester("system:serviceaccount:kueue-system:kueue-controller-manager")
ALICE = Requester("alice", ("developers",))
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODSET = "kueue.x-k8s.io/podset"


def policy(tmp_path: Path) -> Policy:
    return policy_of(
        tmp_path,
        {
            "platform": {
                "identities": [CORE.username],
                "queues": [
                    {"identity": KUEUE.username, "reservedLabels": [PODSET]},
                ],
            }
        },
    )


def queued_job(*, suspend: bool = True, **template: Any) -> dict[str, Any]:
    """The platform's Job, as runguard recorded it, waiting in queue ``gpu``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"app": "run", QUEUE_LABEL: "gpu", POLICY_LABEL: "test"},
            "annotations": {
                REQUESTED_BY: CORE.username,
                PLATFORM_RECORD: "true",
                PLATFORM_POLICY: "test",
            },
        },
        "spec": {
            "suspend": suspend,
            "template": {
                "metadata": {"labels": {"app": "run"}},
                "spec": {"containers": [container()], **template},
            },
        },
    }


def update(p: Policy, old: dict[str, Any], new: dict[str, Any], who: Requester) -> Any:
    return review(new, p, "ml", old, Context(who, operation="UPDATE"))


def test_a_user_starting_a_queued_run_bypasses_the_queue(tmp_path: Path) -> None:
    p = policy(tmp_path)
    old = queued_job()
    found = check_queue_bypass(update(p, old, queued_job(suspend=False), ALICE))
    assert [(v.rule, v.path) for v in found] == [(QUEUE_BYPASSED, "spec.suspend")]


def test_a_user_moving_a_run_out_of_its_queue_bypasses_it(tmp_path: Path) -> None:
    p = policy(tmp_path)
    new = queued_job()
    del new["metadata"]["labels"][QUEUE_LABEL]
    found = check_queue_bypass(update(p, queued_job(), new, ALICE))
    assert [(v.rule, v.path) for v in found] == [
        (QUEUE_BYPASSED, f"metadata.labels[{QUEUE_LABEL}]")
    ]


def test_a_user_lifting_the_queues_gate_bypasses_it(tmp_path: Path) -> None:
    p = policy(tmp_path)
    gated = queued_job(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    found = check_queue_bypass(update(p, gated, queued_job(), ALICE))
    assert [(v.rule, v.path) for v in found] == [(QUEUE_BYPASSED, "spec.schedulingGates")]


def test_the_queue_and_the_platform_may_start_the_run(tmp_path: Path) -> None:
    p = policy(tmp_path)
    for who in (KUEUE, CORE):
        assert check_queue_bypass(update(p, queued_job(), queued_job(suspend=False), who)) == []


def test_a_users_other_edits_are_no_bypass(tmp_path: Path) -> None:
    p = policy(tmp_path)
    new = queued_job()
    new["metadata"]["annotations"]["note"] = "hello"
    assert check_queue_bypass(update(p, queued_job(), new, ALICE)) == []


def test_a_user_writing_the_queues_reserved_label_is_denied(tmp_path: Path) -> None:
    p = policy(tmp_path)
    new = queued_job()
    new["spec"]["template"]["metadata"]["labels"][PODSET] = "main"
    found = check_queue_labels(update(p, queued_job(), new, ALICE))
    assert [(v.rule, v.path) for v in found] == [
        (QUEUE_RESERVED_LABEL, f"spec.template.metadata.labels[{PODSET}]")
    ]
    assert check_queue_labels(update(p, queued_job(), new, KUEUE)) == []


def test_a_reserved_label_kept_as_it_was_is_not_judged_again(tmp_path: Path) -> None:
    p = policy(tmp_path)
    old = queued_job()
    old["spec"]["template"]["metadata"]["labels"][PODSET] = "main"
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["note"] = "hello"
    assert check_queue_labels(update(p, old, new, ALICE)) == []


def test_queue_kept_allows_only_starting_stopping_and_placing(tmp_path: Path) -> None:
    [queue] = policy(tmp_path).first.platform.queues
    old = queued_job()["spec"]
    placed = queued_job(
        suspend=False,
        nodeSelector={"flavor": "a100"},
        tolerations=[{"key": "gpu", "operator": "Exists"}],
        schedulingGates=[{"name": "kueue.x-k8s.io/topology"}],
    )["spec"]
    placed["parallelism"] = 2
    assert queue_kept(queue, old, placed)
    new_image = queued_job()["spec"]
    new_image["template"]["spec"]["containers"][0]["image"] = "evil:1"
    assert not queue_kept(queue, old, new_image)
