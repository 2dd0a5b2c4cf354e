"""A queue profile's run skipping the queue through a forged controller owner.

A user's Job (or bare Pod) naming a queue profile, with a controller ``ownerReference``
to another Job of hers, was treated as queued through its owner: ``/mutate`` wrote the
profile's A100 but no queue label and no suspend, and the backstop accepted it, a GPU
run that never waits in the queue. Only the owner's own controller (the job-controller,
an operator for its kinds) is now believed (``rules/queue_profile.queued_as_a_whole``);
the attack review that found it kept these chains."""

from __future__ import annotations

from harness.cluster_state import Meta, State, owner
from harness.shipped import ALICE
from harness.templates import QUEUE, QUEUED, queue_policy, run_job

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context

# alice's own tiny Job, really in the namespace (the garbage collector keeps what it owns)
TINY = Meta("Job", "ml", "tiny", "uid-tiny")


def _owned_by_tiny_job() -> dict:
    job = run_job(QUEUED)  # names the queue profile queued-a100 (1 A100)
    job["metadata"]["ownerReferences"] = [owner("Job", "tiny", "uid-tiny")]
    return job


def test_a_queue_profiles_job_with_a_forged_controller_owner_is_still_queued() -> None:
    """alice creates a Job naming the queue profile with a controller ownerReference
    to another Job of hers: queued_as_a_whole believes the owner is what Kueue admits,
    so /mutate writes the profile's A100 but no queue label and no suspend, and the
    backstop (_not_queued) accepts it: a GPU run that never waits in the queue."""
    policy = queue_policy()
    context = Context(ALICE, State([TINY]))
    decision = evaluate(_owned_by_tiny_job(), policy, namespace="ml", context=context)
    stored = decision.object
    gpu = stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpu["nvidia.com/gpu"] == "1"  # the profile's device is there
    queued = stored["metadata"]["labels"].get(QUEUE) == "team-a"
    suspended = stored["spec"].get("suspend") is True
    assert not decision.allowed or (queued and suspended), (
        "alice's A100 Job is admitted unqueued and unsuspended"
    )


def test_a_queue_profiles_job_that_skipped_mutate_with_a_forged_owner_is_refused() -> None:
    """The same Job sent straight to /validate (mutate bypassed): the backstop asks
    send_to_queue, which skips owned objects, so nothing says it is unqueued."""
    policy = queue_policy()
    context = Context(ALICE, State([TINY]))
    made = mutate(_owned_by_tiny_job(), policy, namespace="ml", context=context).object
    made["metadata"]["labels"].pop(QUEUE, None)
    made["spec"]["suspend"] = False
    judged = validate(made, policy, namespace="ml", context=context)
    assert not judged.allowed, "validate admits a queue profile's Job that names no queue"


def test_a_queue_profiles_bare_pod_with_a_forged_job_owner_is_still_queued() -> None:
    """The same forgery on a bare Pod (Kueue's Pod integration counts those one by one):
    a controller ownerReference to alice's tiny Job and the Pod carries no queue label."""
    from harness.shipped import pod

    policy = queue_policy()
    context = Context(ALICE, State([TINY]))
    bare = pod(labels=QUEUED)
    bare["metadata"]["ownerReferences"] = [owner("Job", "tiny", "uid-tiny")]
    decision = evaluate(bare, policy, namespace="ml", context=context)
    limits = decision.object["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    queued = decision.object["metadata"]["labels"].get(QUEUE) == "team-a"
    assert not decision.allowed or queued, "alice's A100 Pod is admitted with no queue label"
