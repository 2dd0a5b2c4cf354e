"""Runs with a run time: the profiles ``TIMED`` adds to a RunPolicy, and a queued
RunPolicy (Kueue's maximum execution time) with its Job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webhook.keys import PROFILE_LABEL
from webhook.policy.model import Policy

from .pods import container, policy_of
from .templates import KUEUE as QUEUE_CONTROLLER

TIMED = """\
    {apiVersion: runguard.io/v1, kind: Profile, metadata: {name: notebook},
     spec: {resources: {requests: {cpu: "1"}}, runTime: {default: 3600, maximum: 28800}}}
    ---
    {apiVersion: runguard.io/v1, kind: Profile, metadata: {name: capped},
     spec: {runTime: {maximum: 7200}}}
    """


def queued_policy(tmp_path: Path) -> Policy:
    return policy_of(
        tmp_path,
        {"platform": {"queues": [{"identity": QUEUE_CONTROLLER.username}]}},
        {"queued": {"queue": {"name": "gpu"}, "runTime": {"default": 3600, "maximum": 28800}}},
    )


def queued_job() -> dict[str, Any]:
    labels = {"app": "run", PROFILE_LABEL: "queued"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "labels": labels},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container()]},
            }
        },
    }
