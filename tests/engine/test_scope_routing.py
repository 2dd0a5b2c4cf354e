"""Routing covers judgment: every request the engine would deny or change reaches a
webhook, for any object under any set of RunPolicies.

Objects (Pods, pod controllers and a RayJob whose templates are what ``/mutate`` writes
the profile into, with or without run labels, naming the objects of one
platform or another, running as a platform's account, carrying forged records) are
created and then updated in namespaces that each RunPolicy may or may not exclude, under
RunPolicy sets of two platforms with different identities (one with ``requesters``).
The rendered webhook configurations are evaluated as the apiserver does (rules,
``namespaceSelector``, ``objectSelector`` against the object or the old one, every
``matchCondition`` with a real CEL library), and the engine judges the same request:

- a request ``/mutate`` would patch reaches a mutating webhook;
- a request ``/validate`` would deny (after the mutation the apiserver applied) reaches
  a validating webhook.

The CEL library is cel-expr-python (CEL's C++ implementation, with the optional types
the conditions are written in), already locked for ``tests/install/test_manifests.py``. The
apiserver runs cel-go; ``tests/e2e/test_routing.py`` sends such objects through it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.cluster_state import Meta, OwnerRef, State
from harness.routing import RESOURCES, Cel, calls
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.engine import mutate, validate
from webhook.engine.context import Context, Requester
from webhook.engine.scope import in_scope
from webhook.install import manifests
from webhook.keys import PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import Policy, build_run_policy

NAMESPACES = ("ml", "team")
CORE_ID = "system:serviceaccount:digitalhub:core"
OTHER_ID = "system:serviceaccount:team:other-ctl"
CORE = Requester(CORE_ID, ("system:serviceaccounts",))
OTHER = Requester(OTHER_ID, ("system:serviceaccounts",))
ARGO_ID = "system:serviceaccount:digitalhub:argo-workflow-controller"
ARGO = Requester(ARGO_ID, ("system:serviceaccounts",))
ALICE = Requester("alice", ("developers", "system:authenticated"))
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
BATCH = {"app": "batch"}
OTHERS = {"team": "other", "other/run": "r1"}
KUBERAY_ID = "system:serviceaccount:digitalhub:kuberay"
RAY_TEMPLATES = {"kind": "ray.io/RayJob", "suspend": "spec.suspend",
                 "paths": ["spec.rayClusterSpec.headGroupSpec.template",
                           "spec.rayClusterSpec.workerGroupSpecs[*].template"]}  # fmt: skip


def _run_policy(
    name: str, selector: dict[str, Any], excluded: frozenset[str], platform: str | None,
    requesters: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"selector": selector, "excludeNamespaces": sorted(excluded)}
    if requesters:
        spec["requesters"] = list(requesters)
    if platform == "core":
        spec["platform"] = {"identities": [CORE_ID],
                            "operators": [{"identity": ARGO_ID,
                                           "kinds": ["argoproj.io/Workflow"]},
                                          {"identity": KUBERAY_ID, "kinds": ["ray.io/RayJob"],
                                           "templates": [RAY_TEMPLATES]}]}  # fmt: skip
        spec["secrets"] = {"allowed": ["sec-*-{labels[dhcore/run]}"], "onForbidden": "Strip"}
        spec["volumes"] = {"platformClaims": ["v-{labels[dhcore/run]}-*"],
                           "onPreExisting": "Strip"}  # fmt: skip
    elif platform == "other":
        spec["platform"] = {"identities": [OTHER_ID]}
        spec["secrets"] = {"allowed": ["other-creds"], "onForbidden": "Strip"}
    return {"apiVersion": "runguard.io/v1", "kind": "RunPolicy", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


_POLICIES: dict[tuple[Any, ...], Policy] = {}


def policy_set(
    exclusions: tuple[frozenset[str], ...], batch_platform: str | None, batch_requesters: bool
) -> Policy:
    """Three RunPolicies tried in this order: a batch one (a platform or none, maybe with
    requesters), the Core's runs, and another platform's; each excluding its own."""
    key = (exclusions, batch_platform, batch_requesters)
    if key not in _POLICIES:
        docs = [
            _run_policy(
                "batch",
                {"matchLabels": BATCH},
                exclusions[0],
                batch_platform,
                (CORE_ID,) if batch_requesters else (),
            ),  # fmt: skip
            _run_policy(
                "core",
                {
                    "matchLabels": {"app.kubernetes.io/managed-by": "dhcore"},
                    "matchExpressions": [{"key": "dhcore/run", "operator": "Exists"}],
                },
                exclusions[1],
                "core",
            ),  # fmt: skip
            _run_policy("other", {"matchLabels": {"team": "other"}}, exclusions[2], "other"),
        ]
        _POLICIES[key] = Policy.of(*(build_run_policy(d, []) for d in docs))
    return _POLICIES[key]


# --- the apiserver's routing, read from the rendered configurations -----------------------


@pytest.fixture(scope="module")
def cel() -> Cel:
    return Cel()  # harness/routing.py's environment: optional types, strings


# --- the objects -----------------------------------------------------------------------

labels = st.sampled_from([{}, BATCH, RUN, OTHERS, {**BATCH, **RUN}, {"app": "web"}])
annotations = st.sampled_from([
    {}, {REQUESTED_BY: "alice"}, {PLATFORM_RECORD: "true"},
    {REQUESTED_BY: CORE_ID, PLATFORM_RECORD: "true"},
])  # fmt: skip
policy_labels = st.sampled_from([None, "batch", "core", "other", "elsewhere"])
secrets = st.sampled_from([None, "sec-api-r1", "other-creds", "mine"])
claims = st.sampled_from([None, "v-r1-data", "mydata", "train-scratch"])
device_claims = st.sampled_from([None, "train-gpu-x7k2p", "mygpu"])
accounts = st.sampled_from([None, "other-ctl", "default"])
# The cluster: claims a controller made for the platform's run Pod train (its ephemeral
# volume's, its device claim from a template), owned by that Pod, in every namespace.
CLUSTER = State([
    Meta(kind, namespace, name, f"uid-{namespace}-{name}",
         owners=(OwnerRef("Pod", "train", f"uid-{namespace}-train", True),))
    for namespace in NAMESPACES
    for kind, name in (("PersistentVolumeClaim", "train-scratch"),
                       ("ResourceClaim", "train-gpu-x7k2p"))
])  # fmt: skip


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "python:3.11"}
    spec: dict[str, Any] = {"containers": [container]}
    secret, claim, account = draw(secrets), draw(claims), draw(accounts)
    if secret is not None:
        container["envFrom"] = [{"secretRef": {"name": secret}}]
    if claim is not None:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    device = draw(device_claims)
    if device is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": device}]
    if account is not None:
        spec["serviceAccountName"] = account
    meta: dict[str, Any] = {"labels": dict(draw(labels)), "annotations": dict(draw(annotations))}
    forged = draw(policy_labels)
    if forged is not None:
        meta["labels"][POLICY_LABEL] = forged
    kind = draw(st.sampled_from(list(RESOURCES)))
    if kind == "Workflow":
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": kind,
                "metadata": {"name": "w", **meta},
                "spec": {"entrypoint": "main",
                         "templates": [{"name": "main", "container": container}]}}  # fmt: skip
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **meta},
                "spec": spec}  # fmt: skip
    template = {"metadata": {"labels": dict(meta["labels"])}, "spec": spec}
    top = {"name": "c", "annotations": meta["annotations"]}
    if kind == "RayJob":  # the run's labels on its templates, as KubeRay copies them
        return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": top,
                "spec": {"rayClusterSpec": {
                    "headGroupSpec": {"template": template},
                    "workerGroupSpecs": [{"template": copy.deepcopy(template)}]}}}  # fmt: skip
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": top,
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}},
        }
    api = "batch/v1" if kind == "Job" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "metadata": top,
            "spec": {"template": template}}  # fmt: skip


def _template(obj: dict[str, Any]) -> dict[str, Any]:
    """Where the object's Pods' labels and spec are: the Pod itself, or its template."""
    if obj["kind"] in ("Pod", "Workflow"):
        return obj
    spec = obj["spec"]
    if obj["kind"] == "RayJob":
        template: dict[str, Any] = spec["rayClusterSpec"]["headGroupSpec"]["template"]
        return template
    return spec["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" else (
        spec["template"])  # fmt: skip


def relabel(
    obj: dict[str, Any], new_labels: dict[str, str], new_annotations: dict[str, str]
) -> Any:
    """``obj`` with other labels (the Pod's or the template's) and annotations: what an
    UPDATE may send, the spec kept (a Pod's is immutable)."""
    out = copy.deepcopy(obj)
    out["metadata"]["annotations"] = dict(new_annotations)
    template = _template(out)
    template["metadata"] = {**template.get("metadata", {}), "labels": dict(new_labels)}
    return out


def restatus(
    obj: dict[str, Any], new_labels: dict[str, str], new_annotations: dict[str, str]
) -> Any:
    """``obj`` with other labels and annotations of its own: what a status update may
    store (the apiserver puts back the spec, a template's labels included)."""
    out = copy.deepcopy(obj)
    out["metadata"]["labels"] = dict(new_labels)
    out["metadata"]["annotations"] = dict(new_annotations)
    return out


def reimage(obj: dict[str, Any]) -> Any:
    """``obj`` running another image: what ``kubectl set image`` sends."""
    out = copy.deepcopy(obj)
    if out["kind"] == "Workflow":
        out["spec"]["templates"][0]["container"]["image"] = "evil:latest"
    else:
        _template(out)["spec"]["containers"][0]["image"] = "evil:latest"
    return out


exclusions = st.tuples(*[st.frozensets(st.sampled_from(NAMESPACES)) for _ in range(3)])
requesters = st.sampled_from([ALICE, CORE, OTHER, ARGO])


def _judged(
    cel: Cel, policy: Policy, obj: Any, old: Any, namespace: str, who: Requester,
    subresource: str = "",
) -> Any:  # fmt: skip
    """The request as the apiserver runs it: the mutating webhooks it routes, then the
    validating ones, each asserted to be routed when the engine would act; the stored
    object."""
    operation = "CREATE" if old is None else "UPDATE"
    mutating, validating = manifests.webhook_configurations(policy)
    context = Context(who, CLUSTER, operation, subresource)
    mutation = mutate(obj, policy, namespace=namespace, old=old, context=context)
    assert mutation.error is None, mutation.error
    if mutation.patch:
        called = calls(cel, mutating, obj, old, namespace, operation, who, subresource)
        assert called, f"/mutate would change {obj} in {namespace}, and no webhook is called"
    stored = mutation.object
    validation = validate(stored, policy, namespace=namespace, old=old, context=context)
    assert validation.error is None, validation.error
    if mutation.patch or not validation.allowed:  # and judgment stays within the scope
        assert any(
            in_scope(policy, p, o, namespace) for p in policy.run_policies for o in (obj, old)
        ), f"{obj} in {namespace}: judged, and in no RunPolicy's scope"
    if not validation.allowed:
        called = calls(cel, validating, stored, old, namespace, operation, who, subresource)
        assert called, (
            f"/validate would deny {stored} in {namespace} ({validation.message()}), "
            "and no webhook is called"
        )
        return None
    return stored


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    excluded=exclusions,
    batch_platform=st.sampled_from([None, "core", "other"]),
    batch_requesters=st.booleans(),
    obj=objects(),
    namespace=st.sampled_from(NAMESPACES),
    creator=requesters,
    editor=requesters,
    new_labels=labels,
    new_annotations=annotations,
)
def test_every_request_the_engine_judges_reaches_a_webhook(
    cel: Cel,
    excluded: tuple[frozenset[str], ...],
    batch_platform: str | None,
    batch_requesters: bool,
    obj: dict[str, Any],
    namespace: str,
    creator: Requester,
    editor: Requester,
    new_labels: dict[str, str],
    new_annotations: dict[str, str],
) -> None:
    policy = policy_set(excluded, batch_platform, batch_requesters)
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    stored = _judged(cel, policy, obj, None, namespace, creator)
    if stored is None:
        return
    kept = {**stored["metadata"].get("annotations", {}), **new_annotations}
    updates = [relabel(stored, new_labels, kept), relabel(stored, new_labels, new_annotations)]
    for edited in updates:
        if edited != stored:
            _judged(cel, policy, edited, stored, namespace, editor)
    if obj["kind"] not in ("Workflow", "RayJob"):  # a custom resource's status keeps its metadata
        for edited in (restatus(stored, new_labels, kept), restatus(stored, {}, {})):
            if edited != stored:
                _judged(cel, policy, edited, stored, namespace, editor, "status")
    _judged(cel, policy, reimage(stored), stored, namespace, editor)


def test_a_pod_matching_an_excluded_run_policys_selector_is_not_a_run_there(cel: Cel) -> None:
    """The references condition reads each RunPolicy's exclusions: a copy of a run,
    labelled for a RunPolicy that leaves the namespace out, is routed where the other
    RunPolicy's platform looks, and not where every RunPolicy leaves it out."""
    policy = policy_set((frozenset({"team"}), frozenset(), frozenset()), "core", False)
    copy_ = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "p", "labels": dict(BATCH), "namespace": "team"},
             "spec": {"containers": [{
                 "name": "c", "image": "x", "envFrom": [{"secretRef": {"name": "sec-api-r1"}}],
             }]}}  # fmt: skip
    _, validating = manifests.webhook_configurations(policy)
    assert calls(cel, validating, copy_, None, "team", "CREATE", ALICE) == [
        manifests.VALIDATING_REFERENCES_WEBHOOK
    ]
    # in ml the batch RunPolicy governs it: its own Pod webhook
    assert calls(cel, validating, {**copy_, "metadata": {**copy_["metadata"],
                                                         "namespace": "ml"}},
                 None, "ml", "CREATE", ALICE) == [manifests.VALIDATING_WEBHOOK]  # fmt: skip
    decision = validate(copy_, policy, namespace="team", context=Context(ALICE, State([])))
    assert not decision.allowed
    assert "ownership.not-a-run" in {v.rule for v in decision.violations}


# --- what the property found, each kept as a case ------------------------------------------


def _plain_pod(labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "labels": dict(labels)},
            "spec": {"containers": [{"name": "main", "image": "python:3.11"}]}}  # fmt: skip


def test_an_update_keeps_a_pod_out_of_a_run_policy_whose_requesters_did_not_create_it() -> None:
    """False refusal: Alice's Pod with the labels of a RunPolicy whose ``requesters`` are
    the Core's is none's; any update of it was refused as "these labels make it a run"
    (``scope.labels`` ignored the requesters). Entering is now a RunPolicy the new labels
    select and the old ones did not."""
    policy = policy_set((frozenset(), frozenset(), frozenset()), None, True)
    stored = mutate(_plain_pod(BATCH), policy, namespace="ml",
                    context=Context(ALICE, State([]))).object  # fmt: skip
    assert POLICY_LABEL not in stored["metadata"]["labels"]
    annotated = copy.deepcopy(stored)
    annotated["metadata"]["annotations"] = {"note": "x"}
    update = Context(ALICE, State([]), "UPDATE")
    assert validate(annotated, policy, namespace="ml", old=stored, context=update).allowed
    entering = copy.deepcopy(stored)
    entering["metadata"]["labels"] = dict(RUN)
    denied = validate(entering, policy, namespace="ml", old=stored, context=update)
    assert "scope.labels" in {v.rule for v in denied.violations}


def test_another_installations_policy_label_is_left_alone_on_update() -> None:
    """A ``runguard.io/policy`` naming none of this installation's RunPolicies is inert
    and never routed here: an update removing it is left alone (``/mutate`` put it back,
    a change no webhook would make), while one writing one of ours puts the old back."""
    policy = policy_set((frozenset(), frozenset(), frozenset()), None, False)
    context = Context(ALICE, State([]))
    stored = mutate(_plain_pod({POLICY_LABEL: "elsewhere"}), policy, namespace="ml",
                    context=context).object  # fmt: skip
    assert stored["metadata"]["labels"] == {POLICY_LABEL: "elsewhere"}
    update = Context(ALICE, State([]), "UPDATE")
    removed = copy.deepcopy(stored)
    removed["metadata"]["labels"] = {}
    assert not mutate(removed, policy, namespace="ml", old=stored, context=update).patch
    ours = copy.deepcopy(stored)
    ours["metadata"]["labels"] = {POLICY_LABEL: "core"}
    put_back = mutate(ours, policy, namespace="ml", old=stored, context=update).object
    assert put_back["metadata"]["labels"] == {POLICY_LABEL: "elsewhere"}
