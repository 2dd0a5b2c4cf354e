"""Attack chains through a run's claims, ephemeral volumes, token Secrets, snapshots,
drivers' maps and debug containers, and across two platforms and the RBAC report (one
scope decision, every connection into a Pod, the doors of a pod spec).

The attacker is ``alice`` with the built-in ``edit`` ClusterRole in a run namespace
(or bound to the recommended ``runguard-run-user``), and, separately, a second
platform's identity in the same cluster. A chain passes when every step passes: a test
asserts that some step is refused (by the engine, by routing, or shown by
``runguard audit --rbac`` for a door admission cannot see).

Chains that still get through are marked ``xfail(strict=True)``: each is a test of
what should happen, failing today, so the suite stays green and the fix turns it into
a pass (strict: an xfail that starts passing fails the run until its mark is removed).
Chains that are refused are kept as plain tests.

Known race, not tested (offline it cannot be): a ``services/proxy`` is judged on the
Service, its Endpoints and EndpointSlices as read at the moment of the request
(``webhook.serving.reach.reached_pods``); a Service whose selector she changes between
runguard's answer and the apiserver's own read of the Endpoints (milliseconds later)
is proxied to Pods runguard did not judge. The endpoints controller lags the selector
too, so the window is the controller's reaction time plus the webhook's round trip.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_attacks_connections import (
    Namespace,
    endpoints,
    her_pod,
    judged,
    platform_head,
    service,
    service_proxy,
)
from test_attacks_scope import LAUNCHER, MLRUN, MLRUN_API, TWO, admitted, door, mlrun_run
from test_doors import NAMESPACE, STRIP
from test_manifests import Cel
from test_ownership import Meta, OwnerRef, State
from test_scope_routing import RESOURCES, calls
from test_trust import ALICE, CORE, RUN, SHIPPED, created, pod, rules, update

from webhook.audit.rbacreport import platform_of, rbac_report
from webhook.engine import evaluate, mutate, validate
from webhook.engine.context import Context, Requester
from webhook.install import manifests
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, REQUESTED_BY

NUCLIO = Requester("system:serviceaccount:mlrun:nuclio", ("system:serviceaccounts",))
SECRET = "digitalhub-common-creds"  # the Core's credentials, given to its runs only
GENERATED_CLAIM = "train-gpu-x7k2p"  # the ResourceClaim made from the platform run's template
EPHEMERAL_PVC = "train-scratch"  # the PVC of the platform run's generic ephemeral volume
HER_RUN = {**RUN, "dhcore/run": "r2"}


def plain(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod of hers outside every RunPolicy's selector (``app: x``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": labels or {"app": "x"}},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec},
    }


def deployment(labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mine", "namespace": "ml", "labels": dict(labels)},
        "spec": {"selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": spec}},
    }  # fmt: skip


def as_template(obj: dict[str, Any]) -> dict[str, Any]:
    return deployment(obj["metadata"]["labels"], copy.deepcopy(obj["spec"]))


def judged_by(obj: dict[str, Any], who: Requester, policy: Any = SHIPPED, ns: str = "ml",
              state: State | None = None) -> Any:  # fmt: skip
    context = Context(who, state if state is not None else State([]))
    decision = evaluate(obj, policy, namespace=ns, context=context)
    assert decision.error is None, decision.message()
    return decision


def routed(obj: dict[str, Any], old: dict[str, Any] | None = None, op: str = "CREATE",
           sub: str = "") -> list[str]:  # fmt: skip
    """The runguard webhooks (mutating and validating) the apiserver calls for it."""
    mutating, validating = manifests.webhook_configurations(SHIPPED)
    cel = Cel()
    return [*calls(cel, mutating, obj, old, "ml", op, ALICE, sub),
            *calls(cel, validating, obj, old, "ml", op, ALICE, sub)]  # fmt: skip


# === chains that still get through =========================================================


def _of_the_run(kind: str, name: str) -> State:
    """The cluster: the claim ``name`` a controller made for the platform's run Pod
    ``train``, which is its controller owner (as the watch cache holds it)."""
    owner = OwnerRef("Pod", "train", "uid-train", True)
    return State([Meta(kind, "ml", name, f"uid-{name}", owners=(owner,))])


def _uses_generated_claim(kind: str) -> dict[str, Any]:
    mine = plain("mine", resourceClaims=[{"name": "gpu", "resourceClaimName": GENERATED_CLAIM}])
    mine["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return mine if kind == "Pod" else as_template(mine)


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
    hers is stripped (``test_attacks_doors``). Gap: ``webhook/engine/rules/devices.py``
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


def _role_binding(namespace: str, rules_: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "r", "namespace": namespace},
         "rules": rules_},
        {"apiVersion": rbac, "kind": "RoleBinding",
         "metadata": {"name": "b", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
         "subjects": [{"kind": "User", "name": "alice"}]},
    ]  # fmt: skip


def test_a_token_secret_for_the_platforms_account_in_a_run_namespace() -> None:
    """Chain (MLRun: its API's ServiceAccount ``mlrun-api`` lives in ``mlrun``, which its
    RunPolicies govern: MLRun's jobs run there). Alice, with ``create secrets`` and
    ``create pods`` in ``mlrun`` (no Secret read, no token, no impersonation: nothing
    ``runguard audit --rbac`` reports; ``tests/test_rbacreport.py`` even counts
    ``create secrets`` as harmless), creates a Secret of type
    ``kubernetes.io/service-account-token`` with the annotation
    ``kubernetes.io/service-account.name: mlrun-api``: the token controller writes the
    platform's token into it. She mounts her own Secret in a Pod outside every
    selector (not a platform name: allowed) and calls the apiserver as MLRun's API:
    every run she creates is the platform's. The Secret's CREATE is an admission
    request runguard could judge but does not route (reserved names only), and the
    report does not show the verb. Gap: ``webhook/engine/rules/ownership.py`` (no rule
    for such a Secret) and ``webhook/audit/rbacreport.py`` ``DOORS`` (``rbac.token`` lists
    ``serviceaccounts/token`` only). Fix: refuse, at CREATE and UPDATE of a Secret, type
    ``kubernetes.io/service-account-token`` naming a platform or operator
    ServiceAccount (``ownership.service_account_identities``) to anyone but the
    platform (route Secrets of that type); and report ``create secrets`` in a namespace
    holding such a ServiceAccount as ``rbac.token``."""
    token_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "my-token", "namespace": "mlrun",
                     "annotations": {"kubernetes.io/service-account.name": "mlrun-api"}},
    }  # fmt: skip
    assert ("mlrun", "mlrun-api") in {
        sa for p in MLRUN.run_policies() for sa in _accounts(p)
    }  # the platform's own account, in a namespace its RunPolicies govern
    refused = not judged_by(token_secret, ALICE, MLRUN, "mlrun").allowed
    objects = _role_binding("mlrun", [{"apiGroups": [""], "resources": ["secrets", "pods"],
                                       "verbs": ["create"]}])  # fmt: skip
    report = rbac_report(objects, platform_of(MLRUN), shells=True)
    shown = any(str(f.subject) == "User alice" for f in report.unexpected())
    assert refused or shown


def _accounts(policy: Any) -> frozenset[tuple[str, str]]:
    from webhook.engine.rules.ownership import service_account_identities

    return service_account_identities(policy)


def test_the_recommended_role_reads_the_platforms_config_maps() -> None:
    """Chain: the platform's run reads ``init-config-map-r1`` into its environment; a Pod
    of hers reading it is refused (``ownership.not-a-run``: "only its runs may read
    it"), and its volume is stripped from her runs. Bound to the recommended
    ``runguard-run-user`` (``get, list, watch configmaps``, no resourceNames), she
    ``kubectl get configmap init-config-map-r1 -o yaml`` and reads it whole, with no
    admission request, and the report shows nothing (its doors read Secrets only).
    Gap: ``webhook/audit/rbacreport.py`` ``DOORS`` and ``webhook/install/manifests.py``
    ``RUN_USER_RULES``. Fix: a door ``rbac.read-config-maps`` (get/list/watch of
    ``configmaps``, narrowed by resourceNames against ``volumes.platformConfigMaps``
    and the operators' ``configMaps``), and the recommended role without ``get/list/
    watch configmaps`` (``create, delete`` stay; a user reads hers from her Pods).
    Refused now: the role grants no read, and a role that does is reported."""
    reader = plain("copy")
    reader["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "init-config-map-r1"}}]
    assert not judged_by(reader, ALICE).allowed  # what her Pods may not read
    role = manifests.run_user_role(SHIPPED)
    rbac = "rbac.authorization.k8s.io/v1"

    def shown(role: dict[str, Any]) -> list[str]:
        objects = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}},
            role,
            {"apiVersion": rbac, "kind": "RoleBinding",
             "metadata": {"name": "b", "namespace": "ml"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": role["metadata"]["name"]},
             "subjects": [{"kind": "User", "name": "alice"}]},
        ]  # fmt: skip
        report = rbac_report(objects, platform_of(SHIPPED), shells=True)
        return [f"{f.subject} {f.door.id}" for f in report.unexpected()]

    # The recommended role no longer reads ConfigMaps (the step is refused by RBAC) ...
    reads = [r for r in role["rules"] if "configmaps" in r["resources"]
             and {"get", "list", "watch"} & set(r["verbs"])]  # fmt: skip
    assert reads == [] and shown(role) == []
    # ... and a role that does (the recommended one as it was) is shown.
    old = copy.deepcopy(role)
    old["metadata"]["name"] = "as-it-was"
    old["rules"].append({"apiGroups": [""], "resources": ["configmaps"],
                         "verbs": ["get", "list", "watch"]})  # fmt: skip
    assert shown(old) == ["User alice rbac.read-config-maps"]


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


def _updated(new: dict[str, Any], old: dict[str, Any], who: Requester) -> dict[str, Any]:
    new = copy.deepcopy(new)
    new["metadata"] = copy.deepcopy(old["metadata"])
    context = Context(who, State([]), "UPDATE")
    mutation = mutate(new, TWO, namespace="ml", old=old, context=context)
    assert validate(mutation.object, TWO, namespace="ml", old=old, context=context).allowed
    stored: dict[str, Any] = mutation.object
    return stored


def nuclio_function() -> dict[str, Any]:
    """A Nuclio function's Pod in ml (the user's serving code), created by Nuclio's
    controller: Nuclio's."""
    function = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "fn", "namespace": "ml",
                             "labels": {"mlrun/class": "serving",
                                        "nuclio.io/project-name": "p1"}},
                "spec": {"serviceAccountName": "launcher",
                         "containers": [{"name": "main", "image": "python:3.11"}]}}  # fmt: skip
    return admitted(function, TWO, NUCLIO)


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


@pytest.mark.parametrize("labels", [HER_RUN, {"app": "x"}], ids=["her-run", "not-a-run"])
def test_a_csi_driver_given_the_platforms_secret_by_its_volume_attributes(
    labels: dict[str, str],
) -> None:
    """Chain (a cluster with the Azure File CSI driver, whose inline volumes take the
    storage account's Secret as ``volumeAttributes.secretName``; blob and SMB drivers
    read the same keys): Alice's Pod mounts ``csi: {driver: file.csi.azure.com,
    volumeAttributes: {secretName: digitalhub-common-creds, shareName: ...}}``. The
    driver's node plugin reads the platform's Secret with its own rights and mounts
    the share it opens: the platform's credentials used for her, as through
    ``nodePublishSecretRef``, which is a door. ``volumeAttributes`` is a free map the
    schema walk cannot see; a run of hers keeps it where the policy allows ``csi``
    (``test_doors.STRIP``), a Pod outside every selector keeps it always (not routed:
    no platform name in a door). Gap: ``webhook/engine/doors.py`` ``DOORS`` (and the
    CEL references condition rendered from it). Fix: a door for every string value of
    an inline ``csi.volumeAttributes`` that names a Secret of the platform (by its
    patterns), or a policy key listing the drivers' secret attributes."""
    volume = {"name": "share", "csi": {"driver": "file.csi.azure.com", "volumeAttributes": {
        "secretName": SECRET, "shareName": "platform-data"}}}  # fmt: skip
    mine = plain("mine", labels, volumes=[volume])
    mine["metadata"]["namespace"] = NAMESPACE
    mine["spec"]["containers"][0]["volumeMounts"] = [{"name": "share", "mountPath": "/s"}]
    decision = evaluate(mine, STRIP, namespace=NAMESPACE, context=Context(ALICE, State([])))
    assert decision.error is None
    assert not decision.allowed or "volumes" not in decision.object["spec"]


@pytest.mark.parametrize(
    "grant",
    [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "verbs": ["bind"], "resourceNames": ["admin"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
         "verbs": ["escalate", "create", "update"]},
    ],
    ids=["bind", "escalate"],
)  # fmt: skip
def test_a_subject_that_may_grant_itself_a_door_is_reported(grant: dict[str, Any]) -> None:
    """Chain: a role in the run namespace with ``create rolebindings`` and ``bind`` on the
    ClusterRole ``admin`` (or ``escalate`` on Roles): she binds herself ``admin`` (or
    writes a Role with ``get secrets``) and reads the platform's Secrets. Today's report
    shows nothing until she has done it: it reads the rules a subject holds, not the
    ones it may grant itself (``docs/threat-model.md`` assumes no such role, "the report
    shows the result": after the fact). Gap: ``webhook/audit/rbacreport.py`` ``DOORS``.
    Fix: a door ``rbac.grant`` (``bind`` on a role that holds a door, or ``escalate`` on
    roles, with ``create``/``update`` of the bindings or roles), or resolve what a
    ``bind`` names into the subject's rules (resourceNames: those roles only)."""
    create = {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"],
              "verbs": ["create"]}  # fmt: skip
    report = rbac_report(_role_binding("ml", [create, grant]), platform_of(SHIPPED), shells=True)
    assert [str(f.subject) for f in report.unexpected()]


# === chains that are refused ==============================================================


def _with_debug(target: dict[str, Any], **container: Any) -> dict[str, Any]:
    debugged = copy.deepcopy(target)
    debugged["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "busybox", **container}]
    return debugged


ENV = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "t"}}}]}
ENV_FROM = {"envFrom": [{"secretRef": {"name": SECRET}}]}


@pytest.mark.parametrize("source", [ENV, ENV_FROM], ids=["env", "envFrom"])
@pytest.mark.parametrize("labels", [HER_RUN, {"app": "x"}], ids=["her-run", "not-a-run"])
def test_a_debug_container_reading_the_platforms_secret_is_refused(
    source: dict[str, Any], labels: dict[str, str]
) -> None:
    """``kubectl debug`` into her own Pod (a run of hers, or outside every selector) with
    an ephemeral container reading the Core's secret: routed (its doors include the
    ephemeral containers) and refused, whatever the Pod."""
    mine = created(pod(labels=labels) if "dhcore/run" in labels else plain("nr", labels), ALICE)
    debugged = _with_debug(mine, **source)
    assert routed(debugged, mine, "UPDATE", "ephemeralcontainers")
    _, validation = update(debugged, mine, ALICE, subresource="ephemeralcontainers")
    assert not validation.allowed
    assert rules(validation) & {"secrets.forbidden", "ownership.not-a-run"}


@pytest.mark.parametrize("kind", ["ReplicaSet", "StatefulSet", "DaemonSet",
                                  "ReplicationController"])  # fmt: skip
@pytest.mark.parametrize("forged", [{PLATFORM_RECORD: "true"},
                                    {REQUESTED_BY: "system:serviceaccount:digitalhub:core"}],
                         ids=["record", "legacy-stamp"])  # fmt: skip
def test_a_record_forged_on_a_controller_by_update_is_removed(
    kind: str, forged: dict[str, str]
) -> None:
    """Her own controller (outside every selector, no records) updated with the
    platform's record, or only a platform stamp (read as the platform's for an object
    from before records): its controller's Pods would be the platform's. Routed, the
    record removed by ``/mutate``, and refused when ``/mutate`` was skipped."""
    api = "v1" if kind == "ReplicationController" else "apps/v1"
    selector: dict[str, Any] = {"app": "x"}
    spec = {"selector": selector if kind == "ReplicationController" else {"matchLabels": selector},
            "template": {"metadata": {"labels": {"app": "x"}},
                         "spec": {"containers": [{"name": "m", "image": "i"}]}}}  # fmt: skip
    old: dict[str, Any] = {"apiVersion": api, "kind": kind,
                           "metadata": {"name": "r", "namespace": "ml"}, "spec": spec}  # fmt: skip
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = dict(forged)
    group = "" if kind == "ReplicationController" else "apps"
    resources = {**RESOURCES, kind: (group, f"{kind.lower()}s")}
    assert _routed_with(resources, new, old)
    context = Context(ALICE, State([]), "UPDATE")
    mutation = mutate(new, SHIPPED, namespace="ml", old=old, context=context)
    assert not set(forged) & set(mutation.object["metadata"].get("annotations") or {})
    bypassed = validate(new, SHIPPED, namespace="ml", old=old, context=context)
    assert not bypassed.allowed and "ownership.stamp" in rules(bypassed)


def _routed_with(resources: dict[str, tuple[str, str]], new: Any, old: Any) -> bool:
    saved = dict(RESOURCES)
    RESOURCES.update(resources)
    try:
        return len(routed(new, old, "UPDATE")) == 2
    finally:
        RESOURCES.clear()
        RESOURCES.update(saved)


@pytest.mark.parametrize("template", ["Deployment", "CronJob"])
def test_the_platforms_pull_secret_in_a_template_outside_every_selector_is_refused(
    template: str,
) -> None:
    spec = {"containers": [{"name": "m", "image": "i"}],
            "imagePullSecrets": [{"name": "registry-credentials"}]}  # fmt: skip
    if template == "Deployment":
        obj = deployment({"app": "x"}, spec)
    else:
        obj = {"apiVersion": "batch/v1", "kind": "CronJob",
               "metadata": {"name": "c", "namespace": "ml"},
               "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {
                   "metadata": {"labels": {"app": "x"}}, "spec": spec}}}}}  # fmt: skip
    decision = judged_by(obj, ALICE)
    assert not decision.allowed and rules(decision) == {"ownership.not-a-run"}


def test_a_projected_volume_loses_the_platforms_secret_and_keeps_her_token() -> None:
    """A projected volume of her run with several sources: the Core's secret (another
    run's name) and her own account's token. The secret's source goes, the token's
    stays (a projected volume keeps what holds no reference)."""
    sources = [{"secret": {"name": "sec-api-r1"}},
               {"serviceAccountToken": {"path": "token", "audience": "mine"}}]  # fmt: skip
    mine = plain("mine", HER_RUN, volumes=[{"name": "p", "projected": {"sources": sources}}])
    mine["spec"]["containers"][0]["volumeMounts"] = [{"name": "p", "mountPath": "/p"}]
    stored = judged_by(mine, ALICE)
    assert stored.allowed
    assert stored.object["spec"]["volumes"] == [
        {"name": "p", "projected": {"sources": [sources[1]]}}
    ]


def test_an_init_container_reading_the_platforms_secret_outside_every_selector() -> None:
    init = [{"name": "i", "image": "i",
             "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec-api-r1",
                                                                  "key": "k"}}}]}]  # fmt: skip
    mine = plain("mine", initContainers=init)
    assert routed(mine)
    decision = judged_by(mine, ALICE)
    assert not decision.allowed and rules(decision) == {"ownership.not-a-run"}


def test_a_service_proxy_through_a_headless_or_external_name_service_is_refused() -> None:
    """A headless Service (``clusterIP: None``) selecting the platform's Ray head, and an
    ExternalName Service whose Endpoints someone wrote naming the head: the apiserver
    proxies to an endpoint's address whatever the Service's type, and runguard judges
    the Pods either names."""
    headless = service("headless", {"ray.io/node-type": "head", "ray.io/cluster": "core-ray"})
    headless["spec"]["clusterIP"] = "None"
    external = service("external", None)
    external["spec"].update({"type": "ExternalName", "externalName": "example.com"})
    cluster = Namespace([platform_head(), her_pod()], [headless, external],
                        [endpoints("external", ("ml", "core-ray-head"))])  # fmt: skip
    for name in ("headless", "external:8265", "https:headless:8443"):
        answer = judged(service_proxy(ALICE, name), cluster)
        assert answer["allowed"] is False, name
        assert "reaches Pod ml/core-ray-head" in answer["status"]["message"]


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
