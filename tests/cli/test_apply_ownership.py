"""``runguard apply --cluster-state FILE --as USER [--as-group G]``: ownership decided
offline exactly as online, from the objects and the requester given (docs/dev/guarantees.md,
"Ownership")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from harness import TESTS

POLICY = TESTS / "cases" / "_policies" / "owned"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}

STATE = [
    {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "uid-job",
            "annotations": {"runguard.io/requested-by": "system:serviceaccount:digitalhub:core"},
        },
    },
    {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sec-api-r1", "namespace": "ml", "uid": "uid-s"},
        "data": {"token": "c2VjcmV0LXZhbHVl"},
    },
]


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-x",
            "namespace": "ml",
            "labels": RUN,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": "uid-job",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "volumeMounts": [{"name": "d", "mountPath": "/d"}],
                }
            ],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "v-r1-data"}}],
        },
    }


def apply(tmp_path: Path, obj: dict[str, Any], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all(STATE))
    source = tmp_path / "in.json"
    source.write_text(json.dumps(obj))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "apply",
            "-p",
            str(POLICY),
            "-o",
            "json",
            "--cluster-state",
            str(state),
            *args,
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, json.loads(done.stdout or "[]"), done.stderr


def claims(entry: dict[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in entry["object"]["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    ]


def test_the_job_controller_creating_a_platform_jobs_pod_keeps_its_claim(tmp_path: Path) -> None:
    code, [entry], _ = apply(tmp_path, pod(), "--as", JOB_CONTROLLER)
    assert code == 0 and claims(entry) == ["v-r1-data"]


def test_the_same_pod_from_a_user_loses_it(tmp_path: Path) -> None:
    code, [entry], _ = apply(tmp_path, pod(), "--as", "alice", "--as-group", "developers")
    assert code == 0 and claims(entry) == []
    code, [entry], _ = apply(tmp_path, pod())  # no --as: nobody, never the platform
    assert claims(entry) == []


def test_a_reserved_name_is_refused_offline(tmp_path: Path) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "v-r2-data", "namespace": "ml"},
        "spec": {},
    }
    code, [entry], _ = apply(tmp_path, claim, "--as", "alice")
    assert code == 1
    assert [v["rule"] for v in entry["violations"]] == ["ownership.reserved-name"]
    code, _, _ = apply(tmp_path, claim, "--as-group", "platform-admins", "--as", "bob")
    assert code == 0


def test_secret_data_in_the_state_file_never_reaches_the_output(tmp_path: Path) -> None:
    code, entries, stderr = apply(tmp_path, pod(), "--as", JOB_CONTROLLER)
    assert "c2VjcmV0LXZhbHVl" not in json.dumps(entries) + stderr
