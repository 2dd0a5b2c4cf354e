"""Attacks on which RunPolicy judges an object (``webhook/engine/scope.py``, the rendered
run conditions and namespace selectors of ``webhook/install/manifests.py``): RunPolicies
whose exclusions differ, an object from before the policy label, a template carrying the
label, and the profile named by an annotation instead of the label.

The attacker has ``edit`` in a run namespace. A chain passes only when every step
passes; each test refuses at least one step, and its docstring says which got through
before and the fix made.
"""

from __future__ import annotations

import copy
from typing import Any

from harness.attack_chains import LAUNCHER, _controller_ref, _meta, admitted, door
from harness.cluster_state import State
from harness.routing import Cel, calls
from harness.shipped import ALICE, BUILD, CORE, RS, RUN, SHIPPED, created, pod, rules, update

from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import LabelSelector, Policy

# --- RunPolicies whose exclusions differ ------------------------------------------------


BATCH = {"app": "batch"}


def _excluding_ml() -> Policy:
    """The shipped RunPolicies behind a first one, for batch Pods, that leaves ``ml``
    out (the Core's runs are judged there by the shipped ones)."""
    builds, runs = SHIPPED.run_policies
    batch = builds.model_copy(
        update={
            "name": "a-batch",
            "selector": LabelSelector.model_validate({"matchLabels": BATCH}),
            "exclude_namespaces": builds.exclude_namespaces | {"ml"},
        }
    )
    return Policy.of(batch, builds, runs)


EXCLUDING = _excluding_ml()


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


def test_a_namespace_only_the_first_run_policy_excludes_is_still_judged() -> None:
    """Chain: two RunPolicies (the shipped ``builds`` first, ``digitalhub``); ``builds``
    also excludes ``team-a``, where ``digitalhub`` governs the Core's runs (its own Pod
    webhook, per RunPolicy, judges and records them there). runguard-shells takes its
    namespaceSelector from the root policy only (``_Target.webhook`` ->
    ``namespace_selector(self.policy)``, webhook/install/manifests.py, before it took what every
    RunPolicy excludes), so CONNECT in ``team-a``
    never reaches runguard: exec into the Core's run there opens unjudged. Fix: exclude
    only the namespaces every ownership-enabled RunPolicy excludes (the same holds for
    the references and controllers webhooks)."""
    builds, digitalhub = SHIPPED.run_policies
    assert builds.name == "builds"
    excluded = builds.exclude_namespaces | {"team-a"}
    policy = Policy.of(builds.model_copy(update={"exclude_namespaces": excluded}), digitalhub)
    pod_hooks = [
        h for h in manifests.validating_webhook_configuration(policy)["webhooks"]
        if h["name"] == "validate-digitalhub.runguard.io"
    ]  # fmt: skip
    assert pod_hooks and all(
        "team-a" not in e["values"]
        for h in pod_hooks
        for e in h["namespaceSelector"]["matchExpressions"]
    )  # fmt: skip: the Core's runs in team-a are judged and recorded
    hooks = manifests.shells_webhook_configuration(policy)["webhooks"]
    assert len(hooks) == 2  # the doors, and tokens bound to a Pod
    shared = [  # the controllers', references' and reserved names' webhooks too
        h
        for config in manifests.webhook_configurations(policy)
        for h in config["webhooks"]
        if "objectSelector" not in h
    ]
    assert len(shared) >= 4
    for hook in [*hooks, *shared]:
        values = {v for e in hook["namespaceSelector"]["matchExpressions"] for v in e["values"]}
        assert "team-a" not in values and "runguard" in values


# --- the policy label -------------------------------------------------------------------


def test_an_object_from_before_the_policy_label_is_not_governed_by_a_lax_policy() -> None:
    """Chain: alice's Pod with the build labels, created before ``runguard.io/policy``
    existed (stamp ``alice``, no policy label; then judged by ``digitalhub``). After the
    upgrade, ``_governing`` on UPDATE chooses by the old labels with ``lambda _p: True``,
    skipping ``requesters``: ``builds`` governs it, and alice adds a root debug container
    (``kubectl debug --profile=sysadmin``-style, ``runAsUser: 0``), allowed by builds'
    ``onRoot: Allow``. The same Pod with the label is denied (``security.root``).

    Fix: for an object without a recorded policy, choose with ``requesters`` applied to
    its stamp/record (the platform record, or the stamp as a user name), never ``True``."""
    build = pod(labels=BUILD)
    build["spec"] = {"containers": [{"name": "c", "image": "busybox"}]}
    old = created(build, ALICE)
    del old["metadata"]["labels"][POLICY_LABEL]  # as stored before the label existed
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "image": "busybox", "securityContext": {"runAsUser": 0}}
    ]
    _, validation = update(new, old, ALICE, subresource="ephemeralcontainers")
    assert not validation.allowed


def test_a_template_carrying_the_policy_label_is_refused_not_relabelled() -> None:
    """Chain: alice creates a ReplicaSet (or Deployment) whose selector and template
    labels include ``runguard.io/policy: builds`` (or, outside every selector,
    ``runguard.io/policy: digitalhub``). Both are allowed; each Pod the
    replicaset-controller creates is relabelled by ``/mutate`` (``digitalhub``, resp. the
    label removed), so it no longer matches the ReplicaSet's selector: the controller
    releases it (an orphan that keeps running, not deleted with the ReplicaSet) and
    creates another, forever, up to the namespace's quota.

    Why it matters: docs/dev/guarantees.md, "Trust over time": "controllers keep working"; an
    unbounded, self-sustaining Pod flood (and orphans outside any owner) from one object.

    Fix: ``/validate`` denies (``scope.labels``) a pod controller whose selector or
    template labels carry ``runguard.io/policy`` with a value other than the one its
    Pods will get (simplest: the key at all); or ``/mutate`` writes the governing value
    into the template too, at the controller's CREATE."""
    labels = {**RUN, POLICY_LABEL: "builds"}
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "bomb", "namespace": "ml"},
          "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                   "template": {"metadata": {"labels": labels},
                                "spec": {"containers": [{"name": "c",
                                                         "image": "busybox"}]}}}}  # fmt: skip
    decision = evaluate(rs, SHIPPED, namespace="ml", context=Context(ALICE, State([])))
    stored = decision.object
    state = State([_meta("ReplicaSet", stored, "uid-bomb")])
    child = pod(labels=labels, ownerReferences=[_controller_ref("ReplicaSet", "bomb", "uid-bomb")])
    child["spec"] = copy.deepcopy(rs["spec"]["template"]["spec"])
    child_labels = created(child, RS, state)["metadata"]["labels"]
    selector = stored["spec"]["selector"]["matchLabels"]
    matches = all(child_labels.get(k) == v for k, v in selector.items())
    assert not decision.allowed or matches


# --- the profile, by annotation ---------------------------------------------------------


def deployment(annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": "ml", "uid": "d-1"},
            "spec": {"replicas": 1, "selector": {"matchLabels": RUN},
                     "template": {"metadata": {"labels": dict(RUN),
                                               "annotations": dict(annotations)},
                                  "spec": {"containers": [{"name": "main",
                                                           "image": "python:3.11"}]}}}}  # fmt: skip


def test_the_profile_annotation_of_the_platforms_deployment_is_frozen() -> None:
    """Stopped: the profile label was frozen on a run, not its annotation form (the policy
    reads the label, else the annotation): alice moved the Core's Deployment to a GPU
    profile by annotating its template, and its next Pods got it."""
    label = SHIPPED.first.profiles_config.label
    stored = evaluate(deployment({label: "cpu-large"}), SHIPPED, namespace="ml",
                      context=Context(CORE, State([]))).object  # fmt: skip
    for written in ({label: "2xa100"}, {}):
        moved = copy.deepcopy(stored)
        moved["spec"]["template"]["metadata"]["annotations"] = written
        context = Context(ALICE, State([]), "UPDATE")
        verdict = validate(moved, SHIPPED, namespace="ml", old=stored, context=context)
        assert not verdict.allowed and rules(verdict) == {"scope.labels"}, written
        assert f"spec.template.metadata.annotations[{label}]" in verdict.message()
    # adding one where the run named no profile is refused too; other annotations are not
    plain = evaluate(deployment({}), SHIPPED, namespace="ml",
                     context=Context(CORE, State([]))).object  # fmt: skip
    added = copy.deepcopy(plain)
    added["spec"]["template"]["metadata"]["annotations"] = {label: "2xa100"}
    context = Context(ALICE, State([]), "UPDATE")
    assert "scope.labels" in rules(validate(added, SHIPPED, namespace="ml", old=plain,
                                            context=context))  # fmt: skip
    other = copy.deepcopy(stored)
    other["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = (
        "2026-11-28T09:00:00Z"
    )
    assert validate(other, SHIPPED, namespace="ml", old=stored, context=context).allowed


def test_the_profile_annotation_of_a_run_pod_is_frozen() -> None:
    label = SHIPPED.first.profiles_config.label
    run = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train", "namespace": "ml", "labels": dict(RUN),
                        "annotations": {label: "cpu-large"}},
           "spec": {"containers": [{"name": "main", "image": "python:3.11"}]}}  # fmt: skip
    stored = evaluate(run, SHIPPED, namespace="ml", context=Context(CORE, State([]))).object
    moved = copy.deepcopy(stored)
    moved["metadata"]["annotations"][label] = "1xt4"
    verdict = validate(moved, SHIPPED, namespace="ml", old=stored,
                       context=Context(ALICE, State([]), "UPDATE"))  # fmt: skip
    assert not verdict.allowed and rules(verdict) == {"scope.labels"}
