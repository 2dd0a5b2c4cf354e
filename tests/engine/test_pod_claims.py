"""Claims a Pod owns (``webhook.engine.rules.podclaims``): an ephemeral volume's PVC and a
ResourceClaim made from a Pod's template are that Pod's; another Pod, a new claim
cloning one, or a pod template naming one is refused to anyone but the platform, read
from runguard's cache (owners by name), and routed whatever the claim's name."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.cluster_state import Meta, OwnerRef, State
from harness.routing import RESOURCES, Cel, calls
from harness.shipped import ALICE, CORE, SHIPPED, rules

from webhook.clusterstate.model import CLAIM_TEMPLATES, DEVICE_CLAIMS, PROJECT_PROFILES, RUN_PODS
from webhook.clusterstate.process import operator_kinds, watched_kinds
from webhook.engine import evaluate, validate
from webhook.engine.context import Context
from webhook.install import manifests

RESERVED = (DEVICE_CLAIMS, PROJECT_PROFILES, CLAIM_TEMPLATES, RUN_PODS)  # the slots of every policy
SCRATCH = "train-scratch"  # the ephemeral volume's PVC of the platform's run Pod train


def cluster(*metas: Meta, synced: bool = True) -> State:
    return State(metas, synced)


def owned_by(kind: str, name: str, owner_kind: str = "Pod", owner: str = "train") -> Meta:
    return Meta(kind, "ml", name, f"uid-{name}", owners=(OwnerRef(owner_kind, owner, "u", True),))


def plain(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "mine", "namespace": "ml", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec}}  # fmt: skip


def mounting(claim: str) -> dict[str, Any]:
    return plain(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": claim}}])


def judged(obj: dict[str, Any], state: State | None, who: Any = ALICE, op: str = "CREATE",
           old: dict[str, Any] | None = None) -> Any:  # fmt: skip
    context = Context(who, state, op)
    if old is not None:
        decision = validate(obj, SHIPPED, namespace="ml", old=old, context=context)
    else:
        decision = evaluate(obj, SHIPPED, namespace="ml", context=context)
    assert decision.error is None, decision.message()
    return decision


def routed(obj: dict[str, Any]) -> list[str]:
    mutating, validating = manifests.webhook_configurations(SHIPPED)
    cel = Cel()
    return [*calls(cel, mutating, obj, None, "ml", "CREATE", ALICE),
            *calls(cel, validating, obj, None, "ml", "CREATE", ALICE)]  # fmt: skip


def test_a_claim_of_another_pod_is_refused_and_one_of_nobody_is_not() -> None:
    shared = owned_by("PersistentVolumeClaim", "team-datasets", "StatefulSet", "db")
    state = cluster(owned_by("PersistentVolumeClaim", SCRATCH), shared)
    refused = judged(mounting(SCRATCH), state)
    assert not refused.allowed and rules(refused) == {"ownership.not-a-run"}
    assert "Pod train's own" in refused.message()
    assert judged(mounting("team-datasets"), state).allowed  # a StatefulSet's: no Pod's
    assert judged(mounting("absent"), state).allowed  # no such claim: nobody's yet
    assert judged(mounting(SCRATCH), state, CORE).allowed  # the platform may
    assert judged(mounting(SCRATCH), None).allowed  # offline, no cluster state: not judged


def test_a_kind_the_cache_lacks_fails_closed_retryably() -> None:
    uses = plain(resourceClaims=[{"name": "g", "resourceClaimName": "train-gpu-x7k2p"}])
    decision = judged(uses, cluster(synced=False))
    assert not decision.allowed and rules(decision) == {"ownership.unknown"}
    assert "retry in a moment" in decision.message()


def test_an_update_keeps_a_claim_the_object_already_named() -> None:
    """A Deployment admitted before the claim's owner was known (or before this rule) is
    not refused its own updates for it; a claim newly named is."""
    state = cluster(owned_by("PersistentVolumeClaim", SCRATCH))
    template = {"metadata": {"labels": {"app": "x"}}, "spec": mounting(SCRATCH)["spec"]}
    old = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "d", "namespace": "ml", "labels": {"app": "x"}},
           "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}  # fmt: skip
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 2
    assert judged(new, state, op="UPDATE", old=old).allowed
    fresh = copy.deepcopy(old)
    fresh["spec"]["template"]["spec"] = plain()["spec"]
    added = judged(new, state, op="UPDATE", old=fresh)
    assert not added.allowed and rules(added) == {"ownership.not-a-run"}


@pytest.mark.parametrize("kind", ["PersistentVolumeClaim", "StatefulSet"])
def test_a_new_claim_cloning_a_pods_claim_is_refused_and_routed(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = {"kind": "PersistentVolumeClaim", "name": SCRATCH}
    claim_spec = {"accessModes": ["ReadWriteOnce"], "dataSource": source,
                  "resources": {"requests": {"storage": "1Gi"}}}  # fmt: skip
    if kind == "PersistentVolumeClaim":
        obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "copy", "namespace": "ml"},
               "spec": claim_spec}  # fmt: skip
        resource = ("", "persistentvolumeclaims")
    else:
        obj = {"apiVersion": "apps/v1", "kind": kind,
               "metadata": {"name": "s", "namespace": "ml", "labels": {"app": "x"}},
               "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "s",
                        "template": {"metadata": {"labels": {"app": "x"}},
                                     "spec": plain()["spec"]},
                        "volumeClaimTemplates": [{"metadata": {"name": "d"},
                                                  "spec": claim_spec}]}}  # fmt: skip
        resource = ("apps", "statefulsets")
    state = cluster(owned_by("PersistentVolumeClaim", SCRATCH))
    context = Context(ALICE, state, "CREATE")
    refused = validate(obj, SHIPPED, namespace="ml", context=context)
    assert not refused.allowed and rules(refused) == {"ownership.not-a-run"}
    assert validate(obj, SHIPPED, namespace="ml", context=Context(CORE, state, "CREATE")).allowed
    monkeypatch.setitem(RESOURCES, kind, resource)
    _, validating = manifests.webhook_configurations(SHIPPED)
    assert calls(Cel(), validating, obj, None, "ml", "CREATE", ALICE)


def test_every_pod_naming_a_claim_is_routed_and_one_naming_none_is_not() -> None:
    assert routed(mounting("team-datasets"))
    assert routed(plain(resourceClaims=[{"name": "g", "resourceClaimName": "any"}]))
    assert not routed(plain(resourceClaims=[{"name": "g", "resourceClaimTemplateName": "t"}]))
    assert not routed(plain(volumes=[{"name": "e", "emptyDir": {}}]))


def test_the_watch_keeps_resource_claims_first() -> None:
    """ResourceClaims (and projects' profiles, and claim templates) are watched whatever
    the policy, in the first operator slots, so no number of operators' kinds pushes them
    out."""
    assert watched_kinds(SHIPPED) == (*RESERVED, *operator_kinds(SHIPPED))
    assert watched_kinds(None) == RESERVED


def test_a_snapshot_of_a_pods_own_claim_is_refused_and_routed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim made for a Pod, snapshotted, would be restored into hers: another clone."""
    monkeypatch.setitem(RESOURCES, "VolumeSnapshot", ("snapshot.storage.k8s.io", "volumesnapshots"))
    taken = {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "snap", "namespace": "ml"},
        "spec": {"source": {"persistentVolumeClaimName": "train-scratch"}},
    }
    state = cluster(owned_by("PersistentVolumeClaim", "train-scratch"))
    refused = judged(taken, state)
    assert [(v.rule, v.path) for v in refused.violations] == [
        ("ownership.not-a-run", "spec.source.persistentVolumeClaimName")
    ]
    assert routed(taken) == ["validate-reserved-names.runguard.io"]
    assert judged(taken, state, CORE).allowed  # the platform's to snapshot
    mine = copy.deepcopy(taken)
    mine["spec"]["source"]["persistentVolumeClaimName"] = "mine"
    assert judged(mine, cluster(owned_by("PersistentVolumeClaim", "other"))).allowed
