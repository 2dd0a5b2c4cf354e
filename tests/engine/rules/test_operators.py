"""``webhook/engine/rules/operators.py`` on its own: which platform operator created a run
(``creating_operator``) and what that grants it (``operator_config_map``,
``operator_capabilities``), and how an operator's object names others (``plural``,
``reference_values``, ``selects``, ``named_objects``), on a ``Pod`` built directly and a
fixed cluster state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness.pods import NOT_PLATFORM, pod_of, policy_of

from webhook.clusterstate.static import StaticClusterState
from webhook.engine.context import Context, Ownership, Requester
from webhook.engine.rules.operators import (
    creating_operator,
    named_objects,
    operator_capabilities,
    operator_config_map,
    plural,
    reference_values,
    selects,
)
from webhook.keys import REQUESTED_BY
from webhook.policy.model import OperatorReference, Policy

MPI = "system:serviceaccount:mpi:mpi-operator"
JOBS = "system:serviceaccount:kube-system:job-controller"
JOB = {"mlrun/job": "j1"}


def policy(tmp_path: Path) -> Policy:
    return policy_of(
        tmp_path,
        {
            "platform": {
                "identities": ["system:serviceaccount:digitalhub:core"],
                "controllers": [JOBS],
                "operators": [
                    {
                        "identity": MPI,
                        "kinds": ["kubeflow.org/MPIJob"],
                        "configMaps": ["{labels[mlrun/job]}-config"],
                        "allowedCapabilities": ["IPC_LOCK"],
                    }
                ],
            }
        },
    )


def created_by(user: str, **context: Any) -> Context:
    return Context(Requester(user), **context)


def test_a_run_the_operator_creates_gets_its_config_map_and_capabilities(
    tmp_path: Path,
) -> None:
    run = pod_of(policy(tmp_path), labels=JOB, context=created_by(MPI))
    operator = creating_operator(run)
    assert operator is not None and operator.identity == MPI
    assert operator_config_map(run, "j1-config")
    assert not operator_config_map(run, "j2-config")
    assert operator_capabilities(run) == frozenset({"IPC_LOCK"})


def test_a_users_run_gets_nothing_of_the_operator(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), labels=JOB, context=created_by("alice"))
    assert creating_operator(run) is None
    assert not operator_config_map(run, "j1-config")
    assert operator_capabilities(run) == frozenset()


def test_a_run_not_the_platforms_gets_nothing_even_from_the_operator(tmp_path: Path) -> None:
    run = pod_of(policy(tmp_path), labels=JOB, context=created_by(MPI), ownership=NOT_PLATFORM)
    assert creating_operator(run) is None
    undecided = Ownership(False, unknown="the owner is not synced")
    waiting = pod_of(policy(tmp_path), labels=JOB, context=created_by(MPI), ownership=undecided)
    assert creating_operator(waiting) is None
    assert creating_operator(waiting, undecided=True) is not None  # mutation keeps it


def test_on_update_the_creator_is_the_stamp_written_at_creation(tmp_path: Path) -> None:
    update = created_by("alice", operation="UPDATE")
    stamped = pod_of(policy(tmp_path), context=update, annotations={REQUESTED_BY: MPI})
    assert creating_operator(stamped) is not None
    assert creating_operator(pod_of(policy(tmp_path), context=update)) is None


def launcher(stamp: str) -> StaticClusterState:
    job = {
        "kind": "Job",
        "metadata": {
            "name": "launcher",
            "namespace": "ml",
            "uid": "job-1",
            "annotations": {REQUESTED_BY: stamp},
        },
    }
    return StaticClusterState.from_documents([job])


OWNED = ({"kind": "Job", "name": "launcher", "uid": "job-1", "controller": True},)


def test_through_a_controller_the_creator_is_its_owners(tmp_path: Path) -> None:
    by_jobs = created_by(JOBS, state=launcher(MPI))
    run = pod_of(policy(tmp_path), context=by_jobs, owner_references=OWNED)
    assert creating_operator(run) is not None
    users = created_by(JOBS, state=launcher("alice"))
    assert (
        creating_operator(pod_of(policy(tmp_path), context=users, owner_references=OWNED)) is None
    )


@pytest.mark.parametrize(
    ("kind", "resource"),
    [("RayJob", "rayjobs"), ("Policy", "policies"), ("Gateway", "gateways"), ("Mesh", "meshes")],
)
def test_plural_is_kubernetes_default_resource_name(kind: str, resource: str) -> None:
    assert plural(kind) == resource


def test_reference_values_walks_keys_lists_and_bracketed_keys() -> None:
    obj = {
        "spec": {
            "clusterSelector": {"ray.io/cluster": "c1"},
            "workers": [{"cluster": "a"}, {"other": 1}, {"cluster": "b"}],
        }
    }
    assert list(reference_values(obj, ("spec", "clusterSelector", "ray.io/cluster"))) == [
        ("spec.clusterSelector[ray.io/cluster]", "c1")
    ]
    assert list(reference_values(obj, ("spec", "workers", "*", "cluster"))) == [
        ("spec.workers[0].cluster", "a"),
        ("spec.workers[2].cluster", "b"),
    ]
    assert list(reference_values(obj, ("spec", "missing"))) == []


def test_selects_reads_a_label_selector_or_a_plain_map() -> None:
    labels = {"ray.io/cluster": "c1", "tier": "gpu"}
    assert selects({"ray.io/cluster": "c1"}, labels)
    assert not selects({"ray.io/cluster": "c2"}, labels)
    assert selects(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, labels
    )
    assert not selects({"matchLabels": {"tier": "cpu"}}, labels)
    assert not selects({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, labels)


def test_what_cannot_be_read_selects_everything() -> None:
    assert selects("c1", {})
    assert selects({"matchExpressions": [{"key": "tier", "operator": "Near"}]}, {})


def test_named_objects_by_name_and_by_selector() -> None:
    clusters = StaticClusterState.from_documents(
        [
            {
                "kind": "RayCluster",
                "metadata": {"name": n, "namespace": "ml", "uid": n, "labels": {"team": t}},
            }
            for n, t in (("c1", "a"), ("c2", "b"))
        ]
    )
    by_name = OperatorReference(
        kind="ray.io/RayJob", path="spec.clusterName", names="ray.io/RayCluster", by="name"
    )
    assert [m.name for m in named_objects(by_name, "c2", "ml", clusters)] == ["c2"]
    assert named_objects(by_name, "c3", "ml", clusters) == []
    assert named_objects(by_name, "c2", "other", clusters) == []
    by_selector = OperatorReference(
        kind="ray.io/RayJob", path="spec.clusterSelector", names="ray.io/RayCluster", by="selector"
    )
    assert [m.name for m in named_objects(by_selector, {"team": "a"}, "ml", clusters)] == ["c1"]
