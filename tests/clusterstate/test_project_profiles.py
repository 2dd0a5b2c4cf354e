"""A project's own profiles (ProjectProfile): read from the cluster view with their spec,
applied to the runs of their namespace only, winning over an installation-wide profile
of the same name there, and bounded by the governing RunPolicy in lint, in the policy
objects' admission check and in the engine (``profile.project-invalid``)."""

from __future__ import annotations

import json
import re
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import REPO, write
from harness.profiles import PROFILES, RUN_POLICY, cluster, project_profile, run

from webhook.clusterstate.model import DEVICE_CLAIMS, MAX_SPEC, PROJECT_PROFILES, meta_from_object
from webhook.clusterstate.table import decode_record, encode_record
from webhook.engine import evaluate, mutate
from webhook.engine.context import Context
from webhook.engine.rules.profile import (
    PROFILE_NOT_ALLOWED,
    PROFILE_PROJECT_INVALID,
    PROFILE_UNKNOWN,
)
from webhook.install import manifests
from webhook.policy.crd import CRD_FILES
from webhook.policy.lint import lint
from webhook.policy.loader import load_policy
from webhook.policy.mirror.objects import check_object
from webhook.policy.model import Policy

T4_SMALL = project_profile(
    "team-a",
    "2xt4-small",
    description="Two T4s, a few cores",
    resources={
        "requests": {"cpu": {"min": "1", "default": "2", "max": "4"}, "memory": "8Gi", "gpu": "2"},
        "limits": {"gpu": "2"},
    },
    nodeSelector={"nvidia.com/gpu.product": "Tesla-T4"},
    priorityClassName="low",
)
SHADOW = project_profile("team-a", "small", resources={"requests": {"cpu": "2", "memory": "4Gi"}})


CLUSTER = cluster(T4_SMALL, SHADOW, project_profile("team-b", "tiny"))


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    write(tmp_path, "runpolicy.yaml", RUN_POLICY)
    write(tmp_path, "profiles.yaml", PROFILES)
    return load_policy(tmp_path)


# --- the cluster view keeps a project profile's spec -----------------------------------


def test_the_cluster_view_keeps_a_project_profiles_spec_and_nothing_elses() -> None:
    meta = meta_from_object(T4_SMALL)
    assert (meta.kind, meta.namespace, meta.name) == ("ProjectProfile", "team-a", "2xt4-small")
    assert json.loads(meta.spec) == T4_SMALL["spec"]
    assert decode_record("ProjectProfile", encode_record(meta)) == meta
    secret = {"kind": "Secret", "metadata": {"name": "s", "namespace": "a"}, "spec": {"x": 1}}
    assert meta_from_object(secret).spec == ""
    huge = project_profile("team-a", "huge", description="x" * MAX_SPEC)
    assert meta_from_object(huge).spec == ""  # not kept: a run naming it is refused


# --- the engine ------------------------------------------------------------------------


def test_a_run_in_the_project_gets_its_profile(policy: Policy) -> None:
    decision = mutate(run("team-a", "2xt4-small"), policy, namespace="team-a", context=CLUSTER)
    assert decision.allowed, decision.violations
    spec = decision.object["spec"]
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "2"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-T4"}
    assert spec["priorityClassName"] == "low"
    assert any("profile team-a/2xt4-small applied" in w for w in decision.warnings)
    again = evaluate(decision.object, policy, namespace="team-a", context=CLUSTER)
    assert again.allowed, again.violations


def test_the_same_run_in_another_project_is_refused_with_that_projects_profiles(
    policy: Policy,
) -> None:
    decision = evaluate(run("team-b", "2xt4-small"), policy, namespace="team-b", context=CLUSTER)
    assert not decision.allowed
    assert [(v.rule, v.message) for v in decision.violations] == [
        (PROFILE_UNKNOWN, "profile '2xt4-small' does not exist (known: small, tiny)")
    ]


def test_the_projects_profile_wins_over_the_installations_of_the_same_name(
    policy: Policy,
) -> None:
    mine = mutate(run("team-a", "small"), policy, namespace="team-a", context=CLUSTER)
    theirs = mutate(run("team-b", "small"), policy, namespace="team-b", context=CLUSTER)
    requests = [d.object["spec"]["containers"][0]["resources"]["requests"] for d in (mine, theirs)]
    assert requests == [{"cpu": "2", "memory": "4Gi"}, {"cpu": "1", "memory": "2Gi"}]


def test_refusals_list_the_projects_profiles_too(policy: Policy) -> None:
    decision = evaluate(run("team-b", "a100"), policy, namespace="team-b", context=CLUSTER)
    assert [(v.rule, v.message) for v in decision.violations] == [
        (
            PROFILE_NOT_ALLOWED,
            "profile 'a100' is not for namespace 'team-b' (it may use: small, tiny)",
        )
    ]


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (
            {"resources": {"requests": {"cpu": {"min": "1", "default": "2", "max": "32"}}}},
            'spec.resources.requests.cpu.max: "32" is above the maximum "16"',
        ),
        (
            {"resources": {"limits": {"gpu": "4"}}},
            'spec.resources.limits["nvidia.com/gpu"]: "4" is above the maximum "2"',
        ),
        (
            {"priorityClassName": "system-cluster-critical"},
            'spec.priorityClassName: "system-cluster-critical" is not an allowed priority '
            "class (high, low)",
        ),
        (
            {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
            'spec.env[0].name: "NVIDIA_VISIBLE_DEVICES" selects devices on the node',
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "kubernetes.io/hostname", "namespaces": ["team-b"]}
                        ]
                    }
                }
            },
            "names other namespaces (team-b)",
        ),
        ({"resources": {"requests": {"cpu": "lots"}}}, "it does not load: spec.resources"),
    ],
    ids=["maximum", "gpu", "priority class", "device env", "other namespace", "unreadable"],
)
def test_a_project_profile_beyond_the_run_policy_is_refused_not_applied(
    policy: Policy, spec: dict[str, Any], why: str
) -> None:
    context = cluster(project_profile("team-a", "big", **spec))
    decision = mutate(run("team-a", "big"), policy, namespace="team-a", context=context)
    assert not [c for c in decision.mutations if c.rule == "profile.applied"]
    decision = evaluate(run("team-a", "big"), policy, namespace="team-a", context=context)
    (violation,) = [v for v in decision.violations if v.rule == PROFILE_PROJECT_INVALID]
    assert not decision.allowed
    assert violation.message.startswith("project profile 'big' of namespace 'team-a' is not")
    assert why in violation.message


def test_without_project_profiles_in_view_runs_name_the_installations(policy: Policy) -> None:
    for context in (Context(), cluster()):  # no view; a view with none (or CRD absent)
        decision = mutate(run("team-a", "small"), policy, namespace="team-a", context=context)
        assert decision.object["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


# --- lint and the policy objects' admission check --------------------------------------


def write_policy(tmp_path: Path) -> Path:
    directory = tmp_path / "policies"
    directory.mkdir()
    write(directory, "runpolicy.yaml", RUN_POLICY)
    write(directory, "profiles.yaml", PROFILES)
    return directory


BIG = """\
    apiVersion: runguard.io/v1
    kind: ProjectProfile
    metadata: {name: big, namespace: team-a}
    spec:
      resources:
        requests:
          cpu: "64"
          gpu: {min: "1", default: "1", max: "4"}
      priorityClassName: system-cluster-critical
    """


def test_lint_refuses_a_project_profile_beyond_the_run_policy(tmp_path: Path) -> None:
    directory = write_policy(tmp_path)
    write(directory, "big.yaml", BIG)
    report = lint(directory)
    where = f"{directory}/runpolicy.yaml"
    assert [str(e) for e in report.errors] == [
        f"{directory}/big.yaml:6: spec.resources.requests: counts 28 of device family nvidia, "
        f"above its maximum 14 ({where}:2)",
        f'{directory}/big.yaml:7: spec.resources.requests.cpu: "64" is above the maximum "16" '
        f"({where}:9)",
        f'{directory}/big.yaml:8: spec.resources.requests.gpu.max: "4" is above the maximum '
        f'"2" ({where}:9)',
        f'{directory}/big.yaml:9: spec.priorityClassName: "system-cluster-critical" is not an '
        f"allowed priority class (high, low) ({where}:2)",
    ]


def test_lint_keeps_a_project_profile_out_of_the_policy_and_names_a_clash(
    tmp_path: Path,
) -> None:
    directory = write_policy(tmp_path)
    write(directory, "mine.yaml", yaml_of(SHADOW))
    report = lint(directory)
    assert report.errors == []
    assert report.policy is not None and sorted(report.policy.first.profiles) == ["a100", "small"]
    assert [w.message for w in report.warnings] == [
        "also the name of an installation-wide profile: in namespace team-a this one wins"
    ]


def test_lint_skips_a_run_policy_excluding_the_namespace(tmp_path: Path) -> None:
    directory = write_policy(tmp_path)
    write(directory, "big.yaml", BIG.replace("team-a", "sandbox"))
    assert lint(directory).errors == []


def test_lint_refuses_a_name_twice_in_a_namespace(tmp_path: Path) -> None:
    directory = write_policy(tmp_path)
    write(directory, "a.yaml", yaml_of(SHADOW))
    write(directory, "b.yaml", yaml_of(SHADOW))
    (error,) = lint(directory).errors
    assert 'duplicate profile name "small" in namespace team-a' in error.message


def test_the_admission_check_says_what_lint_says(tmp_path: Path) -> None:
    directory = write_policy(tmp_path)
    big = project_profile("team-a", "big", resources={"requests": {"cpu": "64"}})
    assert check_object(big, directory).errors == [
        'ProjectProfile team-a/big: spec.resources.requests.cpu: "64" is above the maximum '
        '"16" (RunPolicy teams)'
    ]
    kept = project_profile("team-a", "kept", namespaceSelector={})
    assert check_object(kept, directory).errors == [
        'ProjectProfile team-a/kept: spec.namespaceSelector: unknown key "namespaceSelector" '
        '(did you mean "nodeSelector"?)'
    ]
    assert check_object(T4_SMALL, directory).errors == []
    assert check_object(SHADOW, directory).warnings == [
        "ProjectProfile team-a/small: metadata.name: also the name of an installation-wide "
        "profile: in namespace team-a this one wins"
    ]


def yaml_of(obj: dict[str, Any]) -> str:
    doc = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
    return json.dumps(doc)


# --- what ships ------------------------------------------------------------------------


def test_a_namespaces_admin_writes_them_its_viewers_read_them_edit_does_not_write() -> None:
    component = REPO / "manifests" / manifests.POLICY_OBJECTS_DIR
    docs = [d for d in yaml.safe_load_all((component / "rbac.yaml").read_text()) if d]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    admin, view = roles["runguard-project-profiles-admin"], roles["runguard-project-profiles-view"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in admin["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "admin"
    }
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "view"
    }
    (write_rule,) = admin["rules"]
    assert write_rule["resources"] == ["projectprofiles"] and "create" in write_rule["verbs"]
    (read_rule,) = view["rules"]
    assert sorted(read_rule["verbs"]) == ["get", "list", "watch"]
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    assert CRD_FILES["ProjectProfile"] in kustomization["resources"]
    chart = (REPO / "charts" / "runguard" / "templates" / "policy-objects.yaml").read_text()
    assert "runguard-project-profiles-admin" in chart and "projectprofiles.runguard.io" in chart


def test_the_policy_webhook_checks_them_in_every_namespace() -> None:
    (hook,) = manifests.policy_object_webhook()["webhooks"]
    assert [(r["resources"], r["scope"]) for r in hook["rules"]] == [
        (["runpolicies", "profiles", "platforms"], "Cluster"),
        (["projectprofiles"], "Namespaced"),
    ]
    assert "namespaceSelector" not in hook  # no namespace is left out


def test_the_watch_reads_them_whole_and_everything_else_as_metadata(tmp_path: Path) -> None:
    from webhook.clusterstate.api import LIST_ACCEPT
    from webhook.clusterstate.publication import create_directory
    from webhook.clusterstate.watch import KindWatch
    from webhook.clusterstate.writer import Publisher

    directory = create_directory(str(tmp_path), [DEVICE_CLAIMS, PROJECT_PROFILES])
    publisher = Publisher(directory, [DEVICE_CLAIMS, PROJECT_PROFILES])
    try:
        stop = threading.Event()
        whole = KindWatch(None, publisher.kinds[PROJECT_PROFILES], stop)  # type: ignore[arg-type]
        claims = KindWatch(None, publisher.kinds[DEVICE_CLAIMS], stop)  # type: ignore[arg-type]
        secrets = KindWatch(None, publisher.kinds["Secret"], stop)  # type: ignore[arg-type]
        # ResourceClaims are read whole too, of which only a Pod's claim's device requests
        # are kept (clusterstate.model.device_spec); every other kind, metadata.
        assert (whole.list_accept, claims.list_accept, secrets.list_accept) == (
            "application/json",
            "application/json",
            LIST_ACCEPT,
        )
    finally:
        publisher.close()


def test_explain_lists_the_projects_own_profiles_first_where_they_shadow(policy: Policy) -> None:
    """``runguard explain``'s choices for a team-a run: its project's profiles (the one
    named like an installation-wide profile replacing it, as in the engine), and one
    beyond the RunPolicy listed as not usable; team-b sees neither of team-a's."""
    from webhook.audit.explain import profile_choices

    big = project_profile("team-a", "huge", resources={"requests": {"memory": "512Gi"}})
    choices = {
        c.name: c for c in profile_choices(policy.first, cluster(T4_SMALL, SHADOW, big), "team-a")
    }
    assert set(choices) == {"2xt4-small", "a100", "huge", "small"}
    assert choices["2xt4-small"].scope == "this project (team-a)" and choices["2xt4-small"].usable
    assert choices["2xt4-small"].requests["cpu"] == "1..4 (default 2)"
    assert choices["small"].scope == "this project (team-a)"
    assert choices["small"].requests == {"cpu": "2", "memory": "4Gi"}
    assert choices["huge"].usable is False
    theirs = {c.name for c in profile_choices(policy.first, CLUSTER, "team-b")}
    assert theirs == {"a100", "small", "tiny"}


# --- what a project admin and her team read ---------------------------------------------


def test_explain_says_a_run_got_its_projects_own_profile(policy: Policy) -> None:
    """The engine names a project's profile ``team-a/2xt4-small``; explain's text says the
    run got the profile it named, as its JSON does, never "unknown, the default used"."""
    from webhook.audit.explain import explain, to_text

    found = explain(run("team-a", "2xt4-small"), policy, namespace="team-a", context=CLUSTER)
    assert found.to_dict()["profile"]["applied"] == "team-a/2xt4-small"
    (line,) = [line for line in to_text(found).splitlines() if line.startswith("  profile:")]
    assert line == (
        "  profile:    2xt4-small (named by the label dhcore/template; "
        "project team-a's own ProjectProfile)"
    )


def test_explain_lists_a_project_profile_beyond_the_run_policy_as_refused(
    policy: Policy,
) -> None:
    """Not under "kept to other namespaces" (it is this namespace's own): refused, with why."""
    from webhook.audit.explain import explain, to_text

    big = project_profile("team-a", "huge", resources={"requests": {"memory": "512Gi"}})
    broken = project_profile("team-a", "broken", resources={"requests": {"cpu": "lots"}})
    context = cluster(T4_SMALL, big, broken)
    found = explain(run("team-a", "small"), policy, namespace="team-a", context=context)
    text = to_text(found)
    assert "kept to other namespaces" not in text
    assert text.endswith(
        "  this project's own, refused by the RunPolicy (a run naming one is denied):\n"
        '    broken: does not load: spec.resources.requests.cpu: "lots" is not a quantity\n'
        '    huge: beyond the RunPolicy: spec.resources.requests.memory: "512Gi" is above the '
        'maximum "64Gi"'
    )
    choices = {c["name"]: c for c in found.to_dict()["profiles"]}
    assert choices["huge"]["usable"] is False and choices["huge"]["refused"].startswith("beyond")
    # a profile of another namespace's scope is still "kept to other namespaces"
    elsewhere = explain(run("team-b", "small"), policy, namespace="team-b", context=context)
    assert "  kept to other namespaces: a100" in to_text(elsewhere)


@pytest.mark.parametrize(
    "requests",
    ["cpu: lots", 'cpu: {min: "1", max: "4"}'],
    ids=["not a quantity", "a range without its default"],
)
def test_a_malformed_project_profile_is_reported_as_lint_reports_it(
    tmp_path: Path, policy: Policy, requests: str
) -> None:
    """The engine's refusal names the key as lint does, never the validator's internals
    (``cpu.function-after[check(), any]``)."""
    directory = write_policy(tmp_path)
    document = f"""\
        apiVersion: runguard.io/v1
        kind: ProjectProfile
        metadata: {{name: bad, namespace: team-a}}
        spec:
          resources:
            requests:
              {requests}
        """
    write(directory, "bad.yaml", document)
    (error,) = lint(directory).errors
    linted = str(error).split(": ", 1)[1]  # after file:line
    assert linted.startswith("spec.resources.requests.cpu")
    profile = yaml.safe_load(textwrap.dedent(document))
    profile["metadata"]["uid"] = "uid-bad"
    decision = evaluate(run("team-a", "bad"), policy, namespace="team-a", context=cluster(profile))
    (violation,) = [v for v in decision.violations if v.rule == PROFILE_PROJECT_INVALID]
    assert violation.message.endswith(f"it does not load: {linted}"), violation.message
    assert "function-after" not in violation.message


def test_the_docs_say_the_rule_a_run_naming_another_projects_profile_gets(
    policy: Policy,
) -> None:
    """A team-b run naming team-a's own profile: the engine's rule id is what every doc a
    user reads for that refusal says (never ``profile.not-allowed`` in one and
    ``profile.unknown`` in another)."""
    decision = evaluate(run("team-b", "2xt4-small"), policy, namespace="team-b", context=CLUSTER)
    (violation,) = decision.violations
    assert violation.message.startswith("profile '2xt4-small' does not exist (known: ")
    said = {}
    for doc in ("profiles.md", "project-profiles.md", "rules.md"):
        text = (REPO / "docs" / doc).read_text(encoding="utf-8")
        (paragraph,) = [p for p in re.split(r"\n\n|\n\|", text) if "exist outside" in p]
        said[doc] = set(re.findall(r"`(profile\.[a-z-]+)`", paragraph.split("(`profile.not")[0]))
    assert said == dict.fromkeys(said, {violation.rule}), said
    for doc in ("profiles.md", "project-profiles.md"):  # the example is the engine's words
        text = " ".join((REPO / "docs" / doc).read_text(encoding="utf-8").split())
        assert "profile '2xt4-small' does not exist (known: " in text
