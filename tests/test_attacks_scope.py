"""Attacks on the scope decision: RunPolicies whose exclusions differ, and two platforms
in one cluster (``webhook/engine/scope.py``, ``rules/trust.py``, the rendered run
conditions of ``webhook/install/manifests.py``).

The attacker has ``edit`` in a run namespace. A chain passes only when every step
passes; each test refuses at least one step, and says which got through before.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from test_manifests import Cel
from test_ownership import State
from test_scope_routing import calls
from test_trust import ALICE, ARGO, CORE, SHIPPED, pod, rules

from webhook.engine import connect, evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import LabelSelector, Policy, with_alternatives

REPO = Path(__file__).resolve().parents[1]
MLRUN = load_policy(REPO / "policies" / "examples" / "mlrun")
MLRUN_API = Requester("system:serviceaccount:mlrun:mlrun-api", ("system:serviceaccounts",))
# A run Pod's own token (its account, bound to it): what a user's code in a Pod holds.
LAUNCHER = Requester("system:serviceaccount:ml:launcher", ("system:serviceaccounts",))
BATCH = {"app": "batch"}


def _alone(p: Policy) -> Policy:
    return p.model_copy(update={"alternatives": ()})


def _excluding_ml() -> Policy:
    """The shipped RunPolicies behind a first one, for batch Pods, that leaves ``ml``
    out (the Core's runs are judged there by the shipped ones)."""
    builds, runs = SHIPPED.run_policies()
    batch = _alone(builds).model_copy(
        update={
            "name": "a-batch",
            "selector": LabelSelector.model_validate({"matchLabels": BATCH}),
            "exclude_namespaces": builds.exclude_namespaces | {"ml"},
        }
    )
    return with_alternatives([batch, _alone(builds), _alone(runs)])


EXCLUDING = _excluding_ml()
TWO = with_alternatives([_alone(p) for p in (*SHIPPED.run_policies(), *MLRUN.run_policies())])


def admitted(obj: dict[str, Any], policy: Policy, who: Requester) -> dict[str, Any]:
    decision = evaluate(obj, policy, namespace="ml", context=Context(who, State([])))
    assert decision.allowed, decision.message()
    return decision.object


def door(target: Any, policy: Policy, who: Requester, by: Any = None, how: str = "exec") -> Any:
    context = Context(who, State([]), "CONNECT", how)
    return connect(target, policy, namespace="ml", context=context, by=by)


def _batch_copy_of_a_run() -> dict[str, Any]:
    """A copy of the Core's run (its claim and secret), labelled for the batch
    RunPolicy, which leaves ``ml`` out."""
    return pod(labels=dict(BATCH))


def test_a_copy_labelled_for_a_run_policy_that_excludes_the_namespace_is_judged() -> None:
    """Exclusions that differ per RunPolicy. The references condition took a Pod matching
    any RunPolicy's selector for a run, so a copy of the Core's run labelled for the
    batch RunPolicy, which leaves ``ml`` out, reached no webhook in ``ml``; and the
    engine read the exclusions of the first RunPolicy (governing-else-first) for a Pod
    none governs, so ``ownership.not-a-run`` was skipped. Now: a run only where its
    RunPolicy looks, each RunPolicy by its own exclusions."""
    cel = Cel()
    copy_ = {**_batch_copy_of_a_run()}
    mutating, validating = manifests.webhook_configurations(EXCLUDING)
    assert calls(cel, mutating, copy_, None, "ml", "CREATE", ALICE) == [
        manifests.MUTATING_REFERENCES_WEBHOOK
    ]
    assert calls(cel, validating, copy_, None, "ml", "CREATE", ALICE) == [
        manifests.VALIDATING_REFERENCES_WEBHOOK
    ]
    decision = evaluate(copy_, EXCLUDING, namespace="ml", context=Context(ALICE, State([])))
    assert not decision.allowed
    assert rules(decision) == {"ownership.not-a-run"}
    paths = {v.path for v in decision.violations}
    assert paths == {"spec.volumes[0]", "spec.containers[0].envFrom[0]"}


def test_forged_records_on_a_pod_of_an_excluded_run_policy_are_overwritten() -> None:
    """The same door for records: a Pod labelled for the batch RunPolicy carrying
    ``runguard.io/platform: "true"`` kept it (no webhook, and the engine's owner of the
    records was the first RunPolicy, which excludes ``ml``); its token then opened a
    shell into the Core's run as a platform Pod's. Now the Pod reaches ``/mutate``, the
    record is the platform's to write (none: Alice created it), and a Pod that skipped
    ``/mutate`` is refused; its token opens nothing of the platform's."""
    cel = Cel()
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine", "namespace": "ml", "labels": dict(BATCH),
                     "annotations": {PLATFORM_RECORD: "true"}},
        "spec": {"serviceAccountName": "launcher",
                 "containers": [{"name": "main", "image": "python:3.11"}]},
    }  # fmt: skip
    mutating, validating = manifests.webhook_configurations(EXCLUDING)
    assert calls(cel, mutating, forged, None, "ml", "CREATE", ALICE) == [
        manifests.MUTATING_REFERENCES_WEBHOOK
    ]
    assert calls(cel, validating, forged, None, "ml", "CREATE", ALICE) == [
        manifests.VALIDATING_REFERENCES_WEBHOOK
    ]
    stored = admitted(forged, EXCLUDING, ALICE)
    assert stored["metadata"]["annotations"] == {REQUESTED_BY: "alice"}
    bypassed = validate(forged, EXCLUDING, namespace="ml", context=Context(ALICE, State([])))
    assert "ownership.stamp" in rules(bypassed) and not bypassed.allowed
    run = admitted(pod(), EXCLUDING, CORE)
    assert run["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    denied = door(run, EXCLUDING, LAUNCHER, by=stored)  # what the cluster holds now
    assert rules(denied) == {"ownership.debug"}


def test_a_run_policy_excluding_the_namespace_judges_nothing_there() -> None:
    """The other side of each RunPolicy's own exclusions: in ``ml`` the batch RunPolicy
    governs nothing (its Pod webhook leaves ``ml`` out), while the shipped ones judge
    there as before; where every RunPolicy leaves a namespace out, nothing is touched."""
    mine = admitted(pod(labels=dict(BATCH), **{}), EXCLUDING, CORE)
    assert mine["metadata"]["labels"].get(POLICY_LABEL) is None
    hardened = admitted(pod(labels={**BATCH, "app.kubernetes.io/managed-by": "dhcore",
                                    "dhcore/run": "r1"}), EXCLUDING, CORE)  # fmt: skip
    assert hardened["metadata"]["labels"][POLICY_LABEL] == "digitalhub"
    copy_ = _batch_copy_of_a_run()
    context = Context(ALICE, State([]))
    for namespace in ("kube-system", "kube-public"):
        assert not mutate(copy_, EXCLUDING, namespace=namespace, context=context).patch
        assert validate(copy_, EXCLUDING, namespace=namespace, context=context).allowed


# --- two platforms ---------------------------------------------------------------------


def mlrun_run() -> dict[str, Any]:
    """MLRun's run Pod in ml, created by its API: MLRun's."""
    labels = {"mlrun/class": "job", "mlrun/project": "p1", "mlrun/uid": "u1"}
    made = copy.deepcopy(pod(labels=labels))
    made["spec"] = {"serviceAccountName": "launcher",
                    "containers": [{"name": "main", "image": "python:3.11"}]}  # fmt: skip
    return admitted(made, TWO, MLRUN_API)


def test_one_platforms_pod_token_opens_no_shell_into_the_others_pod() -> None:
    """Two platforms. The exemption for a Pod-bound token (``by``: a platform Pod opening
    a shell into another, as an MPI launcher does) accepted a Pod of any platform: the
    code in MLRun's run, holding its Pod's token, opened ``kubectl exec`` into the
    Core's run and read its secrets. Now the opener must be the platform of every
    RunPolicy the target is the platform's for."""
    core_run = admitted(pod(), TWO, CORE)
    theirs = mlrun_run()
    assert theirs["metadata"]["labels"][POLICY_LABEL] == "mlrun"
    assert theirs["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    for how in ("exec", "attach", "portforward", "proxy", "token"):
        denied = door(core_run, TWO, LAUNCHER, by=theirs, how=how)
        assert rules(denied) == {"ownership.debug"}, how
        denied = door(theirs, TWO, LAUNCHER, by=core_run, how=how)
        assert rules(denied) == {"ownership.debug"}, how
    # within one platform the exemption holds: the Core's Pod opens the Core's
    launcher = admitted(pod(), TWO, CORE)
    assert door(core_run, TWO, LAUNCHER, by=launcher).allowed
    assert door(theirs, TWO, LAUNCHER, by=mlrun_run()).allowed


def test_one_platform_changes_none_of_the_others_objects() -> None:
    """Two platforms. ``ownership.changed`` let any platform identity change the images of
    a Pod or the template of a controller whose record said "a platform created it":
    the Core's ServiceAccount swapped the image of MLRun's run. Now only the platform
    that recorded it (its governing RunPolicy's), or its controllers, may."""
    theirs = mlrun_run()
    swapped = copy.deepcopy(theirs)
    swapped["spec"]["containers"][0]["image"] = "evil:latest"
    context = Context(CORE, State([]), "UPDATE")
    denied = validate(swapped, TWO, namespace="ml", old=theirs, context=context)
    assert "ownership.changed" in rules(denied) and not denied.allowed
    own = Context(MLRUN_API, State([]), "UPDATE")
    assert "ownership.changed" not in rules(
        validate(swapped, TWO, namespace="ml", old=theirs, context=own)
    )
    core_run = admitted(pod(), TWO, CORE)
    mine = copy.deepcopy(core_run)
    mine["spec"]["containers"][0]["image"] = "python:3.12"
    theirs_context = Context(MLRUN_API, State([]), "UPDATE")
    denied = validate(mine, TWO, namespace="ml", old=core_run, context=theirs_context)
    assert "ownership.changed" in rules(denied)
    assert "ownership.changed" not in rules(
        validate(mine, TWO, namespace="ml", old=core_run, context=Context(CORE, State([]),
                                                                          "UPDATE"))
    )  # fmt: skip


def test_one_platforms_identity_opens_no_shell_into_the_others_pod() -> None:
    """Two platforms, directly: each platform's identity is the platform of its own Pods
    only (it always was; kept with the exemption narrowed)."""
    core_run, theirs = admitted(pod(), TWO, CORE), mlrun_run()
    assert rules(door(core_run, TWO, MLRUN_API)) == {"ownership.debug"}
    assert rules(door(theirs, TWO, CORE)) == {"ownership.debug"}
    assert door(core_run, TWO, CORE).allowed and door(theirs, TWO, MLRUN_API).allowed


def test_one_platforms_operator_opens_none_of_the_others_pods() -> None:
    """Two platforms: the operator exemption (Argo's controller signalling its step Pods
    by exec) holds for the operators of the platform whose Pod it is: MLRun's Pod owned
    by a Workflow is not Argo's to open, as Argo is the Core's operator, not MLRun's."""
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf",
                "uid": "wf-1", "controller": True}  # fmt: skip
    theirs = mlrun_run()
    theirs["metadata"]["ownerReferences"] = [workflow]
    assert rules(door(theirs, TWO, ARGO)) == {"ownership.debug"}
    core_step = admitted(pod(), TWO, CORE)
    core_step["metadata"]["ownerReferences"] = [workflow]
    assert door(core_step, TWO, ARGO).allowed
