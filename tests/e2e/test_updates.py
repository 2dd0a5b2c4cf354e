"""Scenario 9: updating a running run Pod (labels, annotations) through kubectl and the
Python client is not broken by the webhook, which sees every UPDATE of a run Pod."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from .cluster import Cluster
from .runs import (
    EXCLUDED_NAMESPACE,
    Webhook,
    apply,
    get,
    kubectl_warnings,
    messy_run_pod,
    pod,
    rule_ids,
)

pytestmark = pytest.mark.e2e


def updates_seen_by_runguard(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        event
        for event in cluster.audit_events(resource="pods", namespace=namespace, name=name)
        if event["verb"] in ("update", "patch")
        and "validate.runguard.io/profile" in event.get("annotations", {})
    ]


def test_labels_and_annotations_on_a_run_pod_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    assert apply(cluster, namespace, messy_run_pod("train")).returncode == 0
    before = get(cluster, namespace, "pod", "train")

    for args in (
        ("label", "pod", "train", "team=vision"),
        ("annotate", "pod", "train", "note=retrained on v2 data"),
        ("label", "pod", "train", "team=nlp", "--overwrite"),
        ("annotate", "pod", "train", "note-"),
    ):
        done = cluster.kubectl(*args, "-n", namespace)
        assert done.returncode == 0, done.stderr
        assert kubectl_warnings(done.stderr) == []  # compliant: nothing to say

    after = get(cluster, namespace, "pod", "train")
    assert after["metadata"]["labels"] == {**before["metadata"]["labels"], "team": "nlp"}
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["spec"] == before["spec"]
    events = cluster.wait_for_audit_event(
        lambda e: len(updates_seen_by_runguard(cluster, namespace, "train")) == 4,
        verb="create", resource="pods", namespace=namespace, name="train",
    )  # fmt: skip
    assert events["responseStatus"]["code"] == 201
    for event in updates_seen_by_runguard(cluster, namespace, "train"):
        assert event["responseStatus"]["code"] == 200


def test_labels_and_annotations_on_a_run_pod_python_client(
    api_client: Any, runguard: Webhook, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    created = core.create_namespaced_pod(namespace, messy_run_pod("train"))

    patched = core.patch_namespaced_pod(
        "train",
        namespace,
        {"metadata": {"labels": {"team": "vision"}, "annotations": {"note": "first"}}},
    )
    assert patched.metadata.labels["team"] == "vision"
    assert patched.metadata.annotations == {"note": "first"}

    # A full PUT of what was read, as a controller's update would send it.
    current = core.read_namespaced_pod("train", namespace)
    current.metadata.labels["stage"] = "eval"
    current.metadata.annotations["note"] = "second"
    replaced = core.replace_namespaced_pod("train", namespace, current)
    assert replaced.metadata.labels == {
        **created.metadata.labels,
        "team": "vision",
        "stage": "eval",
    }
    assert replaced.metadata.annotations == {"note": "second"}
    sanitize = api_client.sanitize_for_serialization
    assert sanitize(replaced.spec) == sanitize(created.spec)


def test_a_pod_cannot_become_a_run_by_relabelling(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    """Labels added later would make a Pod a run: a RunPolicy governs an object from its
    CREATE (docs/dev/guarantees.md, "Trust over time"), so create-then-label is refused outright
    (and the Pod, were it judged as a run, has what runguard denies anyway)."""
    rootful = pod("tool", {"app": "tool"}, hostNetwork=True)
    assert apply(cluster, namespace, rootful).returncode == 0
    done = cluster.kubectl(
        "label", "pod", "tool", "-n", namespace,
        "app.kubernetes.io/managed-by=dhcore", "dhcore/run=r1",
    )  # fmt: skip
    assert done.returncode != 0
    assert 'admission webhook "validate.runguard.io" denied the request' in done.stderr
    assert "scope.labels" in rule_ids(done.stderr)
    assert "cannot become a run by an update" in done.stderr
    assert get(cluster, namespace, "pod", "tool")["metadata"]["labels"] == {"app": "tool"}


def test_a_privileged_debug_container_cannot_be_added_to_a_run(
    cluster: Cluster, runguard: Webhook, namespace: str
) -> None:
    """``kubectl debug --profile=sysadmin`` is an UPDATE of the
    ``pods/ephemeralcontainers`` subresource; a privileged debug container would bring
    back into a run what runguard stripped at creation, so it is denied."""
    assert apply(cluster, namespace, messy_run_pod("train")).returncode == 0
    done = cluster.kubectl(
        "debug", "train", "-n", namespace, "--image=busybox:1.36", "--profile=sysadmin",
        "--attach=false", "-c", "debugger",
    )  # fmt: skip
    stored = get(cluster, namespace, "pod", "train")["spec"]
    assert done.returncode != 0, f"added: {stored.get('ephemeralContainers')}"
    assert "security.privileged" in rule_ids(done.stderr)
    assert "ephemeralContainers" not in stored


def reapply_case(case: str) -> dict[str, Any]:
    sent = messy_run_pod("train")
    if case in ("rest", "all-mounts-stripped"):
        del sent["spec"]["priorityClassName"]  # runguard sets one: no class change
    if case in ("rest", "priority-class-changed"):
        del sent["spec"]["containers"][1]["volumeMounts"]  # the sidecar keeps a mount list
    return sent


@pytest.mark.parametrize("case", ["rest", "priority-class-changed", "all-mounts-stripped", "messy"])
def test_reapplying_the_manifest_with_a_new_label_kubectl(
    cluster: Cluster, runguard: Webhook, namespace: str, case: str
) -> None:
    """``kubectl apply`` of the user's own manifest again, with one label more. Its
    three-way patch puts back what runguard changed at CREATE; /mutate on UPDATE must
    turn the spec back into the running one, or the apiserver refuses the update
    (``spec: Forbidden: pod updates may not change fields other than ...``).

    The cases are the two ways this once broke: a changed priority class (the running
    Pod keeps the ``priority`` the apiserver computed at creation) and a container whose
    every volumeMount was stripped (the stored Pod has no ``volumeMounts`` key, not
    ``[]``). Without runguard (an excluded namespace) the same commands succeed."""
    control = reapply_case(case)
    control["metadata"]["name"] = f"control-{case}-{namespace[-6:]}"
    for label in ("a", "b"):
        control["metadata"]["labels"]["team"] = label
        done = apply(cluster, EXCLUDED_NAMESPACE, control)
        assert done.returncode == 0, done.stderr

    sent = reapply_case(case)
    assert apply(cluster, namespace, sent).returncode == 0
    before = get(cluster, namespace, "pod", "train")
    sent["metadata"]["labels"]["team"] = "vision"
    done = apply(cluster, namespace, sent)
    assert done.returncode == 0, done.stderr.splitlines()[0]
    after = get(cluster, namespace, "pod", "train")
    assert after["metadata"]["labels"]["team"] == "vision"
    assert after["spec"] == before["spec"]
