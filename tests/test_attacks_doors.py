"""Attack chains through the doors of a pod spec (``webhook/engine/doors.py``): fields
that name another object, listed in the doors table and yet judged by nothing.

The attacker is ``alice``, with ``edit`` in the run namespace; the platform is the Core
(``system:serviceaccount:digitalhub:core``). The policy is the shipped one with every
volume type allowed at level baseline and the platform's device claims named
``gpu-{run}`` (``test_doors.STRIP``/``DENY``): where a door's own rule is all that stands
between her and the platform's object. Each test keeps the chain and the fix.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_doors import DENY, NAMESPACE, STRIP
from test_manifests import Cel
from test_ownership import State
from test_trust import ALICE, CORE, RUN, rules

from webhook.engine import evaluate
from webhook.engine.context import Context, Requester
from webhook.install.manifests import validating_webhook_configuration

GENERATED = "train-gpu-x7k2p"  # the claim made from the platform run's template
PLATFORM_CLAIM = "gpu-r1"  # a claim the platform created for run r1 (its pattern)
SECRET = "digitalhub-common-creds"  # the platform's credentials, given to its runs only


def judged(obj: dict[str, Any], who: Requester, policy: Any = STRIP) -> Any:
    decision = evaluate(obj, policy, namespace=NAMESPACE, context=Context(who, State([])))
    assert decision.error is None, decision.message()
    return decision


def run(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(RUN)
                     if labels is None else labels},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec},
    }  # fmt: skip


def using_claim(name: str, claim: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = run(name, labels, resourceClaims=[{"name": "gpu", "resourceClaimName": claim}])
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


# --- device claims ---------------------------------------------------------------------------


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


# --- secrets through every volume type -------------------------------------------------------


@pytest.mark.parametrize(
    "volume",
    [
        {"flexVolume": {"driver": "example.com/nfs", "secretRef": {"name": SECRET}}},
        {"csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": SECRET}}},
        {"cephfs": {"monitors": ["10.0.0.1:6789"], "secretRef": {"name": SECRET}}},
        {"azureFile": {"secretName": SECRET, "shareName": "data"}},
    ],
    ids=lambda v: next(iter(v)),
)
def test_the_platforms_secret_through_a_volume_type_goes_like_through_env(
    volume: dict[str, Any],
) -> None:
    """Chain: alice's run Pod (run labels, created by her) mounts a flexVolume whose
    ``secretRef`` names the platform's ``digitalhub-common-creds``: the kubelet hands the
    secret to the flex driver, which she picked. The same secret by ``secretKeyRef`` was
    stripped; by flexVolume it was kept (``secrets.forbidden`` walked its own hand list:
    env, envFrom, secret and projected volumes, imagePullSecrets).

    Fix: ``secrets.forbidden`` reads the doors table: every Secret door is stripped
    (the volume with its mounts) or denied exactly like env and volume references, in a
    Pod and in a pod template; the Core's run keeps it."""
    pod = run("mine", volumes=[{"name": "creds", **volume}])
    main = pod["spec"]["containers"][0]
    main["volumeMounts"] = [{"name": "creds", "mountPath": "/creds"}]
    main["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "t"}}}]
    stored = judged(pod, ALICE)
    assert stored.allowed
    spec = stored.object["spec"]
    assert "volumes" not in spec and not {"env", "volumeMounts"} & set(spec["containers"][0])
    denied = judged(pod, ALICE, DENY)
    assert not denied.allowed and rules(denied) == {"secrets.forbidden"}
    assert {v.path for v in denied.violations} == {
        "spec.volumes[0]",
        "spec.containers[0].env[0]",
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": NAMESPACE, "labels": dict(RUN)},
        "spec": {"selector": {"matchLabels": dict(RUN)},
                 "template": {"metadata": {"labels": dict(RUN)},
                              "spec": copy.deepcopy(pod["spec"])}},
    }  # fmt: skip
    template = judged(deployment, ALICE, DENY)
    assert not template.allowed and rules(template) == {"secrets.forbidden"}
    assert {v.path for v in template.violations} == {
        "spec.template.spec.volumes[0]",
        "spec.template.spec.containers[0].env[0]",
    }
    core = judged(pod, CORE)
    assert core.allowed and core.object["spec"]["volumes"] == pod["spec"]["volumes"]


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
