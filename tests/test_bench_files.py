"""The benchmarks' generated files stay what the shipped policy renders (no silent drift)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from webhook.policy.loader import load_policy

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_create  # noqa: E402


def test_the_vap_file_is_the_one_policies_renders() -> None:
    shipped = (REPO / "bench" / "vap" / "policy.yaml").read_text()
    assert shipped == bench_create.vap_text(load_policy(REPO / "policies")), (
        "re-render it: .venv/bin/python bench/bench_create.py --write-vap"
    )


def test_the_vap_covers_the_rules_it_says() -> None:
    documents = list(yaml.safe_load_all((REPO / "bench" / "vap" / "policy.yaml").read_text()))
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    policy = next(d for d in documents if d["kind"] == "ValidatingAdmissionPolicy")
    said = {
        line.strip("# \n")
        for line in (REPO / "bench" / "vap" / "policy.yaml").read_text().splitlines()
        if line.startswith("#   ")
    }
    carried = {rule for rule, _, _ in bench_create.vap_rules(bench_create.run_policy(
        load_policy(REPO / "policies")))}  # fmt: skip
    assert said == carried and len(policy["spec"]["validations"]) >= len(carried)


def test_the_kyverno_file_is_the_one_policies_renders() -> None:
    import bench_kyverno

    shipped = (REPO / "bench" / "kyverno" / "policy.yaml").read_text()
    assert shipped == bench_kyverno.kyverno_text(load_policy(REPO / "policies")), (
        "re-render it: .venv/bin/python bench/bench_kyverno.py --write-policy"
    )
    kinds = [d["kind"] for d in yaml.safe_load_all(shipped)]
    assert kinds == ["ClusterPolicy", "ClusterPolicy"]


def test_make_test_never_builds_kyverno() -> None:
    """Only ``make bench`` (bench_all.py, through bench_kyverno.py) builds Kyverno."""
    makefile = (REPO / "Makefile").read_text()
    test_target = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "kyverno" not in test_target.lower()
    users = [p.name for p in (REPO / "bench").glob("*.py") if "kyverno/build.sh" in p.read_text()]
    assert users == ["bench_kyverno.py"]
