"""Attacks through the doors of a pod spec to the platform's Secrets and node directories
(``webhook/engine/doors.py``, ``rules/secrets.py``, ``volumes.allowedHostPaths``): every
volume type that names a Secret, a driver's free map, a debug or init container, a pull
secret, a projected volume, and spellings of an allowed node path.

The attacker is ``alice``, with ``edit`` in the run namespace; the platform is the Core
(``system:serviceaccount:digitalhub:core``). Where a door's own rule is all that stands
between her and the platform's object, the policy is the shipped one with every volume
type allowed at level baseline (``test_doors.STRIP``/``DENY``). Each test keeps the chain
and the fix.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.attack_chains import (
    HER_RUN,
    ML_NS,
    MLRUN,
    MLRUN_API,
    SECRET,
    deployment,
    judged,
    judged_by,
    plain,
    routed,
    run,
)
from harness.cluster_state import State
from harness.references import DENY, NAMESPACE, STRIP
from harness.shipped import ALICE, CORE, RUN, created, pod, rules, update

from webhook.engine import evaluate
from webhook.engine.context import Context


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


# --- node directories -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        f"/var/run/iguazio/dayman/{ML_NS}/..",
        f"/var/run/iguazio/dayman/{ML_NS}/.",
        f"/var/run/iguazio/dayman/{ML_NS}/../other-tenant",
        f"/var/run/iguazio/dayman//{ML_NS}/..",
        f"/var/run/iguazio/dayman/{ML_NS}\n",
        f"/var/run/iguazio/dayman/{ML_NS}\x00/x",
        f"/var/run/iguazio/dayman/{ML_NS.upper()}",
        f"//var/run/iguazio/dayman/{ML_NS}/../../../..",
        "/var/run/iguazio/dayman/{namespace}",
        "/var/run/iguazio/dayman/*",
    ],
)
def test_no_spelling_of_an_allowed_node_path_reaches_another_directory(path: str) -> None:
    """Stopped: ``allowedHostPaths`` compare the path exactly (trailing "/" aside), so no
    step, NUL, newline, case or literal placeholder reaches another node directory, even
    for a platform run."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "etl", "namespace": ML_NS,
                        "labels": {"mlrun/class": "remote-spark", "mlrun/project": "fraud"}},
           "spec": {"containers": [{"name": "base", "image": "iguazio/shell:3.6.2"}],
                    "volumes": [{"name": "d", "hostPath": {"path": path}}]}}  # fmt: skip
    decision = evaluate(pod, MLRUN, namespace=ML_NS, context=Context(MLRUN_API))
    assert "volumes.forbidden-type" in rules(decision), decision.message()


def test_the_run_namespace_placeholder_is_the_requests_namespace_not_the_objects() -> None:
    """Stopped: a Pod sent to namespace A whose metadata says B is judged with A's path."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "etl", "namespace": "other-tenant",
                        "labels": {"mlrun/class": "remote-spark", "mlrun/project": "fraud"}},
           "spec": {"containers": [{"name": "base", "image": "iguazio/shell:3.6.2"}],
                    "volumes": [{"name": "d", "hostPath": {
                        "path": "/var/run/iguazio/dayman/other-tenant"}}]}}  # fmt: skip
    decision = evaluate(pod, MLRUN, namespace=ML_NS, context=Context(MLRUN_API))
    assert "volumes.forbidden-type" in rules(decision), decision.message()
