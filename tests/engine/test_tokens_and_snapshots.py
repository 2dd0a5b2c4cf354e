"""The platform's ServiceAccounts and claims through objects that are no Pod: a token
Secret for the platform's account (``ownership.service-account``) and a VolumeSnapshot of
a platform claim (``ownership.not-a-run``), each judged and routed alike."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from harness.attack_chains import MLRUN, MLRUN_API
from harness.cluster_state import State
from harness.routing import RESOURCES, Cel, calls
from harness.shipped import ALICE, CORE, SHIPPED

from webhook.engine import validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.policy.model import Policy

TOKEN_CONTROLLER = Requester("system:kube-controller-manager", ("system:authenticated",))


@pytest.fixture(autouse=True)
def _resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(RESOURCES, "Secret", ("", "secrets"))
    monkeypatch.setitem(RESOURCES, "VolumeSnapshot", ("snapshot.storage.k8s.io", "volumesnapshots"))


def judged(obj: dict[str, Any], policy: Policy, who: Requester, namespace: str,
           old: dict[str, Any] | None = None) -> set[str]:  # fmt: skip
    """The rules that refuse the request (empty: allowed), and that, when refused, the
    apiserver sends it to runguard (and never otherwise)."""
    operation = "CREATE" if old is None else "UPDATE"
    context = Context(who, State([]), operation)
    decision = validate(obj, policy, namespace=namespace, old=old, context=context)
    refused = {v.rule for v in decision.violations} if not decision.allowed else set()
    assert not refused or routed(obj, policy, who, namespace, old) == [
        manifests.RESERVED_NAMES_WEBHOOK
    ]
    return refused


_CONFIGURATIONS: dict[int, list[dict[str, Any]]] = {}
_CEL = Cel()


def routed(obj: dict[str, Any], policy: Policy, who: Requester, namespace: str,
           old: dict[str, Any] | None = None) -> list[str]:  # fmt: skip
    """The runguard webhooks the apiserver calls for the request."""
    operation = "CREATE" if old is None else "UPDATE"
    if id(policy) not in _CONFIGURATIONS:
        _CONFIGURATIONS[id(policy)] = manifests.webhook_configurations(policy)
    return [
        name
        for configuration in _CONFIGURATIONS[id(policy)]
        for name in calls(_CEL, configuration, obj, old, namespace, operation, who)
    ]


def token_secret(account: str, namespace: str = "mlrun", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "tok", "namespace": namespace,
                     "annotations": {"kubernetes.io/service-account.name": account}},
        **extra,
    }  # fmt: skip


def test_a_token_secret_for_the_platforms_account_is_the_platforms() -> None:
    assert judged(token_secret("mlrun-api"), MLRUN, ALICE, "mlrun") == {"ownership.service-account"}
    assert judged(token_secret("mlrun-api"), MLRUN, MLRUN_API, "mlrun") == set()
    # her own account's token, or the name in another namespace: not the platform's
    assert judged(token_secret("default"), MLRUN, ALICE, "mlrun") == set()
    assert judged(token_secret("mlrun-api", "ml"), MLRUN, ALICE, "ml") == set()
    # a Secret of another type names no account to the token controller
    opaque = token_secret("mlrun-api", type="Opaque")
    assert judged(opaque, MLRUN, ALICE, "mlrun") == set()
    # the Core's account, in the shipped policy
    core = token_secret("core", "digitalhub")
    assert judged(core, SHIPPED, ALICE, "digitalhub") == {"ownership.service-account"}
    assert judged(core, SHIPPED, CORE, "digitalhub") == set()


def test_a_token_secret_updated_to_name_the_platforms_account() -> None:
    mine = token_secret("default")
    renamed = copy.deepcopy(mine)
    renamed["metadata"]["annotations"]["kubernetes.io/service-account.name"] = "mlrun-api"
    assert judged(renamed, MLRUN, ALICE, "mlrun", old=mine) == {"ownership.service-account"}
    # the token controller filling in the platform's own Secret: not even routed
    platforms = token_secret("mlrun-api")
    filled = token_secret("mlrun-api", data={"token": "dG9rZW4="})
    assert judged(filled, MLRUN, TOKEN_CONTROLLER, "mlrun", old=platforms) == set()
    assert routed(filled, MLRUN, TOKEN_CONTROLLER, "mlrun", old=platforms) == []


def snapshot(claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "snap", "namespace": "ml"},
        "spec": {"source": {"persistentVolumeClaimName": claim}},
    }


@pytest.mark.parametrize("claim", ["v-r1-data", "v-train-scratch"])
def test_a_snapshot_of_a_platform_claim_is_the_platforms(claim: str) -> None:
    assert judged(snapshot(claim), SHIPPED, ALICE, "ml") == {"ownership.not-a-run"}
    assert judged(snapshot(claim), SHIPPED, CORE, "ml") == set()


def test_a_snapshot_of_her_own_claim() -> None:
    assert judged(snapshot("mine"), SHIPPED, ALICE, "ml") == set()
    # routed (a claim of any name may be a Pod's own, read from the cache), and allowed
    assert routed(snapshot("mine"), SHIPPED, ALICE, "ml") == ["validate-reserved-names.runguard.io"]
    # from a pre-provisioned content: no claim is named
    content = snapshot("mine")
    content["spec"]["source"] = {"volumeSnapshotContentName": "v-r1-data"}
    assert judged(content, SHIPPED, ALICE, "ml") == set()


def test_the_platforms_installers_make_its_token_secrets() -> None:
    """A chart may ship a long-lived token Secret for the platform's account."""
    from webhook.policy.model import Policy, build_run_policy

    policy = Policy.of(
        build_run_policy(
            {
                "spec": {
                    "platform": {"identities": ["serviceaccount:p:core"], "installers": ["helm"]}
                }
            },
            [],
        )
    )
    helm = Requester("helm", ("system:authenticated",))
    assert judged(token_secret("core", "p"), policy, helm, "p") == set()
    assert judged(token_secret("core", "p"), policy, ALICE, "p") == {"ownership.service-account"}


def test_routing_is_what_the_token_rule_judges() -> None:
    """Every token Secret request the engine would refuse is routed, and a routed one is
    one it judges: a token Secret newly naming a platform's account (whoever asks;
    MLRun's API is an identity of both RunPolicies that name the two accounts)."""
    accounts = ("mlrun-api", "default", "nuclio")
    for namespace, account, kind, who, before in itertools.product(
        ("mlrun", "ml"), accounts, ("kubernetes.io/service-account-token", "Opaque"),
        (ALICE, MLRUN_API), (None, *accounts),
    ):  # fmt: skip
        obj = token_secret(account, namespace, type=kind)
        old = None if before is None else token_secret(before, namespace, type=kind)
        refused = judged(obj, MLRUN, who, namespace, old)
        # MLRun's API and Nuclio's controller (an identity of the Nuclio RunPolicy)
        named = kind.endswith("token") and namespace == "mlrun" and account != "default"
        expected = named and before != account
        case = (namespace, account, kind, who.username, before)
        assert bool(routed(obj, MLRUN, who, namespace, old)) == expected, case
        assert refused == ({"ownership.service-account"} if expected and who is ALICE
                           else set()), case  # fmt: skip


def test_routing_is_what_the_snapshot_rule_judges() -> None:
    for claim, who in itertools.product(("v-r1-data", "v-data", "mine", None), (ALICE, CORE)):
        obj = snapshot(claim or "")
        if claim is None:
            del obj["spec"]["source"]["persistentVolumeClaimName"]
        platform = claim == "v-r1-data"  # v-{labels[dhcore/run]}-*
        # every snapshot naming a claim is routed: a claim of any name may be a Pod's own
        assert bool(routed(obj, SHIPPED, who, "ml")) == (claim is not None), (claim, who)
        assert judged(obj, SHIPPED, who, "ml") == (
            {"ownership.not-a-run"} if platform and who is ALICE else set()
        ), (claim, who)
