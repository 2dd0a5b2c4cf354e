"""Receipts (``webhook.engine.receipts``): ``validate`` does not run the backstop's steps
again for a Pod ``mutate`` produced, and that changes no decision.

Every object of the declarative cases and the platform fixtures, under every test policy
and the shipped one, as nobody, a user and the platform, generated Pods and the fuzz
corpus's objects: ``validate`` of what ``mutate`` returned gives the same decision with
the receipt as without. And a receipt serves only the exact inputs it was made for:
another object, user, namespace, RunPolicy or cluster view runs the backstop.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml
from harness import REPO
from harness.decisions import contexts, corpus  # nobody, a user, the platform
from harness.fuzz import inputs as fuzz_texts
from harness.pod_strategies import POLICY_SET, pods
from harness.workloads import gpu_pod
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.clusterstate.static import StaticClusterState
from webhook.engine import mutate, validate
from webhook.engine import validation as engine_validation
from webhook.engine.context import NO_CONTEXT, Context, Requester
from webhook.engine.receipts import LocalReceipts, SharedReceipts, backstop_key
from webhook.engine.types import Decision
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy

ROOT = REPO

POLICIES: list[Policy] = [
    *(load_policy(p) for p in sorted((ROOT / "tests/cases/_policies").iterdir()) if p.is_dir()),
    load_policy(ROOT / "policies"),
]
PLATFORM = load_policy(ROOT / "tests/cases/_policies/platform")


def _seen(d: Decision) -> tuple[Any, ...]:
    return (
        d.allowed,
        [(v.rule, v.path, v.message) for v in d.violations],
        d.warnings,
        d.error is None,
    )


def same_with_and_without(obj: Any, policy: Policy, context: Context) -> bool:
    """``validate`` of ``mutate``'s result: the same decision with its receipt as without;
    True when the receipt was found (the backstop skipped)."""
    receipts = LocalReceipts()
    mutated = mutate(copy.deepcopy(obj), policy, context=context, receipts=receipts)
    with_receipt = validate(mutated.object, policy, context=context, receipts=receipts)
    without = validate(mutated.object, policy, context=context)
    assert _seen(with_receipt) == _seen(without), (obj, policy.names(), with_receipt.error)
    return bool(receipts._keys) and with_receipt.allowed is not None


def test_no_decision_changes_on_the_cases_and_fixtures() -> None:
    objects = corpus()
    assert len(objects) > 150
    hits = 0
    for policy in POLICIES:
        for context in contexts(policy):
            for obj in objects:
                hits += same_with_and_without(obj, policy, context)
    assert hits > 500  # the receipts were used, not only looked for


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), policy=st.sampled_from(POLICY_SET))
def test_no_decision_changes_on_generated_pods(pod: dict[str, Any], policy: Policy) -> None:
    same_with_and_without(pod, policy, NO_CONTEXT)


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(text=fuzz_texts)
def test_no_decision_changes_on_the_fuzz_corpus(text: str) -> None:
    try:
        docs = list(yaml.safe_load_all(text))
    except (yaml.YAMLError, RecursionError, ValueError):
        return
    for doc in docs[:4]:
        same_with_and_without(doc, PLATFORM, NO_CONTEXT)


def _backstop_runs(obj: Any, policy: Policy, context: Context, receipts: Any) -> bool:
    ran = []
    original = engine_validation._not_mutated

    def counting(*args: Any, **kwargs: Any) -> Any:
        ran.append(1)
        return original(*args, **kwargs)

    engine_validation._not_mutated = counting
    try:
        validate(obj, policy, context=context, receipts=receipts)
    finally:
        engine_validation._not_mutated = original
    return bool(ran)


ALICE = Context(Requester("alice", ("system:authenticated",)), StaticClusterState())


def test_a_receipt_serves_only_the_inputs_it_was_made_for() -> None:
    receipts = LocalReceipts()
    pod = gpu_pod(1)
    result = mutate(pod, PLATFORM, context=ALICE, receipts=receipts).object
    assert not _backstop_runs(result, PLATFORM, ALICE, receipts)
    # another user, groups, namespace, cluster view, operation: the backstop runs
    others = [
        Context(Requester("bob", ("system:authenticated",)), ALICE.state),
        Context(Requester("alice", ("system:masters",)), ALICE.state),
        Context(Requester("alice", ("system:authenticated",)), StaticClusterState()),
        Context(Requester("alice", ("system:authenticated",)), ALICE.state, subresource="x"),
    ]
    for context in others:
        assert _backstop_runs(result, PLATFORM, context, receipts), context
    moved = copy.deepcopy(result)
    moved["metadata"]["namespace"] = "other"
    assert _backstop_runs(moved, PLATFORM, ALICE, receipts)
    # another RunPolicy (an edited one: another digest) with the same name
    edited = Policy.of(PLATFORM.first.model_copy(update={"digest": "0" * 16}))
    assert _backstop_runs(result, edited, ALICE, receipts)
    # a Pod that is not what mutate returned: one field changed, or mutate bypassed
    changed = copy.deepcopy(result)
    changed["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    assert _backstop_runs(changed, PLATFORM, ALICE, receipts)
    relabelled = copy.deepcopy(result)
    relabelled["metadata"]["labels"]["dhcore/template"] = "default"
    assert _backstop_runs(relabelled, PLATFORM, ALICE, receipts)
    bypassed = validate(pod, PLATFORM, context=ALICE, receipts=receipts)
    assert not bypassed.allowed
    assert any("was it bypassed" in v.message for v in bypassed.violations)


class _Moving(StaticClusterState):
    """A cluster view that moves on every look."""

    looks = 0

    def version(self) -> str:
        _Moving.looks += 1
        return str(_Moving.looks)


def test_no_receipt_when_the_cluster_view_moved_or_has_no_version() -> None:
    receipts = LocalReceipts()
    mutate(gpu_pod(1), PLATFORM, context=Context(Requester("alice"), _Moving()), receipts=receipts)
    assert not receipts._keys

    class NoVersion(StaticClusterState):
        version = None  # a view that cannot say when it moved

    mutate(gpu_pod(1), PLATFORM, context=Context(Requester("a"), NoVersion()), receipts=receipts)
    assert not receipts._keys


def test_no_receipt_for_a_policy_without_a_digest() -> None:
    receipts = LocalReceipts()
    mutate(
        gpu_pod(1), Policy.of(PLATFORM.first.model_copy(update={"digest": ""})), receipts=receipts
    )
    assert not receipts._keys


def test_shared_receipts_are_seen_by_forked_workers() -> None:
    receipts = SharedReceipts(slots=64)
    key = bytes(range(32))
    pid = os.fork()
    if pid == 0:  # a worker adds, the master (and every other worker) sees it
        receipts.add(key)
        os._exit(0)
    os.waitpid(pid, 0)
    assert key in receipts
    assert bytes(32) not in receipts
    other = bytes([key[0], *range(100, 131)])  # same slot, another key: overwrites it
    receipts.add(other)
    assert other in receipts and key not in receipts


@pytest.mark.parametrize("value", [{1: "x"}, 2**70, object()])
def test_what_cannot_be_encoded_exactly_gets_no_key(value: Any) -> None:
    receipts = LocalReceipts()
    pod = gpu_pod(1)
    mutate(pod, PLATFORM, receipts=receipts)
    [key] = receipts._keys
    assert isinstance(key, bytes) and len(key) == 32
    odd = gpu_pod(1)
    odd["spec"]["containers"][0]["odd"] = value
    again = LocalReceipts()
    mutate(odd, PLATFORM, receipts=again)
    assert not again._keys
    assert backstop_key is not None
