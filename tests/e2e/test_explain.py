"""``runguard explain`` and ``runguard whatif`` against the real kube-apiserver.

The session's runguard admits the runs (kubectl apply, so the Pod keeps the manifest
it was sent as its last-applied configuration; kubectl create, so it does not; a Job,
whose template runguard judges). ``explain`` reads them back and says which RunPolicy
and profile governed, each change and the profiles the namespace may use; ``whatif``
judges them under a proposal keeping the A100 profile to team A's namespaces with a
lower memory limit: team B's A100 run would be denied, team A's changed, the small run
unchanged; the same from a ``kubectl get -o yaml`` dump offline.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import Cluster
from .devcluster import runguard_command
from .runs import Webhook, apply, controller, run_pod

pytestmark = pytest.mark.e2e

TEAM_A_ONLY = {"matchLabels": {"example.com/team": "a"}}


def run_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [runguard_command(), *args, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def offline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([runguard_command(), *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


@pytest.fixture
def teams(cluster: Cluster, runguard: Webhook, namespace: str) -> tuple[str, str]:
    """(team A's namespace, team B's), each with an A100 run; team A's with a small run,
    a Job and an A100 run made with kubectl create."""
    team_b = namespace[:55] + "-b"
    cluster.kubectl("create", "namespace", team_b, check=True)
    cluster.kubectl("label", "namespace", namespace, "example.com/team=a", check=True)
    for ns in (namespace, team_b):
        done = apply(cluster, ns, run_pod("gpu", "1xa100"))
        assert done.returncode == 0, done.stderr
    done = apply(cluster, namespace, run_pod("small", "default"))
    assert done.returncode == 0, done.stderr
    done = apply(cluster, namespace, controller("Job", "train", run_pod("x", "1xa100")))
    assert done.returncode == 0, done.stderr
    created = json.dumps(run_pod("created", "1xa100"))
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", input=created)
    assert done.returncode == 0, done.stderr
    return namespace, team_b


def explained(cluster: Cluster, policy: Path, *target: str) -> dict[str, Any]:
    done = run_cli(cluster, "explain", "-p", str(policy), *target, "-o", "json")
    assert done.returncode == 0, done.stderr
    [found] = json.loads(done.stdout)
    assert isinstance(found, dict)
    return found


def test_explain_reads_a_pod_and_a_job(
    cluster: Cluster, runguard: Webhook, teams: tuple[str, str]
) -> None:
    team_a, _ = teams
    pod = explained(cluster, runguard.policy_dir, "pod", "gpu", "-n", team_a)
    assert "last-applied-configuration" in pod["judged"]
    assert (pod["runPolicy"], pod["profile"]["asked"], pod["profile"]["applied"]) == (
        "platform", "1xa100", "1xa100"
    )  # fmt: skip
    assert "profile.applied" in {c["rule"] for c in pod["changes"]}
    assert all(c["why"] for c in pod["changes"])
    assert {p["name"]: p["usable"] for p in pod["profiles"]} == {"1xa100": True, "default": True}

    job = explained(cluster, runguard.policy_dir, "job", "train", "-n", team_a)
    assert (job["kind"], job["profile"]["applied"]) == ("Job", "1xa100")
    assert "profile.applied" in {c["rule"] for c in job["changes"]}

    created = explained(cluster, runguard.policy_dir, "pod", "created", "-n", team_a)
    assert created["judged"] == "Pod created as stored"
    assert created["profile"]["applied"] == "1xa100"
    assert "profile.applied" not in {c["rule"] for c in created["changes"]}  # already done

    text = run_cli(cluster, "explain", "-p", str(runguard.policy_dir), "pod", "gpu", "-n", team_a)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"Pod {team_a}/gpu: allowed\n")
    missing = run_cli(cluster, "explain", "-p", str(runguard.policy_dir), "pod", "nope", "-n",
                       team_a)  # fmt: skip
    assert missing.returncode == 2 and "no Pod nope" in missing.stderr


def proposal(runguard: Webhook, directory: Path) -> Path:
    """The session policy, the A100 profile kept to team A with a 40Gi memory limit."""
    documents = runguard.policy()
    for doc in documents:
        if doc["kind"] == "Profile" and doc["metadata"]["name"] == "1xa100":
            doc["spec"]["namespaceSelector"] = TEAM_A_ONLY
            doc["spec"]["resources"]["limits"]["memory"] = "40Gi"
    directory.mkdir()
    (directory / "policy.yaml").write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return directory


def outcomes(done: subprocess.CompletedProcess[str]) -> dict[tuple[str, str, str], str]:
    assert done.returncode == 1, done.stderr  # some run affected
    report = json.loads(done.stdout)
    return {(r["namespace"], r["kind"], r["name"]): r["outcome"] for r in report["runs"]}


def test_whatif_live_and_offline(
    cluster: Cluster, runguard: Webhook, teams: tuple[str, str], tmp_path: Path
) -> None:
    team_a, team_b = teams
    proposed = proposal(runguard, tmp_path / "proposed")
    args = ["whatif", "-p", str(runguard.policy_dir), "--proposed", str(proposed)]
    expected = {
        (team_a, "Pod", "gpu"): "changed",
        (team_a, "Pod", "created"): "changed",
        (team_a, "Job", "train"): "changed",
        (team_a, "Pod", "small"): "unchanged",
        (team_b, "Pod", "gpu"): "denied",
    }
    live = {}
    for ns in teams:
        live.update(outcomes(run_cli(cluster, *args, "-n", ns, "-o", "json")))
    assert live == expected

    summary = run_cli(cluster, *args, "-n", team_b, "-o", "markdown")
    assert summary.returncode == 1, summary.stderr
    assert "**1 runs**: 1 would be denied, 0 changed, 0 unchanged." in summary.stdout
    assert f"- Pod `{team_b}/gpu` `profile.not-allowed`" in summary.stdout

    dump = cluster.kubectl("get", "pods,jobs,namespaces,priorityclasses,runtimeclasses", "-A",
                           "-o", "yaml", check=True)  # fmt: skip
    state = tmp_path / "state.yaml"
    state.write_text(dump.stdout)
    dumped = {}
    for ns in teams:
        done = offline(*args, "--cluster-state", str(state), "-n", ns, "-o", "json")
        dumped.update(outcomes(done))
    assert dumped == expected
