"""``runguard apply --cluster-state FILE --as OPERATOR``: an operator's Pod judged offline
with the shipped policies exactly as online, its owner read from ``kubectl get -o yaml``
output (a List, the custom resource with its status and managed fields, its Namespace).

The Pod is the Argo step of tests/platforms/digitalhub/argo-step.yaml; the Workflow in
the state carries the records runguard wrote when it was created (by the Core, or by a
user)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO

STEP = REPO / "tests" / "platforms" / "digitalhub" / "argo-step.yaml"
ARGO = "system:serviceaccount:digitalhub:argo-workflow-controller"
CORE = "system:serviceaccount:digitalhub:core"
CORES = {"runguard.io/requested-by": CORE, "runguard.io/platform": "true"}  # its records
RUN = "5e1d7a2c9b0f4c3e8a6d1b2c3d4e5f60"


def workflow(records: dict[str, str]) -> dict[str, Any]:
    """The Workflow as ``kubectl get workflow -o yaml`` prints it."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": RUN,
            "namespace": "digitalhub",
            "uid": "0d9c7b4e-5a1f-4c2e-9b8d-7e6f5a4b3c2d",
            "resourceVersion": "48213",
            "creationTimestamp": "2026-11-27T09:00:00Z",
            "labels": {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": RUN,
                       "workflows.argoproj.io/phase": "Running"},
            "annotations": records,
            "managedFields": [{"manager": "kubectl-create", "operation": "Update",
                               "apiVersion": "argoproj.io/v1alpha1",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"entrypoint": "pipeline", "templates": [{"name": "pipeline"}]},
        "status": {"phase": "Running", "startedAt": "2026-11-27T09:00:01Z"},
    }  # fmt: skip


def step_pod() -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load(STEP.read_text())
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": RUN,
         "uid": "0d9c7b4e-5a1f-4c2e-9b8d-7e6f5a4b3c2d", "controller": True,
         "blockOwnerDeletion": True}
    ]  # fmt: skip
    return pod


def apply(tmp_path: Path, state: list[dict[str, Any]], obj: dict[str, Any], *args: str) -> Any:
    listed = {"apiVersion": "v1", "kind": "List", "items": state, "metadata": {}}
    (tmp_path / "state.yaml").write_text(yaml.safe_dump(listed))
    (tmp_path / "in.json").write_text(json.dumps(obj))
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", str(REPO / "policies"), "-o", "json",
         "--cluster-state", str(tmp_path / "state.yaml"), *args, str(tmp_path / "in.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "digitalhub", "uid": "ns-1",
                          "labels": {"kubernetes.io/metadata.name": "digitalhub"}},
             "status": {"phase": "Active"}}  # fmt: skip


def test_argos_step_of_the_cores_workflow_keeps_the_run_secret_offline(tmp_path: Path) -> None:
    code, [entry] = apply(tmp_path, [NAMESPACE, workflow(CORES)], step_pod(), "--as", ARGO)
    assert code == 0 and entry["allowed"], entry
    (main,) = [c for c in entry["object"]["spec"]["containers"] if c["name"] == "main"]
    assert main["envFrom"] == [{"secretRef": {"name": f"sec-herapipeline-{RUN}"}}]
    assert entry["object"]["metadata"]["annotations"]["runguard.io/platform"] == "true"


@pytest.mark.parametrize(
    ("records", "requester"),
    [
        pytest.param({"runguard.io/requested-by": "alice"}, ARGO, id="users-workflow"),
        pytest.param(CORES, "alice", id="user-claims-the-cores-workflow"),
    ],
)  # fmt: skip
def test_the_same_step_is_refused_offline_when_the_chain_is_not_the_platforms(
    tmp_path: Path, records: dict[str, str], requester: str
) -> None:
    code, [entry] = apply(tmp_path, [NAMESPACE, workflow(records)], step_pod(), "--as", requester)
    assert code != 0 and not entry["allowed"], entry
    assert {v["rule"] for v in entry["violations"]} == {"ownership.not-a-run"}


def test_a_workflow_absent_from_the_state_proves_nothing(tmp_path: Path) -> None:
    code, [entry] = apply(tmp_path, [copy.deepcopy(NAMESPACE)], step_pod(), "--as", ARGO)
    assert code != 0 and not entry["allowed"]
    assert {v["rule"] for v in entry["violations"]} == {"ownership.not-a-run"}
