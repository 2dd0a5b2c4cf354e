"""Time is part of a profile, through the real apiserver: a run of a profile with a
``runTime`` carries ``activeDeadlineSeconds`` (the profile's default, or the smaller of
the user's and the maximum), so do a Job's Pods (its template), and a patch raising or
removing it changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from webhook.policy.loader import load_policy

from .cluster import Cluster
from .runs import Webhook, apply, get, kubectl_warnings, run_pod

pytestmark = pytest.mark.e2e

NOTEBOOK = {
    "apiVersion": "runguard.io/v1",
    "kind": "Profile",
    "metadata": {"name": "notebook"},
    "spec": {
        "description": "A notebook: 8 hours at most",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "runTime": {"default": 3600, "maximum": 28800},
    },
}


@pytest.fixture
def timed(runguard: Webhook) -> Iterator[Webhook]:
    """The session policy with the notebook profile (put back by ``runguard``)."""
    runguard.write_policy([*runguard.policy(), NOTEBOOK])
    runguard.wait_for_policy(load_policy(runguard.policy_dir).digest)
    yield runguard


def test_a_run_gets_its_profiles_run_time_and_cannot_raise_it(
    cluster: Cluster, timed: Webhook, namespace: str
) -> None:
    done = apply(cluster, namespace, run_pod("nb", "notebook"))
    assert done.returncode == 0, done.stderr
    assert "runguard: run time set: activeDeadlineSeconds 3600" in kubectl_warnings(done.stderr)
    assert get(cluster, namespace, "pod", "nb")["spec"]["activeDeadlineSeconds"] == 3600

    long = run_pod("long", "notebook", activeDeadlineSeconds=10**6)
    done = apply(cluster, namespace, long)
    assert done.returncode == 0, done.stderr
    assert get(cluster, namespace, "pod", "long")["spec"]["activeDeadlineSeconds"] == 28800

    # Raised or removed: refused, or put back by /mutate (the values runguard set at
    # creation are kept); either way the run keeps its run time.
    for patch in (
        {"spec": {"activeDeadlineSeconds": 10**6}},
        {"spec": {"activeDeadlineSeconds": None}},
    ):
        cluster.kubectl(
            "patch", "pod", "nb", "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )
        assert get(cluster, namespace, "pod", "nb")["spec"]["activeDeadlineSeconds"] == 3600


def test_a_jobs_pods_get_it_through_its_template(
    cluster: Cluster, timed: Webhook, namespace: str
) -> None:
    template = run_pod("x", "notebook", restartPolicy="Never")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "labels": template["metadata"]["labels"]},
        "spec": {
            "suspend": True,
            "template": {"metadata": {"labels": template["metadata"]["labels"]},
                         "spec": template["spec"]},
        },
    }  # fmt: skip
    done = apply(cluster, namespace, job)
    assert done.returncode == 0, done.stderr
    stored = get(cluster, namespace, "job", "train")
    assert stored["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 3600
