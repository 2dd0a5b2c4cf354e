"""Large objects: the engine's answers stay right and its patches stay small.

Behaviour only, never durations (``bench/bench_sizes.py`` measures time against size,
on the same Pods: ``harness.workloads``): a patch is never much larger than the object
it produces, it still turns the input into the result, and the steps that used to
search lists per item give the same answers.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from harness import REPO, workloads

from webhook.engine import mutate, validate
from webhook.engine.context import Context, Requester
from webhook.engine.diff import make_patch
from webhook.engine.types import MESSAGE_LIMIT
from webhook.policy.loader import load_policy

POLICY = load_policy(REPO / "policies")
PLATFORM = Context(requester=Requester("system:serviceaccount:digitalhub:core"))


def size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


@pytest.mark.parametrize("series", sorted(workloads.SERIES))
def test_patch_is_never_much_larger_than_the_result(series: str) -> None:
    pod = workloads.SERIES[series](3000)
    decision = mutate(pod, POLICY, context=PLATFORM)
    assert decision.error is None and decision.patch
    assert size(decision.patch) <= size(decision.object) + 1024
    assert jsonpatch.apply_patch(pod, decision.patch) == decision.object


def test_a_list_changed_item_by_item_is_replaced_when_that_is_smaller() -> None:
    src = {"items": [{"name": f"i{i}"} for i in range(100)]}
    dst = {
        "items": [{"name": f"i{i}", "securityContext": {"privileged": False}} for i in range(100)]
    }
    patch = make_patch(src, dst)
    assert patch == [{"op": "replace", "path": "/items", "value": dst["items"]}]


def test_a_few_changes_in_a_long_list_stay_item_operations() -> None:
    src = {"items": [{"name": f"i{i}", "image": "x" * 100} for i in range(100)]}
    dst = copy.deepcopy(src)
    for i in range(0, 100, 5):
        dst["items"][i]["privileged"] = False
    patch = make_patch(src, dst)
    assert len(patch) == 20 and all(op["op"] == "add" for op in patch)
    assert jsonpatch.apply_patch(src, patch) == dst


def test_unmeasurable_values_keep_item_operations() -> None:
    src = {"items": [{1: i} for i in range(20)]}  # keys JSON cannot hold as they are
    dst = {"items": [{1: i, 2: i} for i in range(20)]}
    assert len(make_patch(src, dst)) == 20


def test_many_forbidden_secrets_are_each_named_once() -> None:
    env = [
        {"name": f"S{i}", "valueFrom": {"secretKeyRef": {"name": f"x{i % 50}", "key": "k"}}}
        for i in range(5000)
    ]
    pod = workloads.sized_pod([{"name": "main", "image": "i", "env": env}], [])
    decision = mutate(pod, POLICY, context=PLATFORM)
    warning = next(w for w in decision.warnings if "secrets not managed" in w)
    assert warning.startswith("runguard: secrets not managed by the platform removed: x0, x1, ")
    assert "(+" in warning and len(warning) <= 120
    left = decision.object["spec"]["containers"][0]["env"]
    assert [e["name"] for e in left] == ["NVIDIA_DRIVER_CAPABILITIES"]  # the profile's
    assert not validate(decision.object, POLICY, context=PLATFORM).violations


def test_many_device_variables_are_each_removed() -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": str(i)} for i in range(3000)]
    env.append({"name": "KEEP", "value": "1"})
    containers = [{"name": f"c{i}", "image": "i", "env": env} for i in range(3)]
    pod = workloads.sized_pod(containers, [])
    decision = mutate(pod, POLICY, context=PLATFORM)
    for container in decision.object["spec"]["containers"]:
        assert [
            e["name"] for e in container["env"] if e["name"] != "NVIDIA_DRIVER_CAPABILITIES"
        ] == ["KEEP"]
    assert any(
        "device selection removed (request gpus instead): c0 NVIDIA_VISIBLE_DEVICES" in w
        for w in decision.warnings
    )


def test_many_added_capabilities_are_stripped_and_named() -> None:
    add = ["NET_BIND_SERVICE", "SYS_ADMIN"] * 2000
    container = {"name": "c", "image": "i", "securityContext": {"capabilities": {"add": add}}}
    decision = mutate(workloads.sized_pod([container], []), POLICY, context=PLATFORM)
    caps = decision.object["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert "add" not in caps  # the policy allows none
    assert any(w.startswith("runguard: root and privileges stripped") for w in decision.warnings)


def test_many_tolerations_with_the_profile_key_are_replaced_by_the_profile_one() -> None:
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": str(i), "effect": "NoSchedule"}
        for i in range(3000)
    ] + [{"key": "other", "operator": "Exists"}]
    pod = workloads.sized_pod([{"name": "main", "image": "i"}], [])
    pod["spec"]["tolerations"] = tolerations
    result = mutate(pod, POLICY, context=PLATFORM).object["spec"]["tolerations"]
    assert result == [
        {"key": "other", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_a_huge_denial_lists_what_fits_and_counts_the_rest_by_rule() -> None:
    # A 25k-container Pod that bypassed mutation: 100k violations, 13 MB as one list.
    sent = workloads.as_sent(workloads.containers_pod(25000))
    decision = validate(sent, POLICY, context=PLATFORM)
    assert not decision.allowed and len(decision.violations) > 100_000 - 1000
    message = decision.message()
    assert len(message) <= MESSAGE_LIMIT + 1024  # the per-rule tail is bounded by rule ids
    listed, _, tail = message.partition("; ... and ")
    shown = listed.count("; [") + 1
    more, _, counts = tail.partition(" more: ")
    assert shown + int(more) == len(decision.violations)
    by_rule = dict(item.split(" x") for item in counts.split(", "))
    rest = decision.violations[shown:]
    assert {rule: int(n) for rule, n in by_rule.items()} == {
        rule: sum(1 for v in rest if v.rule == rule) for rule in {v.rule for v in rest}
    }
    assert message.startswith(f"runguard denied Pod big: {len(decision.violations)} violations: ")
    assert str(decision.violations[0]) in listed


def test_a_denial_that_fits_lists_every_violation() -> None:
    decision = validate(workloads.as_sent(workloads.containers_pod(3)), POLICY)
    message = decision.message()
    assert " more: " not in message
    assert all(str(v) in message for v in decision.violations)
