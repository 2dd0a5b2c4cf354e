"""Attacks across two platforms in one cluster (the Core's RunPolicies first, then MLRun's:
``TWO``): one platform's identity, operator or Pod token opening the other's Pods,
changing its objects or scaling its Model, a record read as the wrong platform's, a
platform sharing an identity with another, a run of one reading the other's Secret.

The attacker is ``alice`` with ``edit`` in a run namespace, and, separately, a second
platform's identity in the same cluster. A chain passes when every step passes; each
test refuses at least one step, and says which got through before and the fix made.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO
from harness.attack_chains import (
    LAUNCHER,
    MLRUN,
    MLRUN_API,
    NUCLIO,
    TWO,
    _updated,
    admitted,
    deployment,
    door,
    judged_by,
    mlrun_run,
    model,
    nuclio_function,
    scale_request,
)
from harness.cluster_state import State
from harness.shells import shell, users_own_pod
from harness.shipped import ALICE, ARGO, CORE, SHIPPED, pod, rules

from webhook.clusterstate import StaticClusterState
from webhook.engine import connect, evaluate, validate
from webhook.engine.context import Context, Requester
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy
from webhook.serving import admission

# --- a shell or a change into the other platform's objects ------------------------------


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


def test_a_platform_opens_a_shell_in_its_own_pod_beside_another_platform() -> None:
    """False refusal. A cluster running DigitalHub and MLRun loads both policies. The
    Core's run is recorded ``runguard.io/platform: "true"``; for MLRun's RunPolicies,
    ``recorded_platform`` (rules/ownership.py) reads the same "true" as MLRun's, so
    ``_platform_pod_for`` refuses the Core a shell (and a debug container) in its own
    Pod, and MLRun's API one in its own. Fix: judge a recorded Pod only against the
    RunPolicy that recorded it (its ``runguard.io/policy`` label, or a record naming the
    platform), or against the stamp's identity."""
    both = Policy.of(*SHIPPED.run_policies, *MLRUN.run_policies)
    run = evaluate(pod(), both, namespace="ml", context=Context(CORE, State([]))).object
    assert run["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    assert rules(shell(ALICE, run)) == {"ownership.debug"}
    decision = connect(run, both, namespace="ml", context=Context(CORE, State([]), "CONNECT",
                                                                  "exec"))  # fmt: skip
    assert decision.allowed, decision.message()


def test_her_own_run_stays_hers_beside_another_platform() -> None:
    both = Policy.of(*SHIPPED.run_policies, *MLRUN.run_policies)
    context = Context(ALICE, State([]), "CONNECT", "exec")
    assert connect(users_own_pod(), both, namespace="ml", context=context).allowed


def test_a_pod_token_of_a_platform_sharing_an_identity_opens_what_its_identity_may_not() -> None:
    """Two platforms sharing an identity (the MLRun example: ``mlrun`` with
    ``mlrun-api``, ``nuclio`` with ``mlrun-api`` and ``nuclio``). Directly, Nuclio's
    identity is refused ``kubectl exec`` into MLRun's run (``_judging``: it is not
    ``mlrun``'s identity). The token of a Nuclio function's Pod (running the user's
    serving code, created by Nuclio's controller) opens it: ``check_shell``'s ``by``
    compares with ``scope.same_platform``, which holds when any identity is shared.
    A Pod's token is thus worth more than its platform's own identity, and a third
    platform sharing ``nuclio`` with a fourth would chain on (the relation is not
    transitive, nor meant to be). Gap: ``webhook/engine/scope.py`` ``same_platform`` as
    used by ``rules/trust.py`` ``check_shell``. Fix: the opener Pod's platform must be
    one the target's owners' identities cover (its recording RunPolicy's identities a
    subset of the target's), or the same rule as for the identity itself. Now:
    ``scope.may_open``, each of the opener's platform identities one of the target's."""
    function = nuclio_function()
    run = mlrun_run()
    assert rules(door(run, TWO, NUCLIO)) == {"ownership.debug"}  # the identity: refused
    assert rules(door(run, TWO, LAUNCHER, by=function)) == {"ownership.debug"}


# --- whose record -----------------------------------------------------------------------


def test_a_platform_record_is_read_as_another_platforms_once_its_template_names_nothing() -> None:
    """Two platforms (the Core first, then MLRun). MLRun's API creates a Deployment
    outside every selector whose template reads ``mlrun-auth-secrets.abc``:
    ``scope.recorder`` finds MLRun by that claim and records ``runguard.io/platform:
    "true"``. MLRun's API later drops the Secret from the template (allowed). The record
    says "a platform created it", not which: ``scope.recorder`` now finds no claim and
    reads it as the *first* platform's (the Core's). So the Core's identity changes
    the image of MLRun's Deployment (``ownership.changed`` sees its own platform), and
    MLRun's API is refused its own Deployment. Gap: ``webhook/engine/scope.py``
    ``recorder`` (``candidates[0]`` for a carried record) and ``trust._platform_old``.
    Fix: write which RunPolicy's platform recorded the object (e.g. the record's value
    or a ``runguard.io/platform-policy`` annotation, kept like the record) and read that
    RunPolicy back; an object recorded before that is read as the platform of whoever
    stamped it (``runguard.io/requested-by`` is a platform identity). Now: the record
    names its RunPolicy in ``runguard.io/platform-policy``, read back by
    ``scope.recorder`` (``stored``)."""

    def helper(secret: str | None, image: str = "mlrun/helper:1") -> dict[str, Any]:
        container: dict[str, Any] = {"name": "m", "image": image}
        if secret:
            container["envFrom"] = [{"secretRef": {"name": secret}}]
        return deployment({"app": "helper"}, {"containers": [container]})

    made = judged_by(helper("mlrun-auth-secrets.abc"), MLRUN_API, TWO).object
    assert made["metadata"]["annotations"][PLATFORM_RECORD] == "true"
    assert made["metadata"]["annotations"][PLATFORM_POLICY] == "mlrun"
    dropped = _updated(helper(None), made, MLRUN_API)
    swapped = copy.deepcopy(dropped)
    swapped["spec"]["template"]["spec"]["containers"][0]["image"] = "core/other:1"
    context = Context(CORE, State([]), "UPDATE")
    by_core = validate(swapped, TWO, namespace="ml", old=dropped, context=context)
    own = Context(MLRUN_API, State([]), "UPDATE")
    by_mlrun = validate(swapped, TWO, namespace="ml", old=dropped, context=own)
    assert "ownership.changed" in rules(by_core) and by_mlrun.allowed


def test_another_platforms_model_is_not_scaled_through_the_first_platforms_exemption(
    tmp_path: Path,
) -> None:
    """Two platforms declaring KubeAI: the first RunPolicy's exemption (its own identity,
    or none applying) once decided for both, so a user, or the Core, scaled the second
    platform's Model. Each platform's Model is judged by its own RunPolicy."""
    shutil.copytree(REPO / "policies", tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "examples")
    other = yaml.safe_load((REPO / "policies" / "runpolicy.yaml").read_text())
    other["metadata"]["name"] = other["spec"]["platform"] = "other"
    other_platform = yaml.safe_load((REPO / "policies" / "platform.yaml").read_text())
    other_platform["metadata"]["name"] = "other"
    other_platform["spec"]["identities"] = ["system:serviceaccount:other:api"]
    (tmp_path / "other.yaml").write_text(yaml.safe_dump_all([other, other_platform]))
    two = load_policy(tmp_path)
    others_model = model({REQUESTED_BY: "system:serviceaccount:other:api", PLATFORM_RECORD: "true",
                          PLATFORM_POLICY: "other"})  # fmt: skip
    state = StaticClusterState.from_documents([others_model])
    for who in (ALICE, CORE):
        outcome = admission.review("validate", scale_request(who), two, state)  # type: ignore[arg-type]
        assert outcome.response["response"]["allowed"] is False, who
        assert "[ownership.changed]" in outcome.response["response"]["status"]["message"]
    other_api = Requester("system:serviceaccount:other:api")
    outcome = admission.review("validate", scale_request(other_api), two, state)  # type: ignore[arg-type]
    assert outcome.response["response"]["allowed"] is True


# --- whose Secret -----------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["digitalhub-common-creds", "sec-a-r1"])
def test_a_run_of_one_platform_reads_the_others_secret_through_a_drivers_map(
    secret: str,
) -> None:
    """Chain (two platforms, ``TWO``): Alice's MLRun-labelled Pod in ``ml`` gives a
    flexVolume driver ``options: {secretName: <the Core's Secret>}``. A driver's map
    value counted as a Secret reference only when the governing RunPolicy (MLRun's)
    names it, so the Core's Secret passed where MLRun's own was stripped. Gap:
    ``webhook/engine/rules/secrets.py`` ``secret_references``. Fix: a map value named by
    any platform looking at the namespace is a Secret reference, refused since it is not
    among the governing RunPolicy's allowed secrets; an ordinary value is kept."""

    def judged(value: str) -> dict[str, Any]:
        volume = {"name": "v", "flexVolume": {"driver": "v3io/fuse",
                                              "options": {"secretName": value}}}  # fmt: skip
        mine = copy.deepcopy(pod(labels={"mlrun/class": "job", "mlrun/project": "p"}))
        mine["spec"] = {"containers": [{"name": "main", "image": "i", "volumeMounts": [
            {"name": "v", "mountPath": "/v"}]}], "volumes": [volume]}  # fmt: skip
        return admitted(mine, TWO, ALICE)["spec"]

    assert judged("mlrun-project-secrets-p").get("volumes") is None
    stripped = judged(secret)
    assert stripped.get("volumes") is None
    assert stripped["containers"][0].get("volumeMounts") in (None, [])
    kept = judged("plain-value")
    assert kept["volumes"][0]["flexVolume"]["options"] == {"secretName": "plain-value"}
