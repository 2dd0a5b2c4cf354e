"""``runguard whatif``: the runs that exist judged under a proposed policy beside the
current one: denied, changed (moved, clamped) or unchanged, per namespace and project,
as a table, JSON and a markdown summary; offline from ``--cluster-state`` files and
through the same paging as ``runguard audit``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import write
from harness.apiserver import FakeApiserver
from harness.team_policies import CONTEXT, NAMESPACES, TEAM_A_ONLY, policy_dir

from webhook.audit.clusteraudit import listed_pages
from webhook.audit.whatif import Tally, compare, compare_all, markdown
from webhook.cli import main
from webhook.engine import mutate
from webhook.engine.rules.profile import PROFILE_NOT_ALLOWED, PROFILE_RANGE, PROFILE_UNKNOWN
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy


def stored(policy: Policy, name: str, ns: str, profile: str, memory: str = "") -> dict[str, Any]:
    """A run Pod as the cluster holds it: after the current policy's mutation."""
    container: dict[str, Any] = {"name": "main", "image": "python:3.12"}
    if memory:
        container["resources"] = {"requests": {"memory": memory}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {
                "app.kubernetes.io/managed-by": "dhcore",
                "dhcore/template": profile,
                "dhcore/project": f"p-{ns}",
            },
        },
        "spec": {"containers": [container]},
    }
    admitted: dict[str, Any] = mutate(pod, policy, namespace=ns, context=CONTEXT).object
    return admitted


@pytest.fixture
def current(tmp_path: Path) -> Policy:
    return load_policy(policy_dir(tmp_path / "current"))


def test_the_same_policy_changes_nothing(tmp_path: Path, current: Policy) -> None:
    same = load_policy(policy_dir(tmp_path / "same"))
    runs = [stored(current, "a", "team-a", "a100"), stored(current, "b", "team-b", "small", "12Gi")]
    verdicts = list(compare_all(runs, current, same, CONTEXT))
    assert [v.outcome for v in verdicts] == ["unchanged", "unchanged"]
    assert [(v.now, v.profile, v.project) for v in verdicts] == [
        ("allowed", "a100", "p-team-a"),
        ("allowed", "small", "p-team-b"),
    ]


def test_a_profile_kept_to_team_a_denies_team_b_only(tmp_path: Path, current: Policy) -> None:
    proposed = load_policy(policy_dir(tmp_path / "proposed", selector=TEAM_A_ONLY))
    a = compare(stored(current, "a", "team-a", "a100"), current, proposed, CONTEXT)
    b = compare(stored(current, "b", "team-b", "a100"), current, proposed, CONTEXT)
    assert a is not None and b is not None
    assert a.outcome == "unchanged"
    assert (b.outcome, b.rules, b.now, b.run_policy) == (
        "denied", (PROFILE_NOT_ALLOWED,), "allowed", "runs"
    )  # fmt: skip
    assert "it may use: small" in b.detail


def test_a_removed_profile_denies_its_runs(tmp_path: Path, current: Policy) -> None:
    proposed = load_policy(policy_dir(tmp_path / "proposed", a100=False))
    verdict = compare(stored(current, "a", "team-a", "a100"), current, proposed, CONTEXT)
    assert verdict is not None
    assert (verdict.outcome, verdict.rules) == ("denied", (PROFILE_UNKNOWN,))


def test_a_lower_maximum_clamps_and_a_value_inside_stays(tmp_path: Path, current: Policy) -> None:
    proposed = load_policy(policy_dir(tmp_path / "proposed", small_max="8Gi"))
    big = compare(stored(current, "big", "team-a", "small", "12Gi"), current, proposed, CONTEXT)
    fits = compare(stored(current, "fits", "team-a", "small", "6Gi"), current, proposed, CONTEXT)
    assert big is not None and fits is not None
    assert (big.outcome, big.how, big.rules) == ("changed", "clamped", (PROFILE_RANGE,))
    assert "memory request 12Gi -> 8Gi" in big.detail
    assert fits.outcome == "unchanged"


def test_a_new_default_profile_moves_runs_naming_none(tmp_path: Path, current: Policy) -> None:
    proposed_dir = policy_dir(tmp_path / "proposed")
    text = (proposed_dir / "runpolicy.yaml").read_text().replace("default: small", "default: a100")
    (proposed_dir / "runpolicy.yaml").write_text(text)
    pod = stored(current, "plain", "team-a", "small")
    del pod["metadata"]["labels"]["dhcore/template"]  # named none: got the default
    verdict = compare(pod, current, load_policy(proposed_dir), CONTEXT)
    assert verdict is not None
    assert (verdict.outcome, verdict.how) == ("changed", "moved")
    assert (verdict.profile, verdict.proposed_profile) == ("small", "a100")


def test_objects_outside_both_policies_are_left_out(tmp_path: Path, current: Policy) -> None:
    web = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "team-a"},
           "spec": {"containers": [{"name": "web", "image": "nginx"}]}}  # fmt: skip
    assert compare(web, current, current, CONTEXT) is None


def test_the_tally_and_the_markdown_summary(tmp_path: Path, current: Policy) -> None:
    proposed = load_policy(policy_dir(tmp_path / "proposed", selector=TEAM_A_ONLY))
    runs = [stored(current, f"r{i}", ns, "a100") for i in range(3) for ns in ("team-a", "team-b")]
    tally = Tally(examples=2)
    tally.add(compare_all(runs, current, proposed, CONTEXT))
    assert tally.rows() == [
        {"namespace": "team-a", "project": "p-team-a", "denied": 0, "changed": 0, "unchanged": 3},
        {"namespace": "team-b", "project": "p-team-b", "denied": 3, "changed": 0, "unchanged": 0},
    ]
    summary = markdown(tally, "policies", "proposed")
    assert "**6 runs**: 3 would be denied, 0 changed, 3 unchanged." in summary
    assert "| team-b | p-team-b | 3 | 0 | 0 |" in summary
    assert "team-a |" not in summary  # nothing happens there: not in the pull request
    assert summary.count("- Pod `team-b/") == 2  # examples, bounded


def cluster_state(tmp_path: Path, current: Policy) -> Path:
    runs = [stored(current, "a", "team-a", "a100"), stored(current, "b", "team-b", "a100"),
            stored(current, "c", "team-b", "small", "12Gi")]  # fmt: skip
    path = tmp_path / "state.yaml"
    path.write_text(yaml.safe_dump_all([*NAMESPACES, *runs]))
    return path


def test_the_command_offline_json_and_table(
    tmp_path: Path, current: Policy, capsys: pytest.CaptureFixture[str]
) -> None:
    state = cluster_state(tmp_path, current)
    proposed = policy_dir(tmp_path / "proposed", selector=TEAM_A_ONLY, small_max="8Gi")
    args = ["whatif", "-p", str(tmp_path / "current"), "--proposed", str(proposed),
            "--cluster-state", str(state)]  # fmt: skip
    assert main([*args, "-o", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    outcomes = {(r["namespace"], r["name"]): (r["outcome"], r["how"]) for r in report["runs"]}
    assert outcomes == {
        ("team-a", "a"): ("unchanged", None),
        ("team-b", "b"): ("denied", None),
        ("team-b", "c"): ("changed", "clamped"),
    }
    assert report["totals"] == {"denied": 1, "changed": 1, "unchanged": 1}
    assert main([*args, "-n", "team-a"]) == 0
    assert "no run would be denied or changed" in capsys.readouterr().out
    assert main(args) == 1
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAMESPACE", "PROJECT", "KIND", "NAME", "OUTCOME", "RULES",
                                "DETAIL"]  # fmt: skip
    assert [line.split()[:5] for line in table[1:3]] == [
        ["team-b", "p-team-b", "Pod", "b", "denied"],
        ["team-b", "p-team-b", "Pod", "c", "changed"],
    ]
    assert table[-1].split() == ["TOTAL", "1", "1", "1"]


def test_a_broken_proposal_is_bad_input(tmp_path: Path, current: Policy) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    write(broken, "runpolicy.yaml", "apiVersion: runguard.io/v1\nkind: RunPolicy\n")
    state = cluster_state(tmp_path, current)
    assert main(["whatif", "-p", str(tmp_path / "current"), "--proposed", str(broken),
                 "--cluster-state", str(state)]) == 2  # fmt: skip


def test_paging_selects_for_either_policy_and_judges_every_run_once(
    tmp_path: Path, current: Policy
) -> None:
    from webhook.cli.whatif import selecting

    proposed = load_policy(policy_dir(tmp_path / "proposed", selector=TEAM_A_ONLY))
    pods = [stored(current, f"r{i:02}", "team-b", "a100") for i in range(7)]
    fetch = FakeApiserver({"Pod": pods})
    tally = Tally()
    for _, _, items in listed_pages(fetch, selecting(current, proposed), page_size=3):
        tally.add(compare_all(items, current, proposed, CONTEXT))
    assert tally.totals == {"denied": 7}
    pod_queries = [q for kind, q in fetch.queries if kind == "Pod"]
    assert len(pod_queries) == 3
    assert pod_queries[0]["labelSelector"] == "app.kubernetes.io/managed-by=dhcore"


def test_the_paths_the_live_view_reads() -> None:
    from webhook.audit.liveview import path_of

    assert path_of("Pod", "team-a", "train") == "/api/v1/namespaces/team-a/pods/train"
    assert path_of("Job", "team-a") == "/apis/batch/v1/namespaces/team-a/jobs"
    assert path_of("Namespace", "team-a") == "/api/v1/namespaces"
    assert path_of("PriorityClass") == "/apis/scheduling.k8s.io/v1/priorityclasses"


def test_a_kind_the_live_view_did_not_read_is_not_synced() -> None:
    from webhook.audit.liveview import ReadState
    from webhook.clusterstate.model import meta_from_object

    state = ReadState([meta_from_object(NAMESPACES[0])], ["Namespace"])
    assert state.synced("Namespace") and not state.synced("PersistentVolumeClaim")
    assert state.get("Namespace", "", "team-a") is not None
