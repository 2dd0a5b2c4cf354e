"""``webhook/engine/rules/trust.py`` on its own: each check of ``TRUST_CHECKS`` (the
queue's two are ``tests/engine/rules/test_queue.py``'s) called directly on a ``Review``
(``webhook.engine.subject.review``) of an object, its old version on UPDATE, who asks
and a fixed cluster state: what it flags, and what it leaves alone."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from harness.pods import container, policy_of

from webhook.clusterstate.static import StaticClusterState
from webhook.engine.context import Context, Requester
from webhook.engine.rules.debug import OWNERSHIP_DEBUG
from webhook.engine.rules.not_a_run import OWNERSHIP_UNKNOWN
from webhook.engine.rules.operator_objects import OWNERSHIP_REFERENCE, OWNERSHIP_RESERVED_LABEL
from webhook.engine.rules.reserved import OWNERSHIP_SERVICE_ACCOUNT
from webhook.engine.rules.scope import SCOPE_LABELS
from webhook.engine.rules.stamp import OWNERSHIP_OWNER_CHANGED, OWNERSHIP_STAMP
from webhook.engine.rules.trust import (
    OWNERSHIP_CHANGED,
    TRUST_CHECKS,
    check_debug_container,
    check_operator_references,
    check_operator_scale,
    check_owners,
    check_platform_change,
    check_policy_label_in_template,
    check_profile_annotation,
    check_records,
    check_reserved_labels,
    check_scope,
    check_service_account,
)
from webhook.engine.subject import Review, review
from webhook.keys import PLATFORM_POLICY, PLATFORM_RECORD, POLICY_LABEL, REQUESTED_BY
from webhook.policy.model import Policy

CORE = Requester("system:serviceaccount:digitalhub:core")
SPARK = Requester("system:serviceaccount:spark:spark-operator")
KUBERAY = Requester("system:serviceaccount:ray:kuberay-operator")
ALICE = Requester("alice", ("developers",))
APP_NAME = "sparkoperator.k8s.io/app-name"
PROFILE = "dhcore/template"
RECORDS = {REQUESTED_BY: CORE.username, PLATFORM_RECORD: "true", PLATFORM_POLICY: "test"}


@pytest.fixture
def root(tmp_path: Path) -> Policy:
    return policy_of(
        tmp_path,
        {
            "profiles": {"label": PROFILE},
            "platform": {
                "identities": [CORE.username],
                "operators": [
                    {
                        "identity": SPARK.username,
                        "kinds": ["sparkoperator.k8s.io/SparkApplication"],
                        "reservedLabels": [APP_NAME],
                    },
                    {
                        "identity": KUBERAY.username,
                        "kinds": ["ray.io/RayJob", "ray.io/RayCluster"],
                        "references": [
                            {
                                "kind": "ray.io/RayJob",
                                "path": "spec.clusterSelector",
                                "names": "ray.io/RayCluster",
                                "by": "selector",
                            }
                        ],
                    },
                ],
            },
        },
    )


def platform_pod(**spec: Any) -> dict[str, Any]:
    """A run Pod the platform created, with the records runguard wrote at its CREATE."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "labels": {"app": "run", POLICY_LABEL: "test"},
            "annotations": dict(RECORDS),
        },
        "spec": {"containers": [container()], **spec},
    }


def users_pod(**spec: Any) -> dict[str, Any]:
    """A Pod no RunPolicy governs, of nobody's platform."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine", "namespace": "ml", "labels": {"app": "mine"}},
        "spec": {"containers": [container()], **spec},
    }


def update(root: Policy, old: Any, new: Any, who: Requester, **context: Any) -> Review:
    return review(new, root, "ml", old, Context(who, operation="UPDATE", **context))


def create(root: Policy, obj: Any, who: Requester, namespace: str = "ml", **context: Any) -> Review:
    return review(obj, root, namespace, None, Context(who, **context))


def rules(found: list[Any]) -> list[tuple[str, str]]:
    return [(v.rule, v.path) for v in found]


def edited(obj: dict[str, Any], *keys: str | int, value: Any) -> dict[str, Any]:
    """A copy of ``obj`` with the value at ``keys`` replaced (None: removed)."""
    out = copy.deepcopy(obj)
    node: Any = out
    for key in keys[:-1]:
        node = node[key]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return out


def test_every_check_is_registered() -> None:
    assert {
        check_records,
        check_policy_label_in_template,
        check_platform_change,
        check_scope,
        check_owners,
        check_debug_container,
        check_service_account,
        check_reserved_labels,
        check_profile_annotation,
        check_operator_references,
        check_operator_scale,
    } <= set(TRUST_CHECKS)


# --- check_records ------------------------------------------------------------------------


def test_a_users_pod_claiming_the_platforms_stamp_at_creation_is_denied(root: Policy) -> None:
    found = rules(check_records(create(root, platform_pod(), ALICE)))
    assert (OWNERSHIP_STAMP, f"metadata.annotations[{REQUESTED_BY}]") in found
    assert (OWNERSHIP_STAMP, f"metadata.annotations[{PLATFORM_RECORD}]") in found


def test_an_update_changing_a_record_is_denied(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "metadata", "annotations", REQUESTED_BY, value="alice")
    assert rules(check_records(update(root, old, new, ALICE))) == [
        (OWNERSHIP_STAMP, f"metadata.annotations[{REQUESTED_BY}]")
    ]
    relabelled = edited(old, "metadata", "labels", POLICY_LABEL, value=None)
    assert rules(check_records(update(root, old, relabelled, ALICE))) == [
        (SCOPE_LABELS, f"metadata.labels[{POLICY_LABEL}]")
    ]


def test_an_update_keeping_the_records_passes(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "metadata", "annotations", "note", value="hello")
    assert check_records(update(root, old, new, ALICE)) == []


def test_without_a_known_requester_creation_is_not_compared(root: Policy) -> None:
    r = review(platform_pod(), root, "ml", None, Context())
    assert check_records(r) == []


# --- check_policy_label_in_template -------------------------------------------------------


def deployment(selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(selector)},
                "spec": {"containers": [container()]},
            },
        },
    }


def test_a_controller_selecting_by_runguards_label_is_denied(root: Policy) -> None:
    r = create(root, deployment({"app": "run", POLICY_LABEL: "test"}), CORE)
    assert rules(check_policy_label_in_template(r)) == [(SCOPE_LABELS, "spec.selector")]


def test_a_controller_selecting_by_its_own_labels_passes(root: Policy) -> None:
    assert check_policy_label_in_template(create(root, deployment({"app": "run"}), CORE)) == []
    assert check_policy_label_in_template(create(root, platform_pod(), CORE)) == []  # a Pod


# --- check_platform_change ----------------------------------------------------------------


def test_a_user_changing_the_image_of_the_platforms_pod_is_denied(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "spec", "containers", 0, "image", value="evil:1")
    assert rules(check_platform_change(update(root, old, new, ALICE))) == [
        (OWNERSHIP_CHANGED, "spec.containers")
    ]


def test_the_platform_may_change_its_pod_and_a_user_her_own(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "spec", "containers", 0, "image", value="python:3.13")
    assert check_platform_change(update(root, old, new, CORE)) == []
    mine = users_pod()
    other = edited(mine, "spec", "containers", 0, "image", value="python:3.13")
    assert check_platform_change(update(root, mine, other, ALICE)) == []


def test_a_user_changing_something_else_than_images_passes(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "spec", "activeDeadlineSeconds", value=60)
    assert check_platform_change(update(root, old, new, ALICE)) == []


# --- check_scope and check_profile_annotation ---------------------------------------------


def test_an_update_removing_a_selector_label_is_denied(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "metadata", "labels", "app", value=None)
    assert rules(check_scope(update(root, old, new, ALICE))) == [
        (SCOPE_LABELS, "metadata.labels[app]")
    ]


def test_an_object_entering_a_runpolicy_by_an_update_is_denied(root: Policy) -> None:
    old = users_pod()
    new = edited(old, "metadata", "labels", "app", value="run")
    assert rules(check_scope(update(root, old, new, ALICE))) == [(SCOPE_LABELS, "metadata.labels")]


def test_an_update_of_other_labels_passes(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "metadata", "labels", "note", value="x")
    assert check_scope(update(root, old, new, ALICE)) == []
    mine = users_pod()
    assert (
        check_scope(update(root, mine, edited(mine, "metadata", "labels", "b", value="c"), ALICE))
        == []
    )


def test_an_update_changing_the_profile_annotation_is_denied(root: Policy) -> None:
    old = edited(platform_pod(), "metadata", "annotations", PROFILE, value="small")
    new = edited(old, "metadata", "annotations", PROFILE, value="large")
    assert rules(check_profile_annotation(update(root, old, new, ALICE))) == [
        (SCOPE_LABELS, f"metadata.annotations[{PROFILE}]")
    ]
    kept = edited(old, "metadata", "annotations", "note", value="x")
    assert check_profile_annotation(update(root, old, kept, ALICE)) == []


# --- check_owners -------------------------------------------------------------------------

OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u1", "controller": True}


def test_a_user_adding_an_owner_to_a_stamped_object_is_denied(root: Policy) -> None:
    old = platform_pod()
    new = edited(old, "metadata", "ownerReferences", value=[OWNER])
    assert rules(check_owners(update(root, old, new, ALICE))) == [
        (OWNERSHIP_OWNER_CHANGED, "metadata.ownerReferences")
    ]


def test_removing_an_owner_or_the_platform_writing_one_passes(root: Policy) -> None:
    owned = edited(platform_pod(), "metadata", "ownerReferences", value=[OWNER])
    orphaned = edited(owned, "metadata", "ownerReferences", value=None)
    assert check_owners(update(root, owned, orphaned, ALICE)) == []
    assert check_owners(update(root, platform_pod(), owned, CORE)) == []


# --- check_debug_container ----------------------------------------------------------------

DEBUG = [{"name": "debugger", "image": "busybox", "targetContainerName": "main"}]


def debugged(root: Policy, old: dict[str, Any], who: Requester) -> Review:
    new = edited(old, "spec", "ephemeralContainers", value=DEBUG)
    return update(root, old, new, who, subresource="ephemeralcontainers")


def test_a_user_debugging_the_platforms_pod_is_denied(root: Policy) -> None:
    assert rules(check_debug_container(debugged(root, platform_pod(), ALICE))) == [
        (OWNERSHIP_DEBUG, "spec.ephemeralContainers")
    ]


def test_the_platform_or_a_user_on_her_own_pod_may_debug(root: Policy) -> None:
    assert check_debug_container(debugged(root, platform_pod(), CORE)) == []
    assert check_debug_container(debugged(root, users_pod(), ALICE)) == []


# --- check_service_account ----------------------------------------------------------------


def test_a_users_pod_running_as_the_platforms_account_is_denied(root: Policy) -> None:
    r = create(root, users_pod(serviceAccountName="core"), ALICE, namespace="digitalhub")
    assert rules(check_service_account(r)) == [
        (OWNERSHIP_SERVICE_ACCOUNT, "spec.serviceAccountName")
    ]


def test_the_platform_may_run_as_its_account_and_a_user_as_her_own(root: Policy) -> None:
    pod = users_pod(serviceAccountName="core")
    assert check_service_account(create(root, pod, CORE, namespace="digitalhub")) == []
    assert check_service_account(create(root, pod, ALICE, namespace="ml")) == []  # not its ns
    mine = users_pod(serviceAccountName="builder")
    assert check_service_account(create(root, mine, ALICE, namespace="digitalhub")) == []


# --- check_reserved_labels ----------------------------------------------------------------


def spark_app(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": "etl", "namespace": "ml"},
        "spec": {
            "driver": {"labels": labels},
            "sparkConf": {"spark.kubernetes.driver.label.team": "a"},
        },
    }


def test_a_user_writing_the_operators_owner_label_is_denied(root: Policy) -> None:
    r = create(root, spark_app({APP_NAME: "platform-job"}), ALICE)
    assert rules(check_reserved_labels(r)) == [
        (OWNERSHIP_RESERVED_LABEL, f"spec.driver.labels[{APP_NAME}]")
    ]


def test_other_labels_or_the_operator_itself_pass(root: Policy) -> None:
    assert check_reserved_labels(create(root, spark_app({"team": "a"}), ALICE)) == []
    assert check_reserved_labels(create(root, spark_app({APP_NAME: "x"}), SPARK)) == []


# --- check_operator_references and check_operator_scale -----------------------------------


def ray_clusters() -> StaticClusterState:
    def cluster(name: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": name,
                "labels": {"ray.io/cluster": name},
                "annotations": annotations,
            },
        }

    return StaticClusterState.from_documents(
        [cluster("platforms", RECORDS), cluster("alices", {REQUESTED_BY: "alice"})]
    )


def ray_job(cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "job", "namespace": "ml"},
        "spec": {"entrypoint": "python x.py", "clusterSelector": {"ray.io/cluster": cluster}},
    }


def test_a_users_object_naming_the_platforms_object_is_denied(root: Policy) -> None:
    r = create(root, ray_job("platforms"), ALICE, state=ray_clusters())
    assert rules(check_operator_references(r)) == [(OWNERSHIP_REFERENCE, "spec.clusterSelector")]


def test_naming_her_own_object_or_being_the_operator_passes(root: Policy) -> None:
    assert (
        check_operator_references(create(root, ray_job("alices"), ALICE, state=ray_clusters()))
        == []
    )
    assert (
        check_operator_references(create(root, ray_job("platforms"), KUBERAY, state=ray_clusters()))
        == []
    )


def test_without_a_cluster_state_a_reference_is_unknown(root: Policy) -> None:
    assert rules(check_operator_references(create(root, ray_job("x"), ALICE))) == [
        (OWNERSHIP_UNKNOWN, "spec.clusterSelector")
    ]


def scale(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"replicas": replicas},
    }


def scaled(root: Policy, name: str, who: Requester) -> Review:
    return update(
        root,
        scale(name, 1),
        scale(name, 5),
        who,
        state=ray_clusters(),
        subresource="scale",
        resource="ray.io/rayclusters",
    )


def test_a_user_scaling_the_platforms_object_is_denied(root: Policy) -> None:
    assert rules(check_operator_scale(scaled(root, "platforms", ALICE))) == [
        (OWNERSHIP_CHANGED, "spec.replicas")
    ]


def test_scaling_her_own_object_or_by_the_platform_passes(root: Policy) -> None:
    assert check_operator_scale(scaled(root, "alices", ALICE)) == []
    assert check_operator_scale(scaled(root, "platforms", CORE)) == []
