"""What an admin reads is what is true: README figures match what the commands print,
``/readyz`` and the server log name every RunPolicy, and a pod controller's warnings
do not claim to have changed a template runguard leaves as written."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from webhook.cli import main
from webhook.policy.loader import load_policy
from webhook.serving.policystore import PolicyStore

ROOT = Path(__file__).parent.parent
POLICIES = ROOT / "policies"


def console_outputs(text: str, command: str) -> list[str]:
    """The first output line after each ``$ command`` in the markdown's console blocks."""
    lines = text.splitlines()
    return [lines[i + 1] for i, line in enumerate(lines) if line.strip() == f"$ {command}"]


def test_readme_lint_figures_are_what_lint_prints(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    shown = console_outputs((ROOT / "README.md").read_text(), "runguard lint -p policies")
    assert shown, "README shows no `runguard lint -p policies`"
    cwd = os.getcwd()
    os.chdir(ROOT)  # the README runs it from the repository's root
    try:
        assert main(["lint", "-p", "policies"]) == 0
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out.splitlines()[-1]
    assert shown == [printed] * len(shown)


def test_readyz_detail_names_every_run_policy_and_profile() -> None:
    store = PolicyStore(POLICIES)
    state = store.load()
    policy = state.policy
    assert policy is not None and len(policy.names()) > 1  # the shipped policy has several
    detail = state.to_dict()["policy"]
    assert isinstance(detail, dict)
    assert detail["runPolicies"] == sorted(detail["runPolicies"]) == policy.names()
    assert detail["name"] == policy.names()[0]
    assert detail["profiles"] == policy.profile_names()
    assert len(detail["profiles"]) == 4


def test_the_server_log_names_every_run_policy(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="runguard.server"):
        PolicyStore(POLICIES).load()
    (line,) = [r.getMessage() for r in caplog.records if "loaded from" in r.getMessage()]
    names = load_policy(POLICIES).names()
    assert f"RunPolicies {', '.join(names)}; 4 profiles" in line


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: serve, namespace: ml}
spec:
  selector: {matchLabels: {app: serve}}
  template:
    metadata:
      labels: {app: serve, app.kubernetes.io/managed-by: dhcore, dhcore/run: r1,
               dhcore/template: 1xt4}
    spec:
      containers: [{name: main, image: python:3.11, securityContext: {privileged: true}}]
"""


def test_a_controllers_warnings_say_its_pods_change_not_its_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deployment.yaml"
    path.write_text(DEPLOYMENT)
    assert main(["apply", "-p", str(POLICIES), "-o", "yaml", str(path)]) == 0
    (entry,) = yaml.safe_load(capsys.readouterr().out)
    container = entry["object"]["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"] == {"privileged": True}  # kept as written
    assert all("/spec/template" not in op["path"] for op in entry["patch"])
    first, *rest = entry["warnings"]
    assert "pod template is kept as written" in first and "each Pod created from it" in first
    assert any(re.search(r"stripped: main privileged", w) for w in rest)


def test_the_lint_example_of_the_policy_guide_is_what_lint_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/policies.md: its first profile added to the shipped policy with 96Gi of
    memory and a typo prints what the guide shows (line numbers aside: they follow
    policies/profiles.yaml)."""
    import os

    guide = (ROOT / "docs" / "policies.md").read_text()
    profile = re.search(
        r"```yaml\n(---\napiVersion: runguard.io/v1\nkind: Profile\n.*?)```", guide, re.S
    )
    assert profile is not None
    edited = profile.group(1).replace("memory: 64Gi", "memory: 96Gi")
    edited = edited.replace("runtimeClassName:", "runtimeClass:")
    (tmp_path / "policies").mkdir()
    for path in POLICIES.glob("*.yaml"):
        text = path.read_text() + (edited if path.name == "profiles.yaml" else "")
        (tmp_path / "policies" / path.name).write_text(text)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["lint", "-p", "policies"]) == 2
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr()
    lines = (printed.err + printed.out).splitlines()
    block = guide[guide.index("$ runguard lint -p policies\n") :].split("```", 1)[0]
    shown = block.splitlines()[1:]

    def unnumbered(text: str) -> str:
        return re.sub(r"\.yaml:\d+", ".yaml", text)

    assert [unnumbered(x) for x in lines] == [unnumbered(x) for x in shown]


def test_readme_mutate_example_is_what_the_server_answers() -> None:
    """The README's `review.json` sent to `/mutate` prints, through its jq filter, exactly
    the output the README shows (the patch decoded to its operations and paths)."""
    import base64
    import json

    from webhook.serving.app import create_app

    text = (ROOT / "README.md").read_text()
    review = text.split("$ cat > review.json <<'JSON'\n", 1)[1].split("\nJSON\n", 1)[0]
    jq = 'map("\\(.op) \\(.path)"))\'\n'
    shown = text.split(jq, 1)[1].split("```", 1)[0]
    app = create_app({"policy_dir": POLICIES})
    answer = app.test_client().post("/mutate", data=review, content_type="application/json")
    assert answer.status_code == 200, answer.text
    response = answer.get_json()["response"]
    patch = json.loads(base64.b64decode(response["patch"]))
    response["patch"] = [f"{op['op']} {op['path']}" for op in patch]
    assert json.dumps(response, indent=2) + "\n" == shown
