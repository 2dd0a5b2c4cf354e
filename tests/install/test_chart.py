"""The Helm chart is rendered from the same sources as manifests/ (``runguard chart``):
the committed chart is what they render, and each optional component is a value. helm
itself (lint, template against kustomize, install) is in tests/e2e/test_helm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO

from webhook import __version__
from webhook.cli import main
from webhook.install import manifests
from webhook.install.chart import COMPONENTS, chart_files
from webhook.policy.loader import load_policy

CHART = REPO / "charts" / "runguard"


def rendered() -> dict[str, str]:
    policies = REPO / "policies"
    return chart_files(
        load_policy(policies), manifests.read_policy_files(policies), REPO / "manifests"
    )


def test_the_committed_chart_is_what_the_sources_render() -> None:
    """Drift: fix with `runguard chart -p policies --write charts/runguard`."""
    files = rendered()
    committed = {str(p.relative_to(CHART)): p.read_text() for p in CHART.rglob("*") if p.is_file()}
    assert sorted(committed) == sorted(files)
    for name, text in files.items():
        assert committed[name] == text, (
            f"charts/runguard/{name} is stale: run `runguard chart -p policies --write "
            "charts/runguard`"
        )


def test_chart_version_and_values() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    assert chart["kubeVersion"] == f">={manifests.MIN_KUBERNETES}.0-0"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    kustomization = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert values["image"] == {"repository": image["newName"], "tag": image["newTag"]}
    assert values["replicas"] == 2 and values["certificates"]["generate"] is True
    # Every component off by default, as in the base.
    assert not values["clusterState"]["enabled"] and not values["policies"]["objects"]
    assert not values["audit"]["enabled"] and not values["audit"]["reportCRDs"]


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_each_component_is_a_template_behind_its_value(component: str) -> None:
    text = (CHART / "templates" / f"{component}.yaml").read_text()
    body = text.split("\n", 2)[2]  # after the generated header
    assert body.startswith(f"{{{{- if {COMPONENTS[component]} }}}}\n")
    assert body.rstrip().endswith("{{- end }}")


def test_cli_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "chart"
    assert main(["chart", "-p", str(REPO / "policies"), "--manifests",
                 str(REPO / "manifests"), "--write", str(out)]) == 0  # fmt: skip
    check = ["chart", "-p", str(REPO / "policies"), "--manifests", str(REPO / "manifests")]
    assert main([*check, "--check", str(out)]) == 0
    (out / "values.yaml").write_text("replicas: 3\n")
    capsys.readouterr()
    assert main([*check, "--check", str(out)]) == 1
    assert "--write" in capsys.readouterr().err


def test_the_floor_is_on_by_default_and_the_available_mode_a_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["floor"]["enabled"] is True and values["webhooks"]["available"] is False
    policy = load_policy(REPO / "policies")
    text = (CHART / "templates" / "floor.yaml").read_text().split("\n", 2)[2]
    condition, *body, end = text.rstrip().splitlines()
    assert (condition, end) == ("{{- if .Values.floor.enabled }}", "{{- end }}")
    served = "\n".join(body).replace("{{ .Release.Namespace }}", manifests.DEFAULT_NAMESPACE)
    # (the release's namespace sorts elsewhere among those the bindings leave out)
    assert [_sorted(d) for d in yaml.safe_load_all(served) if d] == [
        _sorted(d) for d in manifests.floor_policies(policy)
    ]
    # Each webhook judging runs fails open with the value (by Service and by URL), no other.
    hooks = (CHART / "templates" / "webhooks.yaml").read_text()
    opened = manifests.webhook_configurations(policy, available=True)
    runs = sum(h["failurePolicy"] == "Ignore" for c in opened for h in c["webhooks"])
    assert (
        hooks.count('failurePolicy: {{ ternary "Ignore" "Fail" .Values.webhooks.available }}')
        == 2 * runs
    )
    assert "webhooks.available needs floor.enabled" in hooks


def _sorted(obj: dict[str, Any]) -> dict[str, Any]:
    for requirement in (
        obj["spec"]
        .get("matchResources", {})
        .get("namespaceSelector", {})
        .get("matchExpressions", [])
    ):
        requirement["values"] = sorted(requirement["values"])
    return obj
