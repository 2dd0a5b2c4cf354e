"""``runguard apply`` reads lists item by item, as kubectl does (docs/dev/guarantees.md, "Every
admitted object")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import TESTS

POLICY = TESTS / "cases" / "_policies" / "platform"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}


def apply(document: dict[str, object], tmp_path: Path) -> tuple[int, list[dict[str, object]]]:
    source = tmp_path / "in.json"
    source.write_text(json.dumps(document))
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "apply", "-p", str(POLICY), "-o", "json", str(source)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def item(name: str, **spec: object) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": RUN},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}], **spec},
    }


def test_a_pod_list_is_judged_item_by_item(tmp_path: Path) -> None:
    code, entries = apply(
        {"apiVersion": "v1", "kind": "PodList", "items": [item("a"), item("b", hostPID=True)]},
        tmp_path,
    )
    assert code == 1  # one item denied
    assert [(e["kind"], e["name"], e["allowed"]) for e in entries] == [
        ("Pod", "a", True),
        ("Pod", "b", False),
    ]
    assert [v["rule"] for v in entries[1]["violations"]] == ["security.host-namespace"]  # type: ignore[index]


def test_items_keep_their_own_kind_in_a_plain_list(tmp_path: Path) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": {"template": item("t")},
    }
    code, entries = apply({"apiVersion": "v1", "kind": "List", "items": [job]}, tmp_path)
    assert code == 0
    assert [(e["kind"], e["name"]) for e in entries] == [("Job", "j")]
