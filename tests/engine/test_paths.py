"""The path each webhook chooses for a kind of request (``webhook.engine.paths``), and
that every path of each table has its steps or checks."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness import REPO
from harness.workloads import gpu_pod

from webhook.engine import mutation, paths, validation
from webhook.engine.context import NO_CONTEXT
from webhook.engine.paths import MUTATION_PATHS, VALIDATION_PATHS, Path, Request, choose
from webhook.engine.subject import review
from webhook.policy.loader import load_policy

PLATFORM = load_policy(REPO / "tests/cases/_policies/platform")


def job(kind: str = "Job") -> dict[str, Any]:
    pod = gpu_pod(1)
    template = {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}
    return {"apiVersion": "apps/v1" if kind == "Deployment" else "batch/v1", "kind": kind,
            "metadata": {"name": "r1", "namespace": "ml", "labels": pod["metadata"]["labels"]},
            "spec": {"template": template}}  # fmt: skip


def debugged(pod: dict[str, Any]) -> dict[str, Any]:
    """``kubectl debug``: an ephemeral container added, which runguard hardens."""
    out = copy.deepcopy(pod)
    out["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    return out


def not_understood() -> dict[str, Any]:
    pod = gpu_pod(1)
    pod["spec"]["containers"] = "main"
    return pod


def config_map() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "ml"}, "data": {}}  # fmt: skip


def outside() -> dict[str, Any]:
    pod = gpu_pod(1)
    pod["metadata"]["namespace"] = "kube-system"
    return pod


# (object, old object, /mutate's path, /validate's path)
REQUESTS: dict[str, tuple[Any, Any, Path, Path]] = {
    "outside": (outside(), None, Path.OUTSIDE, Path.OUTSIDE),
    "not understood": (not_understood(), None, Path.NOT_UNDERSTOOD, Path.NOT_UNDERSTOOD),
    "a Pod created": (gpu_pod(1), None, Path.POD_CREATED, Path.POD_CREATED),
    "a Pod updated": (gpu_pod(1), gpu_pod(1), Path.POD_UPDATED, Path.POD_UPDATED),
    "kubectl debug": (debugged(gpu_pod(1)), gpu_pod(1), Path.DEBUG_CONTAINERS, Path.POD_UPDATED),
    "a Job created": (job(), None, Path.TEMPLATE_CREATED, Path.TEMPLATE_CREATED),
    "a Job updated": (job(), job(), Path.TEMPLATE_REAPPLIED, Path.TEMPLATE_UPDATED),
    "a Deployment created": (job("Deployment"), None, Path.TEMPLATE_KEPT, Path.TEMPLATE_CREATED),
    "a Deployment updated": (
        job("Deployment"),
        job("Deployment"),
        Path.TEMPLATE_KEPT,
        Path.TEMPLATE_UPDATED,
    ),
    "an object created": (config_map(), None, Path.OPERATOR_OBJECT, Path.NOT_A_RUN),
    "an object updated": (config_map(), config_map(), Path.NOT_A_RUN, Path.NOT_A_RUN),
}


def request(obj: Any, old: Any) -> Request:
    return paths.request(review(obj, PLATFORM, None, old, NO_CONTEXT))


@pytest.mark.parametrize("name", REQUESTS)
def test_each_kind_of_request_takes_its_path(name: str) -> None:
    obj, old, mutating, validating = REQUESTS[name]
    assert choose(MUTATION_PATHS, request(obj, old)) == mutating
    assert choose(VALIDATION_PATHS, request(obj, old)) == validating


def test_every_path_of_a_table_has_its_steps_or_checks() -> None:
    assert {path for path, _ in MUTATION_PATHS} == set(mutation.STEPS)
    assert {path for path, _ in VALIDATION_PATHS} == set(validation.CHECKS)
    assert set(mutation.STEPS) | set(validation.CHECKS) == set(Path)


def test_the_last_row_of_each_table_takes_what_no_other_did() -> None:
    for table in (MUTATION_PATHS, VALIDATION_PATHS):
        assert table[-1][0] == Path.NOT_A_RUN
        assert table[-1][1](request(config_map(), None))


def test_a_debug_container_that_needs_nothing_is_an_update_of_the_pod() -> None:
    """An ephemeral container added hardened already: nothing for /mutate to do but the
    Pod's update (whose spec is immutable)."""
    pod = debugged(gpu_pod(1))
    pod["spec"]["ephemeralContainers"][0]["securityContext"] = {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }
    assert choose(MUTATION_PATHS, request(pod, gpu_pod(1))) == Path.POD_UPDATED
