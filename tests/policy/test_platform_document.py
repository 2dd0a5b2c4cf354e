"""The Platform document: the installation-wide settings written once and named by each
RunPolicy (``spec.platform: NAME``); the older inline form; the errors, with file:line;
two platforms in one cluster; the Platform CRD and the mirror of a Platform object."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import yaml
from harness import REPO, write

from webhook.clusterstate.static import StaticClusterState
from webhook.engine import validate
from webhook.engine.context import Context, Requester
from webhook.policy.crd import CRD_FILES, policy_crds
from webhook.policy.lint import lint
from webhook.policy.loader import load_policy, read_policy
from webhook.policy.mirror.objects import check_object, conditions, mirror
from webhook.serving.app import create_app

POLICIES = REPO / "policies"

RUN_POLICY = """\
apiVersion: runguard.io/v1
kind: RunPolicy
metadata: {{name: {name}}}
spec:
  selector:
    matchLabels: {{platform: {name}}}
    matchExpressions: [{{key: run, operator: Exists}}]
  volumes:
    platformClaims: ["v-{{labels[run]}}-*"]
    onPreExisting: Deny
{platform}"""
PLATFORM = """\
apiVersion: runguard.io/v1
kind: Platform
metadata: {{name: {name}}}
spec:
  identities: ["{identity}"]
  projectLabel: {name}/project
"""


def run_policy(name: str, platform: str = "") -> str:
    return RUN_POLICY.format(name=name, platform=platform)


def platform(name: str, identity: str) -> str:
    return PLATFORM.format(name=name, identity=identity)


def lines(directory: str = "pol") -> list[str]:
    return lint(directory).lines()


# --- the reference --------------------------------------------------------------------


def test_a_run_policy_reads_the_platform_it_names(pol: Path) -> None:
    write(pol, "runpolicy.yaml", run_policy("runs", "  platform: core\n"))
    write(pol, "platform.yaml", platform("core", "system:serviceaccount:core:core"))
    assert lines() == []
    policy = load_policy(pol)
    assert policy.first.platform.identities == ("system:serviceaccount:core:core",)
    assert policy.first.platform.project_label == "core/project"
    assert policy.first.platform.installers == ("group:system:masters",)  # defaults as inline


def test_the_shipped_platform_is_what_each_run_policy_wrote_inline(tmp_path: Path) -> None:
    """The same Policy, digest included, as the platform's keys written in each RunPolicy:
    converting a policy changes nothing runguard decides."""
    inline = tmp_path / "inline"
    shutil.copytree(POLICIES, inline)
    (platform_doc,) = yaml.safe_load_all((inline / "platform.yaml").read_text())
    (inline / "platform.yaml").unlink()
    for path in inline.glob("*.yaml"):
        docs = list(yaml.safe_load_all(path.read_text()))
        for doc in docs:
            if doc["kind"] == "RunPolicy":
                assert doc["spec"]["platform"] == "digitalhub"
                doc["spec"]["platform"] = platform_doc["spec"]
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    before, after = load_policy(inline), load_policy(POLICIES)
    assert [p.digest for p in before.run_policies] == [p.digest for p in after.run_policies]
    for old, new in zip(before.run_policies, after.run_policies, strict=True):
        assert old.platform == new.platform


def test_no_platform_means_none(pol: Path) -> None:
    """A RunPolicy naming no platform has none, as before Platform documents: no identities
    (names alone decide); beside a Platform, lint says so."""
    write(pol, "runpolicy.yaml", run_policy("runs"))
    policy = load_policy(pol)
    assert policy.first.platform.identities == () and policy.first.platform.operators == ()
    write(pol, "platform.yaml", platform("core", "core"))
    assert lines() == [
        "pol/platform.yaml:3: warning: metadata.name: no RunPolicy names this Platform "
        "(platform: core): it changes nothing",
        "pol/runpolicy.yaml:4: warning: spec: no platform.identities: platform names alone "
        "decide what a run may use, and names and labels are written by whoever writes the "
        "manifest (a Pod labelled with another run's id gets that run's volumes and "
        "secrets); list the platform's user",
        "pol/runpolicy.yaml:4: warning: spec: names no platform: it has none (no identities: "
        "names alone decide what its runs may use); write platform: NAME (Platforms: core)",
    ]


# --- the errors -----------------------------------------------------------------------


def test_an_unknown_platform_is_an_error_at_its_line(pol: Path) -> None:
    write(pol, "runpolicy.yaml", run_policy("runs", "  platform: core\n"))
    write(pol, "platform.yaml", platform("other", "core"))
    report = lint("pol")
    assert [str(e) for e in report.errors] == [
        'pol/runpolicy.yaml:11: spec.platform: Platform "core" is not defined (platforms: other)'
    ]
    assert report.policy is None


def test_two_platforms_of_one_name_are_an_error_at_each(pol: Path) -> None:
    write(pol, "runpolicy.yaml", run_policy("runs", "  platform: core\n"))
    write(pol, "platform.yaml", platform("core", "a") + "---\n" + platform("core", "b"))
    assert [str(e) for e in lint("pol").errors] == [
        'pol/platform.yaml:3: metadata.name: duplicate Platform name "core" (also at '
        "pol/platform.yaml:10): a RunPolicy names one Platform by its name",
        'pol/platform.yaml:10: metadata.name: duplicate Platform name "core" (also at '
        "pol/platform.yaml:3): a RunPolicy names one Platform by its name",
    ]


def core_platform(pol: Path, spec: str) -> None:
    """A RunPolicy naming Platform core, and Platform core's ``spec`` keys (from line 5)."""
    write(pol, "runpolicy.yaml", run_policy("runs", "  platform: core\n"))
    header = "apiVersion: runguard.io/v1\nkind: Platform\nmetadata: {name: core}\nspec:\n"
    write(pol, "platform.yaml", header + textwrap.indent(textwrap.dedent(spec), "  "))


def test_a_platforms_bad_field_is_an_error_at_its_line(pol: Path) -> None:
    core_platform(
        pol,
        """\
        identities: core
        operator:
          - {identity: argo, kinds: [argoproj.io/Workflow]}
        projectLabel: "not a label key"
        """,
    )
    errors = [str(e) for e in lint("pol").errors]
    assert errors[0] == 'pol/platform.yaml:5: spec.identities: expected a list, got "core"'
    assert errors[1].startswith(
        'pol/platform.yaml:6: spec.operator: unknown key "operator" (did you mean "operators"?)'
    )
    assert errors[2].startswith("pol/platform.yaml:8: spec.projectLabel: ")
    assert len(errors) == 3


def test_a_platform_name_must_be_an_object_name(pol: Path) -> None:
    write(pol, "runpolicy.yaml", run_policy("runs", "  platform: Core_1\n"))
    write(pol, "platform.yaml", platform("core", "a"))
    assert [str(e) for e in lint("pol").errors] == [
        'pol/runpolicy.yaml:11: spec.platform: "Core_1" is not a valid name (lowercase letters, '
        'digits, "-" and ".", starting and ending with a letter or digit)',
        'pol/runpolicy.yaml:11: spec.platform: Platform "Core_1" is not defined (platforms: core)',
    ]


def test_an_operators_reference_is_checked_in_the_platform(pol: Path) -> None:
    core_platform(
        pol,
        """\
        identities: [core]
        operators:
          - identity: ray
            kinds: [ray.io/RayJob]
            references:
              - {kind: ray.io/RayJob, path: spec.x, names: ray.io/RayCluster, by: name}
        """,
    )
    assert [str(e) for e in lint("pol").errors] == [
        'pol/platform.yaml:10: spec.operators[0].references[0].names: "ray.io/RayCluster" is '
        "no kind of the platform's operators: runguard neither records who created its "
        "objects nor keeps them in its cache"
    ]


# --- the older form -------------------------------------------------------------------


def test_an_inline_platform_loads_and_lint_says_what_to_move(pol: Path) -> None:
    inline = "  platform:\n    identities: [core]\n"
    write(pol, "runpolicy.yaml", run_policy("runs", inline))
    write(pol, "builds.yaml", run_policy("builds", inline))
    report = lint("pol")
    assert report.errors == []
    assert report.policy is not None
    assert [p.platform.identities for p in report.policy.run_policies] == [("core",)] * 2
    # the same keys, one Platform: both are told the same name
    assert report.lines() == [
        "pol/builds.yaml:11: warning: spec.platform: written inline (the older form): move "
        "these keys to a Platform document (kind: Platform, metadata.name: builds, spec: "
        "these keys) and write platform: builds here",
        "pol/runpolicy.yaml:11: warning: spec.platform: written inline (the older form): "
        "move these keys to a Platform document (kind: Platform, metadata.name: builds, "
        "spec: these keys) and write platform: builds here",
    ]
    write(
        pol, "platform.yaml", platform("core", "core").replace("  projectLabel: core/project\n", "")
    )
    write(pol, "builds.yaml", run_policy("builds", "  platform: core\n"))
    assert lint("pol").lines() == [
        "pol/runpolicy.yaml:11: warning: spec.platform: written inline (the older form): "
        "Platform core holds the same keys: remove them and write platform: core here",
    ]


# --- two platforms --------------------------------------------------------------------

CLAIMED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "r1", "namespace": "team", "labels": {"run": "r1"}},
    "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "v-r1-data"}}],
    },
}


def judged(policy: Any, labels: dict[str, str], user: str) -> bool:
    """Whether ``user``'s Pod may use its run's platform claim (not a pre-existing one)."""
    pod = json.loads(json.dumps(CLAIMED))
    pod["metadata"]["labels"].update(labels)
    context = Context(Requester(user), StaticClusterState())
    rules = {v.rule for v in validate(pod, policy, context=context).violations}
    return "volumes.pre-existing" not in rules


def test_two_platforms_each_run_policy_its_own(pol: Path) -> None:
    """MLRun beside DigitalHub: each RunPolicy's runs are its own platform's."""
    write(pol, "dh.yaml", run_policy("dh", "  platform: digitalhub\n"))
    write(pol, "ml.yaml", run_policy("ml", "  platform: mlrun\n"))
    write(
        pol,
        "platform.yaml",
        platform("digitalhub", "dh-core") + "---\n" + platform("mlrun", "ml-api"),
    )
    assert lines() == []
    policy = load_policy(pol)
    dh, ml = policy.named("dh"), policy.named("ml")
    assert dh is not None and ml is not None
    assert (dh.platform.identities, ml.platform.identities) == (("dh-core",), ("ml-api",))
    assert (dh.platform.project_label, ml.platform.project_label) == (
        "digitalhub/project",
        "mlrun/project",
    )
    assert judged(policy, {"platform": "dh"}, "dh-core")
    assert not judged(policy, {"platform": "dh"}, "ml-api")
    assert judged(policy, {"platform": "ml"}, "ml-api")
    assert not judged(policy, {"platform": "ml"}, "dh-core")


def test_the_shipped_policies_name_one_platform_each() -> None:
    for directory, names in (
        ("policies", {"digitalhub"}),
        ("policies/examples/mlrun", {"mlrun", "nuclio"}),
    ):
        source = read_policy(REPO / directory)
        assert source.errors == []
        assert {d.name for d in source.platforms} == names
        assert {d.get("spec", "platform") for d in source.run_policies} == names


# --- the CRD and the mirror -----------------------------------------------------------


def test_the_platform_crd() -> None:
    (crd,) = [c for c in policy_crds() if c["spec"]["names"]["kind"] == "Platform"]
    assert crd["metadata"]["name"] == "platforms.runguard.io"
    assert crd["spec"]["scope"] == "Cluster"
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert {
        "identities",
        "controllers",
        "operators",
        "queues",
        "installers",
        "projectLabel",
    } <= set(spec["properties"])
    (run_policy_crd,) = [c for c in policy_crds() if c["spec"]["names"]["kind"] == "RunPolicy"]
    named = run_policy_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    # a name or the older mapping: the apiserver keeps either, runguard's webhook checks it
    assert named["spec"]["properties"]["platform"]["x-kubernetes-preserve-unknown-fields"]
    written = yaml.safe_load(
        (REPO / "manifests/policy-objects" / CRD_FILES["Platform"]).read_text()
    )
    assert written == crd


def as_object(doc: dict[str, Any]) -> dict[str, Any]:
    meta = {**doc["metadata"], "uid": "u-1", "generation": 1, "managedFields": [{}]}
    return {**doc, "metadata": meta, "status": {"conditions": []}}


def shipped() -> list[dict[str, Any]]:
    return [d for p in sorted(POLICIES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]


def test_a_platform_object_is_mirrored_and_judged(tmp_path: Path) -> None:
    objects = [as_object(d) for d in shipped()]
    assert mirror(objects, tmp_path)
    text = (tmp_path / "platform-digitalhub.yaml").read_text()
    assert yaml.safe_load(text) == next(d for d in shipped() if d["kind"] == "Platform")
    judged = conditions(tmp_path)
    assert judged["Platform", "digitalhub"][0] is True
    # the Platform deleted: nothing loads, each RunPolicy says why
    mirror([o for o in objects if o["kind"] != "Platform"], tmp_path)
    judged = conditions(tmp_path)
    ok, message = judged["RunPolicy", "builds"]
    assert (
        not ok
        and message == 'spec.platform: Platform "digitalhub" is not defined (platforms: none)'
    )


def test_the_policy_webhook_checks_a_platform() -> None:
    platform_doc = next(d for d in shipped() if d["kind"] == "Platform")
    assert check_object(as_object(platform_doc), POLICIES).errors == []
    bad = json.loads(json.dumps(platform_doc))
    bad["spec"]["identities"] = "core"
    (error,) = check_object(as_object(bad), POLICIES).errors
    assert error == 'Platform digitalhub: spec.identities: expected a list, got "core"'


def test_a_run_policy_before_its_platform_is_admitted_with_a_warning(tmp_path: Path) -> None:
    """``kubectl apply -f policies/`` sends builds.yaml before platform.yaml."""
    checked = check_object(as_object(shipped()[0]), tmp_path)
    assert checked.label == "RunPolicy builds" and checked.errors == []
    assert (
        'RunPolicy builds: spec.platform: Platform "digitalhub" is not defined (platforms: none)'
        in checked.warnings
    )


def test_validate_policy_warns_of_an_inline_platform() -> None:
    """``kubectl apply`` of a RunPolicy in the older form: admitted, with what to move."""
    client = create_app({"policy_dir": str(POLICIES)}).test_client()
    run_policy_doc = next(
        d for d in shipped() if d["kind"] == "RunPolicy" and d["metadata"]["name"] == "digitalhub"
    )
    platform_doc = next(d for d in shipped() if d["kind"] == "Platform")
    inline = json.loads(json.dumps(run_policy_doc))
    inline["spec"]["platform"] = platform_doc["spec"]
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-8",
            "operation": "UPDATE",
            "name": "digitalhub",
            "kind": {"group": "runguard.io", "version": "v1", "kind": "RunPolicy"},
            "object": as_object(inline),
        },
    }
    response = client.post("/validate-policy", json=body).get_json()["response"]
    assert response["allowed"] is True
    assert response["warnings"] == [
        "runguard: RunPolicy digitalhub: spec.platform: written inline (the older form): "
        "Platform digitalhub holds the same keys: remove them and write platform: digitalhub here"
    ]
