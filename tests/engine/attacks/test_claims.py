"""Attacks through the platform's device and volume claims (``rules/devices.py``,
``ownership.check_not_a_run``, ``check_claim_clones``): a run's or a plain Pod's
``resourceClaimName`` naming the platform run's claim, its ephemeral volume's PVC, a
claim name the platform will take, and clones of a platform claim (a PVC, a
StatefulSet's claim template, a VolumeSnapshot).

The attacker is ``alice``, with ``edit`` in the run namespace (and, for snapshots, the
``volumesnapshots`` some distributions aggregate to it); the platform is the Core. Each
test keeps the chain and the fix, or asserts that some step is refused (by the engine,
by routing, or shown by ``runguard audit --rbac`` for a door admission cannot see).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.attack_chains import (
    HER_RUN,
    _role_binding,
    deployment,
    judged,
    judged_by,
    plain,
    routed,
    run,
)
from harness.cluster_state import Meta, OwnerRef, State
from harness.references import DENY, NAMESPACE, STRIP
from harness.routing import Cel
from harness.shipped import ALICE, CORE, RUN, SHIPPED, rules

from webhook.audit.rbacreport import platform_of, rbac_report
from webhook.engine import evaluate
from webhook.engine.context import Context
from webhook.install.manifests import (
    mutating_webhook_configuration,
    validating_webhook_configuration,
)

GENERATED = "train-gpu-x7k2p"  # the claim made from the platform run's template
PLATFORM_CLAIM = "gpu-r1"  # a claim the platform created for run r1 (its pattern)
GENERATED_CLAIM = "train-gpu-x7k2p"  # the ResourceClaim made from the platform run's template
EPHEMERAL_PVC = "train-scratch"  # the PVC of the platform run's generic ephemeral volume


def using_claim(name: str, claim: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = run(name, labels, resourceClaims=[{"name": "gpu", "resourceClaimName": claim}])
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def as_template(obj: dict[str, Any]) -> dict[str, Any]:
    return deployment(obj["metadata"]["labels"], copy.deepcopy(obj["spec"]))


def _of_the_run(kind: str, name: str) -> State:
    """The cluster: the claim ``name`` a controller made for the platform's run Pod
    ``train``, which is its controller owner (as the watch cache holds it)."""
    owner = OwnerRef("Pod", "train", "uid-train", True)
    return State([Meta(kind, "ml", name, f"uid-{name}", owners=(owner,))])


def _uses_generated_claim(kind: str) -> dict[str, Any]:
    mine = plain("mine", resourceClaims=[{"name": "gpu", "resourceClaimName": GENERATED_CLAIM}])
    mine["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return mine if kind == "Pod" else as_template(mine)


# --- device claims ----------------------------------------------------------------------


def test_a_users_run_cannot_share_the_platform_runs_gpu_by_its_claim() -> None:
    """Chain: the Core creates run ``train`` with ``resourceClaims: [{name: gpu,
    resourceClaimTemplateName: a100}]``; the resourceclaim controller makes the claim
    ``train-gpu-x7k2p``, owned by ``train``, and the scheduler allocates it an A100. Alice
    creates her own run Pod with ``resourceClaimName: train-gpu-x7k2p``: the claim is
    already allocated, so her Pod is added to its consumers and her code runs on the
    platform run's GPU, beside its data in device memory. ``resourceClaims`` was in the
    doors table but no rule read it.

    Fix: ``resources.device-claim``. A run names an existing ResourceClaim only when the
    platform created the run and the claim has a platform name
    (``resources.platformDeviceClaims``); any other is removed with the containers'
    ``resources.claims`` of it (``volumes.onPreExisting: Strip``), or denied."""
    platform = run("train", resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "a100"}])
    assert judged(platform, CORE).object["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "a100"}
    ]
    mine = using_claim("mine", GENERATED, {**RUN, "dhcore/run": "r2"})
    stored = judged(mine, ALICE)
    assert stored.allowed and "resources.device-claim" in {c.rule for c in stored.mutations}
    assert "resourceClaims" not in stored.object["spec"]
    assert "claims" not in stored.object["spec"]["containers"][0]["resources"]
    denied = judged(mine, ALICE, DENY)
    assert not denied.allowed and rules(denied) == {"resources.device-claim"}
    # the platform's own runs cannot be steered to it either: it is no platform claim
    assert not judged(mine, CORE, DENY).allowed


def test_the_platforms_device_claim_is_its_runs_only() -> None:
    """Chain, through a claim the platform created itself (``gpu-r1``, shared by the
    Pods of run r1): alice's run labelled r1, and her Pod outside every selector (a
    ``kubectl debug --copy-to`` of the run without its labels), name it.

    Fix: the run loses it (``resources.device-claim``); the unlabelled Pod is sent to
    runguard by the rendered matchConditions (platform names through every door,
    ``resourceClaims`` included) and denied (``ownership.not-a-run``); the Core's run
    keeps it."""
    core = judged(using_claim("train", PLATFORM_CLAIM), CORE)
    assert core.allowed and core.object["spec"]["resourceClaims"][0]["resourceClaimName"] == (
        PLATFORM_CLAIM
    )
    hers = judged(using_claim("train", PLATFORM_CLAIM), ALICE)
    assert hers.allowed and "resourceClaims" not in hers.object["spec"]
    copy_ = using_claim("copy", PLATFORM_CLAIM, {"app": "copy"})
    hook = next(
        h
        for h in validating_webhook_configuration(STRIP)["webhooks"]
        if h["name"] == "validate-references.runguard.io"
    )
    assert Cel().routed(hook, copy_, "pods")
    refused = judged(copy_, ALICE)
    assert not refused.allowed and rules(refused) == {"ownership.not-a-run"}
    # Not a platform name: routed all the same (a claim of any name may be one made for
    # another Pod, whose owner runguard reads), and allowed, as it is no Pod's.
    other = using_claim("copy", "gpu_r1", {"app": "copy"})
    assert Cel().routed(hook, other, "pods") and judged(other, ALICE).allowed


def test_the_platforms_device_claim_name_is_the_platforms_to_take() -> None:
    """Chain: before the platform creates run r1's claim ``gpu-r1``, alice creates a
    ResourceClaim of that name (her request: whatever device and configuration she
    likes); the platform's Pods then name her claim, which she also reads and may
    share. Fix: a ResourceClaim with a platform name is the platform's to create
    (``ownership.reserved-name``), routed to runguard like the platform's claims,
    secrets and configMaps."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": PLATFORM_CLAIM, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
    }
    hook = next(
        h
        for h in validating_webhook_configuration(STRIP)["webhooks"]
        if h["name"] == "validate-reserved-names.runguard.io"
    )
    assert {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["resourceclaims"], "scope": "Namespaced"} in hook["rules"]  # fmt: skip
    assert Cel().routed(hook, claim, "resourceclaims")
    refused = judged(claim, ALICE)
    assert not refused.allowed and rules(refused) == {"ownership.reserved-name"}
    assert judged(claim, CORE).allowed
    mine = {**claim, "metadata": {"name": "my-gpu", "namespace": NAMESPACE}}
    assert not Cel().routed(hook, mine, "resourceclaims") and judged(mine, ALICE).allowed


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_a_plain_pod_shares_the_platform_runs_gpu_by_its_generated_claim(kind: str) -> None:
    """Chain: the Core's run ``train`` gets its GPU from a ResourceClaimTemplate; the
    resourceclaim controller makes ``train-gpu-x7k2p``, owned by the run Pod, and the
    scheduler allocates it. Alice creates a Pod (or a Deployment) labelled ``app: x``,
    outside every RunPolicy's selector, with ``resourceClaimName: train-gpu-x7k2p``: the
    scheduler checks the owner of a claim only for one made from the Pod's own template,
    so her Pod joins ``reservedFor`` and runs on the platform run's GPU, beside its data
    in device memory. ``resources.device-claim`` judges runs only; for a Pod outside
    every selector only platform *names* count (``ownership.platform_references``),
    and a claim generated for a platform Pod has none, so no webhook is even called
    (``routed`` is empty) and the engine allows it. The same chain through a run Pod of
    hers is stripped (the first device-claim test above). Gap:
    ``webhook/engine/rules/devices.py``
    (``_named_claims`` runs only in a run's steps) and ``ownership.check_not_a_run`` /
    ``scope.claims`` (platform names only). Fix: any Pod naming an existing
    ResourceClaim by ``resourceClaimName`` reaches runguard (a CEL term on
    ``resourceClaims.exists(c, has(c.resourceClaimName))``, rare), and a claim whose
    controller owner is a Pod other than this one (``resource.kubernetes.io/pod-claim-
    name``), or that the platform created, is refused to anyone but the platform."""
    mine = _uses_generated_claim(kind)
    decision = judged_by(mine, ALICE, state=_of_the_run("ResourceClaim", GENERATED_CLAIM))
    assert routed(mine) and not decision.allowed
    assert rules(decision) == {"ownership.not-a-run"}
    core = judged_by(mine, CORE, state=_of_the_run("ResourceClaim", GENERATED_CLAIM))
    assert core.allowed  # the platform may (its own Pods outside every selector)


# --- volume claims ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["mount", "clone"])
def test_a_plain_pod_reads_the_platform_runs_ephemeral_volume(how: str) -> None:
    """Chain: the Core's run ``train`` has a generic ephemeral volume ``scratch``
    (downloaded data, checkpoints, what its code wrote with the platform's secrets); the
    ephemeral-volume controller names its PVC ``train-scratch``, owned by the Pod. Alice
    creates a Pod outside every selector mounting ``persistentVolumeClaim: {claimName:
    train-scratch}`` (ReadWriteOnce lets any Pod of the same node mount it: she pins
    hers there with ``nodeName``), or clones it through an ephemeral volume of her own
    (``dataSource: {kind: PersistentVolumeClaim, name: train-scratch}``). Her run Pod
    doing the same loses the volume (``volumes.pre-existing``); a Pod outside every
    selector is judged on platform *names* only (``volumes.platformClaims``), which a
    generated PVC has none of, so it is not routed and allowed. Gap:
    ``webhook/engine/rules/ownership.py`` ``platform_references`` / ``check_not_a_run``
    and the CEL references condition (names only). Fix: a PVC whose controller owner
    is a Pod (the ephemeral volume's) is that Pod's: refused to any other Pod, and
    routed by a CEL term on ``persistentVolumeClaim`` / ``dataSource`` of PVCs (the
    claims cache already exists for project-shared claims); or the platform names its
    runs' ephemeral volumes with a pattern of ``volumes.platformClaims``."""
    if how == "mount":
        volume = {"name": "s", "persistentVolumeClaim": {"claimName": EPHEMERAL_PVC}}
    else:
        template = {"spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}},
                             "dataSource": {"kind": "PersistentVolumeClaim",
                                            "name": EPHEMERAL_PVC}}}  # fmt: skip
        volume = {"name": "s", "ephemeral": {"volumeClaimTemplate": template}}
    mine = plain("mine", volumes=[volume], nodeName="node-of-train")
    mine["spec"]["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/s"}]
    as_run = copy.deepcopy(mine)
    as_run["metadata"]["labels"] = dict(HER_RUN)
    cluster = _of_the_run("PersistentVolumeClaim", EPHEMERAL_PVC)
    assert "volumes" not in judged_by(as_run, ALICE, state=cluster).object["spec"]  # her run
    decision = judged_by(mine, ALICE, state=cluster)
    assert routed(mine) and not decision.allowed
    assert rules(decision) == {"ownership.not-a-run"}


def test_a_platform_claim_cannot_be_cloned_by_a_claim_or_a_claim_template() -> None:
    """Chain (a): alice creates PVC ``copy`` with ``dataSource: {kind:
    PersistentVolumeClaim, name: v-r1-data}`` (a CSI clone of the run's data), then a
    plain Pod (outside every selector) mounting ``copy``. No webhook routes the PVC (its
    name is not reserved) nor the Pod (it names no platform object); the engine judges
    neither. Chain (b): the same clone as a StatefulSet ``volumeClaimTemplates`` entry of
    a non-run StatefulSet: the controllers' matchCondition reads only the template, the
    statefulset-controller creates the clone.

    Why it matters: the engine denies exactly this clone through an ephemeral volume
    (``test_a_platform_claim_cloned_by_an_ephemeral_volume_is_denied``) and through a run's
    claim templates (docs/dev/guarantees.md, "Every admitted object"); a plain PVC is the same door,
    open.

    Fix: route PVC CREATE whose ``dataSource``/``dataSourceRef`` names a platform claim
    (and VolumeSnapshots of one), and pod controllers whose ``volumeClaimTemplates`` do;
    judge them as ``ownership.not-a-run`` unless the platform creates them (the DOORS
    table should include claim specs and ``volumeClaimTemplates.*.spec.dataSource*``)."""
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "copy", "namespace": "ml"},
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "1Gi"}},
                      "dataSource": {"kind": "PersistentVolumeClaim",
                                     "name": "v-r1-data"}}}  # fmt: skip
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "s", "namespace": "ml"},
           "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "s",
                    "template": {"metadata": {"labels": {"app": "x"}},
                                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                    "volumeClaimTemplates": [{"metadata": {"name": "d"},
                                              "spec": copy.deepcopy(claim["spec"])}]}}  # fmt: skip
    cel = Cel()
    hooks = [
        *validating_webhook_configuration(SHIPPED)["webhooks"],
        *mutating_webhook_configuration(SHIPPED)["webhooks"],
    ]
    routed = []
    for resource, obj in (("persistentvolumeclaims", claim), ("statefulsets", sts)):
        for hook in hooks:
            if any(resource in r["resources"] for r in hook["rules"]) and (
                "matchConditions" not in hook or cel.routed(hook, obj, resource)
            ):
                routed.append(resource)
    allowed = [
        obj["kind"]
        for obj in (claim, sts)
        if evaluate(obj, SHIPPED, namespace="ml", context=Context(ALICE, State([]))).allowed
    ]
    assert {"persistentvolumeclaims", "statefulsets"} <= set(routed) and not allowed


def test_a_snapshot_of_the_platforms_claim_restored_into_hers() -> None:
    """Chain (a cluster with the CSI snapshot CRDs, whose roles aggregate
    ``volumesnapshots`` to ``edit``, as several distributions ship): Alice creates a
    VolumeSnapshot with ``source.persistentVolumeClaimName: v-r1-data`` (the platform
    run's claim), then a PVC of her own with ``dataSource: {apiGroup:
    snapshot.storage.k8s.io, kind: VolumeSnapshot, name: snap}`` and mounts it: the
    platform's data, in her Pod. ``ownership.not-a-run`` judges clones of a platform
    PVC through ``dataSource`` of kind PersistentVolumeClaim only; the snapshot's
    CREATE is not routed, and the report has no door for it. Gap:
    ``webhook/engine/rules/ownership.py`` ``check_claim_clones`` and
    ``webhook/audit/rbacreport.py`` ``DOORS``. Fix: a VolumeSnapshot whose source is a
    platform-named PVC is the platform's to create (route
    ``snapshot.storage.k8s.io/volumesnapshots`` CREATE when installed), and the report
    shows ``create volumesnapshots`` in run namespaces."""
    snapshot = {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "snap", "namespace": "ml"},
        "spec": {"source": {"persistentVolumeClaimName": "v-r1-data"}},
    }
    refused = not judged_by(snapshot, ALICE).allowed
    objects = _role_binding("ml", [{"apiGroups": ["snapshot.storage.k8s.io"],
                                    "resources": ["volumesnapshots"],
                                    "verbs": ["create", "get"]}])  # fmt: skip
    report = rbac_report(objects, platform_of(SHIPPED), shells=True)
    assert refused or any(str(f.subject) == "User alice" for f in report.unexpected())
