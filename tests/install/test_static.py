"""``runguard manifests --static``: the control plane's static manifests. The policy that
keeps runguard in the path, its conditions evaluated as the apiserver does (cel-expr-python)
on the requests it must refuse and those it must let through; the files and their names.
The real apiserver loads them in tests/e2e/test_floor.py (1.37)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from harness import REPO

from webhook.cli import main
from webhook.install import manifests
from webhook.install.static import PROTECT_NAME, STATIC_SUFFIX, protect_policy, static_files
from webhook.policy.loader import load_policy

ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
BREAK_GLASS = {"username": "alice", "groups": ["system:authenticated"]}
ON_CALL = {"username": "bob", "groups": ["sre-oncall", "system:authenticated"]}


@pytest.fixture(scope="module")
def refuses() -> Any:
    cel = pytest.importorskip("cel_expr_python.cel")
    optional = pytest.importorskip("cel_expr_python.ext.ext_optional")
    strings = pytest.importorskip("cel_expr_python.ext.ext_strings")
    env = cel.NewEnv(
        variables={"object": cel.Type.DYN, "request": cel.Type.DYN},
        extensions=[optional.ExtOptional(), strings.ExtStrings()],
    )
    policy, binding = protect_policy(["alice", "group:sre-oncall"])
    assert binding["spec"] == {"policyName": PROTECT_NAME, "validationActions": ["Deny"]}
    assert policy["spec"]["validations"] == [
        {"expression": "false", "message": policy["spec"]["validations"][0]["message"]}
    ]
    conditions = [env.compile(c["expression"]) for c in policy["spec"]["matchConditions"]]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]

    def judge(
        group: str,
        resource: str,
        name: str,
        operation: str,
        user: dict[str, Any],
        namespace: str = "",
        obj: Any = None,
        subresource: str = "",
    ) -> bool:
        """Whether the policy refuses the request: its rules match it and every
        matchCondition holds."""
        full = f"{resource}/{subresource}" if subresource else resource
        if not any(
            group in r["apiGroups"] and full in r["resources"] and operation in r["operations"]
            for r in rules
        ):
            return False
        request = {
            "resource": {"group": group, "resource": resource},
            "subResource": subresource,
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": user,
        }
        data = {"request": request, "object": obj}
        return all(c.eval(data=data).value() for c in conditions)

    return judge  # fmt: skip


def test_runguards_admission_objects_are_kept_from_everyone_but_break_glass(refuses: Any) -> None:
    admission = "admissionregistration.k8s.io"
    for resource in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        for operation in ("DELETE", "UPDATE"):
            assert refuses(admission, resource, "runguard", operation, ADMIN)
            assert not refuses(admission, resource, "runguard", operation, BREAK_GLASS)
            assert not refuses(admission, resource, "runguard", operation, ON_CALL)
        assert not refuses(admission, resource, "someone-elses", "DELETE", ADMIN)
    assert refuses(
        admission, "validatingwebhookconfigurations", "runguard-policies", "DELETE", ADMIN
    )
    for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        assert refuses(admission, resource, "runguard-floor-digitalhub", "DELETE", ADMIN)
        assert not refuses(admission, resource, "another-policy", "DELETE", ADMIN)
    crds = "apiextensions.k8s.io"
    assert refuses(crds, "customresourcedefinitions", "runpolicies.runguard.io", "DELETE", ADMIN)
    assert not refuses(crds, "customresourcedefinitions", "rayjobs.ray.io", "DELETE", ADMIN)
    # creating them stays open: an install needs it
    assert not refuses(admission, "validatingwebhookconfigurations", "runguard", "CREATE", ADMIN)


def test_runguards_deployment_is_not_scaled_to_zero(refuses: Any) -> None:
    def scale(replicas: int, subresource: str = "", namespace: str = "runguard") -> bool:
        obj = {"spec": {"replicas": replicas}}
        return bool(refuses("apps", "deployments", "runguard", "UPDATE", ADMIN, namespace, obj,
                            subresource))  # fmt: skip

    assert scale(0) and scale(0, "scale")
    # a Scale leaves its replicas out when 0 (omitempty): what `kubectl scale --replicas=0` sends
    assert refuses("apps", "deployments", "runguard", "UPDATE", ADMIN, "runguard", {"spec": {}},
                   "scale")  # fmt: skip
    assert not refuses("apps", "deployments", "runguard", "UPDATE", ADMIN, "runguard",
                       {"spec": {}})  # fmt: skip
    assert not scale(3) and not scale(3, "scale")
    assert not scale(0, namespace="team-a")
    assert refuses("apps", "deployments", "runguard", "DELETE", ADMIN, "runguard")
    assert not refuses("apps", "deployments", "runguard", "DELETE", BREAK_GLASS, "runguard")


def test_the_files_name_every_object_statically(tmp_path: Path) -> None:
    policy = load_policy(REPO / "policies")
    where = PurePosixPath("/etc/kubernetes/runguard")
    files = static_files(policy, ["alice"], where, url="https://10.0.0.1:8443")
    (configuration,) = files.pop("admission-configuration.yaml")
    dirs = {p["name"]: p["configuration"]["staticManifestsDir"] for p in configuration["plugins"]}
    assert dirs == {
        "ValidatingAdmissionPolicy": f"{where}/validating-admission-policy",
        "ValidatingAdmissionWebhook": f"{where}/validating-webhook",
        "MutatingAdmissionWebhook": f"{where}/mutating-webhook",
    }
    for path, objects in files.items():
        assert f"{where}/{path.split('/')[0]}" in dirs.values()
        for obj in objects:
            assert obj["metadata"]["name"].endswith(STATIC_SUFFIX)
            assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
            for hook in obj.get("webhooks", []):
                assert hook["clientConfig"]["url"].startswith("https://10.0.0.1:8443/")
    without_url = static_files(policy, ["alice"], where)
    assert sorted(without_url) == ["admission-configuration.yaml",
                                   "validating-admission-policy/runguard-protect.yaml"]  # fmt: skip


def test_cli_writes_them_and_asks_for_a_break_glass_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = str(REPO / "policies")
    out = tmp_path / "static"
    assert main(["manifests", "-p", policies, "--static", str(out), "--break-glass", "alice"]) == 0
    # The API server splits a file on "---" and refuses a document without a kind.
    for path in out.rglob("*.yaml"):
        chunks = path.read_text().split("\n---\n")
        assert all(yaml.safe_load(chunk.removeprefix("---\n"))["kind"] for chunk in chunks), path
    protect = out / "validating-admission-policy" / "runguard-protect.yaml"
    written = list(yaml.safe_load_all(protect.read_text()))
    assert [d["metadata"]["name"] for d in written] == [PROTECT_NAME, PROTECT_NAME]
    (configuration,) = yaml.safe_load_all((out / "admission-configuration.yaml").read_text())
    assert configuration["plugins"][0]["configuration"]["staticManifestsDir"] == str(
        out.absolute() / "validating-admission-policy"
    )
    capsys.readouterr()
    assert main(["manifests", "-p", policies, "--static", str(out)]) == 2
    assert "--break-glass: name at least one identity" in capsys.readouterr().err
    assert main(["manifests", "-p", policies, "--break-glass", "alice"]) == 2
    assert "go with --static" in capsys.readouterr().err
    assert manifests.FLOOR_FILE not in {p.name for p in out.rglob("*")}
