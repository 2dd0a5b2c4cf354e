"""A shell opened into a Pod (``kubectl exec``, ``kubectl attach``): the same judgment as
a debug container (``ownership.debug``), on the Pod as the cluster holds it.

The engine's ``connect`` on the shipped policy, then ``webhook.serving.shells.review`` of a
CONNECT as the apiserver sends it, with the server's Pod read replaced by a function
(the server, its read and kubectl are tested against a real apiserver in
``tests/e2e/test_trust.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.shells import (
    Cluster,
    Reads,
    answer,
    as_pod,
    connect_request,
    shell,
    token_of,
    users_own_pod,
)
from harness.shipped import ALICE, CORE, SHIPPED, created, pod, rules

from webhook.serving import admission, shells
from webhook.serving.shells import PodLookup


@pytest.mark.parametrize("how", ["exec", "attach"])
def test_a_shell_in_the_platforms_run_is_the_platforms_to_open(how: str) -> None:
    run = created(pod(), CORE)
    denied = shell(ALICE, run, how)
    assert not denied.allowed and rules(denied) == {"ownership.debug"}
    assert f"kubectl {how}" in denied.message()
    assert shell(CORE, run, how).allowed


def test_a_shell_in_her_own_run_is_hers() -> None:
    mine = users_own_pod()
    for how in ("exec", "attach"):
        decision = shell(ALICE, mine, how)
        assert decision.allowed and not decision.violations


def test_what_makes_a_pod_the_platforms_without_its_record() -> None:
    """No record (a Pod created before runguard): what it names or runs as decides."""
    unrecorded = copy.deepcopy(pod())
    assert rules(shell(ALICE, unrecorded)) == {"ownership.debug"}  # its secret and claim
    as_core = users_own_pod()
    for key in ("annotations", "labels"):
        as_core["metadata"].pop(key, None)
    as_core["spec"]["serviceAccountName"] = "core"
    assert rules(shell(ALICE, as_core, namespace="digitalhub")) == {"ownership.debug"}
    assert shell(ALICE, as_core, namespace="ml").allowed  # another namespace's "core"


@pytest.mark.parametrize("how", ["portforward", "proxy"])
def test_a_port_into_the_platforms_run_is_the_platforms_to_open(how: str) -> None:
    """Inside the Pod's network namespace NetworkPolicies do not apply (Ray's job API on a
    head Pod runs what it is sent)."""
    assert rules(shell(ALICE, created(pod(), CORE), how)) == {"ownership.debug"}
    assert shell(ALICE, users_own_pod(), how).allowed


def test_a_subresource_that_opens_nothing_is_not_judged() -> None:
    decision = shell(ALICE, created(pod(), CORE), how="status")
    assert decision.allowed and not decision.violations


# --- the review of a CONNECT ----------------------------------------------------------------


def test_a_shell_review_reads_the_pod_and_judges_it() -> None:
    reads = Reads(PodLookup(created(pod(), CORE)))
    denied = answer(connect_request(ALICE), reads)
    assert reads.asked == [("ml", "train")]
    assert denied["allowed"] is False and "[ownership.debug]" in denied["status"]["message"]
    mine = Reads(PodLookup(users_own_pod()))
    assert answer(connect_request(ALICE, "attach"), mine)["allowed"] is True


def test_the_platform_opens_a_shell_without_a_read() -> None:
    reads = Reads(PodLookup(None, "must not be asked"))
    assert answer(connect_request(CORE), reads)["allowed"] is True
    assert reads.asked == []


@pytest.mark.parametrize(
    ("read", "says"),
    [
        (None, "has no --cluster-state"),
        (Reads(PodLookup(None, "the apiserver answered 403 Forbidden")), "403 Forbidden"),
        (Reads(PodLookup(None)), "found no Pod ml/train"),
    ],
)
def test_a_pod_that_cannot_be_read_is_denied(read: Any, says: str) -> None:
    denied = answer(connect_request(ALICE), read)
    assert denied["allowed"] is False and says in denied["status"]["message"]


@pytest.mark.parametrize(
    "request_",
    [
        connect_request(ALICE, "status"),
        {
            **connect_request(ALICE),
            "resource": {"group": "x.io", "version": "v1", "resource": "pods"},
        },  # fmt: skip
        {
            **connect_request(ALICE),
            "operation": "CREATE",
            "object": {"kind": "Pod", "apiVersion": "v1"},
        },  # fmt: skip
    ],
)
def test_only_the_doors_of_core_pods_are_shells(request_: Any) -> None:
    assert shells.shell_of(request_) is None


def test_the_other_reviews_refuse_a_connect() -> None:
    """A CONNECT is ``webhook.serving.shells``' to judge (the server sends it every one): the
    object reviews never let one through unjudged."""
    for endpoint in ("mutate", "validate"):
        outcome = admission.review(endpoint, connect_request(ALICE), SHIPPED, None)
        denied = outcome.response["response"]
        assert denied["allowed"] is False and "door into a Pod" in denied["status"]["message"]


# --- a shell the platform's own Pod opens with its token --------------------------------


def test_the_platforms_own_pod_opens_a_shell_in_another() -> None:
    """mpi-operator v1: the launcher runs its workers' processes by ``kubectl exec`` as
    its own account. A launcher of the platform's is the platform."""
    worker = as_pod(created(pod(), CORE), "train")
    launcher = as_pod(created(pod(), CORE), "train-launcher")
    request = {**connect_request(ALICE), "userInfo": token_of(launcher)}
    pods = Cluster(worker, launcher)
    assert answer(request, pods)["allowed"] is True
    assert pods.asked == ["train", "train-launcher"]


@pytest.mark.parametrize(
    "forged",
    [
        {"uid": "another-uid"},  # a token of an earlier Pod of that name
        {"account": "default"},  # another account than the Pod runs as
        {"impersonated": True},  # kubectl --as=system:serviceaccount:ml:launcher: no extra
        {"users": True},  # her own Pod's token
    ],
)
def test_only_a_platform_pods_own_token_opens_a_shell(forged: dict[str, Any]) -> None:
    worker = as_pod(created(pod(), CORE), "train")
    launcher = as_pod(created(pod(), CORE), "train-launcher")
    if forged.get("users"):
        launcher = as_pod(users_own_pod(), "train-launcher")
    info = token_of(launcher, forged.get("account", "launcher"), forged.get("uid", "pod-uid-1"))
    if forged.get("impersonated"):
        del info["extra"]
    denied = answer({**connect_request(ALICE), "userInfo": info}, Cluster(worker, launcher))
    assert denied["allowed"] is False and "[ownership.debug]" in denied["status"]["message"]


def test_a_pod_of_another_namespace_opens_no_shell_here() -> None:
    worker = as_pod(created(pod(), CORE), "train")
    launcher = as_pod(created(pod(), CORE), "train-launcher")
    info = token_of(launcher)
    info["username"] = "system:serviceaccount:other:launcher"
    denied = answer({**connect_request(ALICE), "userInfo": info}, Cluster(worker, launcher))
    assert denied["allowed"] is False
