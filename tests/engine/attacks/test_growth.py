"""A run grown after admission: the size its queue counted is the size that runs.

An attack review tried, as a user with ``edit`` in the run namespace, each way the API
offers to grow a run after it was admitted: ``pods/resize`` of a Pod of an exact
profile (1xa100: cpu 8, memory 32Gi), the resources of a suspended Job's template while
it waits in its queue, pod-level ``spec.resources`` and an ``emptyDir``'s ``sizeLimit``.
A range profile was held (``profile.range``), an exact one was not: each step below is
now refused as ``resources.grown`` (``rules/growth.py``), and the legitimate changes (a
resize towards the profile, Kueue's own resize of the Job it holds) go through."""

from __future__ import annotations

import copy
from typing import Any

from harness.cluster_state import State
from harness.growth import EXACT, exact_policy, resize
from harness.shipped import ALICE, CORE, created, pod, rules, update
from harness.templates import GPU, KUEUE, run_job

from webhook.engine import evaluate
from webhook.engine.context import Context

GROWN = "resources.grown"


def exact_run(policy: Any) -> dict[str, Any]:
    decision = evaluate(pod(labels=EXACT), policy, namespace="ml", context=Context(CORE, State([])))
    assert decision.allowed, decision.message()
    return decision.object


def resized(stored: dict[str, Any], **values: str) -> dict[str, Any]:
    """``kubectl patch --subresource resize``: requests and limits set alike."""
    new = copy.deepcopy(stored)
    resources = new["spec"]["containers"][0]["resources"]
    for part in ("requests", "limits"):
        resources.setdefault(part, {}).update(values)
    return new


def test_a_resize_beyond_an_exact_profile_is_refused() -> None:
    """cpu 4 -> 16 and memory 16Gi -> 24Gi, under the maximums (18, 66Gi): a range
    profile's run was held, an exact one's was judged against the maximums only (the
    mutating webhook keeps a resize it cannot turn back into the running spec)."""
    policy = exact_policy()
    stored = exact_run(policy)
    judged = resize(resized(stored, cpu="16", memory="24Gi"), stored, ALICE, policy)
    assert not judged.allowed
    assert {v.path for v in judged.violations if v.rule == GROWN} == {
        "spec.containers[0].resources.requests.cpu",
        "spec.containers[0].resources.requests.memory",
    }


def test_a_resize_that_keeps_or_nears_the_profile_is_allowed() -> None:
    policy = exact_policy()
    stored = exact_run(policy)
    limits = resize(resized(stored, memory="16Gi"), stored, ALICE, policy)
    assert limits.allowed, limits.message()  # the limit resized, the profile's request kept
    off = copy.deepcopy(stored)  # a run admitted at 12 cores before the profile said 4
    off["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "12"
    nearer = resize(resized(off, cpu="10"), off, ALICE, policy)
    assert nearer.allowed, nearer.message()
    farther = resize(resized(off, cpu="14"), off, ALICE, policy)
    assert GROWN in rules(farther)


def test_pod_level_resources_above_the_containers_are_refused() -> None:
    policy = exact_policy()
    stored = exact_run(policy)
    grown = resized(stored, memory="16Gi")
    grown["spec"]["resources"] = {"requests": {"cpu": "16"}, "limits": {"memory": "16Gi"}}
    judged = resize(grown, stored, ALICE, policy)
    assert [v.path for v in judged.violations if v.rule == GROWN] == ["spec.resources.requests.cpu"]


def test_a_memory_backed_volume_grown_past_the_run_is_refused() -> None:
    base = pod(labels=GPU)
    base["spec"]["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory",
                                                                "sizeLimit": "8Gi"}})  # fmt: skip
    stored = created(base, CORE)

    def sized(limit: str) -> Any:
        new = copy.deepcopy(stored)
        new["spec"]["volumes"][-1]["emptyDir"]["sizeLimit"] = limit
        return update(new, stored, ALICE)[1]

    assert sized("32Gi").allowed  # within the profile's memory limit (64Gi)
    refused = sized("128Gi")
    assert [v.path for v in refused.violations if v.rule == GROWN] == [
        "spec.volumes[1].emptyDir.sizeLimit"
    ]


def suspended_job() -> dict[str, Any]:
    job = run_job()
    job["spec"]["suspend"] = True
    return created(job, CORE)


def edited(stored: dict[str, Any], part: str, **values: str) -> dict[str, Any]:
    """The suspended Job's template resources edited, and a toleration of the editor's own
    (scheduling directives are editable too): ``/mutate`` cannot turn it back into the
    stored template, so ``/validate`` alone judges it."""
    new = copy.deepcopy(stored)
    spec = new["spec"]["template"]["spec"]
    spec["containers"][0]["resources"][part].update(values)
    spec["tolerations"] = [*spec.get("tolerations", []), {"key": "spot", "operator": "Exists"}]
    return new


def test_a_users_edit_of_a_suspended_jobs_template_resources_is_refused() -> None:
    """The template's resources are editable while the Job is suspended (Kubernetes 1.36):
    alice lowers the GPU to 0, her queue counts none, and the profile gave each Pod one."""
    stored = suspended_job()
    new = edited(stored, "requests", **{"nvidia.com/gpu": "0"})
    new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0"
    _, judged = update(new, stored, ALICE)
    assert not judged.allowed
    assert {v.path for v in judged.violations if v.rule == GROWN} == {
        "spec.template.spec.containers[0].resources.requests.nvidia.com/gpu",
        "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu",
    }


def test_the_queues_own_resize_of_a_suspended_job_is_allowed() -> None:
    stored = suspended_job()
    new = edited(stored, "requests", cpu="4")
    _, by_kueue = update(new, stored, KUEUE)
    assert GROWN not in rules(by_kueue)
    _, by_alice = update(new, stored, ALICE)
    assert GROWN in rules(by_alice)
