"""runguard audit --rbac: who holds, in the run namespaces, verbs that reach the platform's
objects without any admission request; the roles and bindings as plain dicts (the real
apiserver's bootstrap roles are in tests/e2e/test_rbac_report.py). Its reports, as
PolicyReports and as OpenReports (valid under the published CRDs' schemas), and
``--write`` against a recorded CustomObjectsApi."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import yaml
from harness import REPO
from harness.openreports import crd, schema

from webhook.audit.openreports import OPEN_REPORTS
from webhook.audit.policyreport import POLICY_REPORTS
from webhook.audit.rbac import CLUSTER_WIDE
from webhook.audit.rbacdoors import DOORS
from webhook.audit.rbacreport import (
    Platform,
    RbacReport,
    platform_of,
    rbac_report,
    rbac_reports,
    shells_webhook_installed,
    to_rows,
    to_table,
)
from webhook.cli import audit_rbac, audit_write, cluster, main
from webhook.policy.loader import load_policy
from webhook.policy.model import Policy, build_run_policy

RBAC = "rbac.authorization.k8s.io/v1"
PLATFORM = Platform(
    exclusions=(frozenset({"kube-system", "platform"}),),
    secret_patterns=("sec-*-{labels[dhcore/run]}", "registry-credentials"),
    config_map_patterns=("init-config-map-{labels[dhcore/run]}",),
    identities=frozenset({"system:serviceaccount:platform:core", "group:platform-admins"}),
)
ALICE = {"kind": "User", "name": "alice"}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


NAMESPACES = [namespace(n) for n in ("team-a", "team-b", "kube-system", "platform")]


def rule(groups: list[str], resources: list[str], verbs: list[str], **names: Any) -> Any:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **names}


def cluster_role(name: str, *rules: Any, labels: Any = None, aggregate: Any = None) -> Any:
    role: dict[str, Any] = {"apiVersion": RBAC, "kind": "ClusterRole",
                            "metadata": {"name": name, "labels": labels or {}},
                            "rules": list(rules)}  # fmt: skip
    if aggregate is not None:
        role["aggregationRule"] = {"clusterRoleSelectors": aggregate}
    return role


def role(name: str, ns: str, *rules: Any) -> Any:
    return {"apiVersion": RBAC, "kind": "Role", "metadata": {"name": name, "namespace": ns},
            "rules": list(rules)}  # fmt: skip


def binding(name: str, ref: str, *subjects: Any, ns: str | None = None, kind: str = "") -> Any:
    """A RoleBinding in ``ns`` (a ClusterRoleBinding without), to ClusterRole ``ref``
    unless ``kind`` says Role."""
    obj: dict[str, Any] = {
        "apiVersion": RBAC,
        "kind": "RoleBinding" if ns else "ClusterRoleBinding",
        "metadata": {"name": name, **({"namespace": ns} if ns else {})},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind or "ClusterRole",
                    "name": ref},
        "subjects": list(subjects),
    }  # fmt: skip
    return obj


def found(objects: list[Any], shells: bool = False, **kw: Any) -> set[tuple[str, str, str]]:
    """(namespace, subject, door) of each unexpected finding."""
    report = rbac_report([*NAMESPACES, *objects], PLATFORM, shells=shells, **kw)
    return {(f.namespace, str(f.subject), f.door.id) for f in report.unexpected()}


def grants(objects: list[Any], door: str, shells: bool = False) -> list[str]:
    report = rbac_report([*NAMESPACES, *objects], PLATFORM, shells=shells)
    (finding,) = [f for f in report.findings if f.door.id == door]
    return [str(g) for g in finding.grant_list()]


def test_each_door_by_its_own_verbs_and_nothing_else() -> None:
    harmless = cluster_role(
        "harmless",
        rule([""], ["pods", "persistentvolumeclaims"], ["create", "get", "list"]),
        rule([""], ["configmaps"], ["create", "delete"]),  # created through admission, not read
        rule([""], ["pods/log", "services", "events"], ["get", "list", "watch"]),
        rule(["batch", "apps"], ["jobs", "deployments"], ["create", "update", "patch"]),
        # created through admission, never read (no platform account lives in team-a)
        rule([""], ["secrets"], ["create", "delete"]),
        # bindings of roles whose rules she holds already (no bind, no escalate)
        rule(["rbac.authorization.k8s.io"], ["rolebindings", "roles"], ["create", "update"]),
    )
    assert found([harmless, binding("b", "harmless", ALICE, ns="team-a")]) == set()
    cases = {
        "rbac.read-secrets": [rule([""], ["secrets"], ["list"])],
        "rbac.read-config-maps": [rule([""], ["configmaps"], ["get"])],
        "rbac.platform-data": [rule([""], ["configmaps"], ["patch"])],
        "rbac.connect": [rule([""], ["pods/exec"], ["create"])],
        "rbac.token": [rule([""], ["serviceaccounts/token"], ["create"])],
        "rbac.snapshot": [rule(["snapshot.storage.k8s.io"], ["volumesnapshots"], ["create"])],
        "rbac.grant": [rule(["rbac.authorization.k8s.io"], ["clusterroles"], ["bind"]),
                       rule(["rbac.authorization.k8s.io"], ["rolebindings"], ["create"])],
        "rbac.impersonate": [rule([""], ["serviceaccounts"], ["impersonate"])],
        "rbac.expose": [rule(["networking.k8s.io"], ["networkpolicies"], ["create"])],
    }  # fmt: skip
    for door, granted in cases.items():
        objects = [cluster_role("r", *granted), binding("b", "r", ALICE, ns="team-a")]
        assert found(objects) == {("team-a", "User alice", door)}, door
    assert {d.id for d in DOORS} == {*cases, "rbac.node-proxy"}


def test_wildcards_for_verbs_resources_and_groups() -> None:
    everything = cluster_role("all", rule(["*"], ["*"], ["*"]))
    rows = found([everything, binding("b", "all", ALICE, ns="team-a")])
    # a RoleBinding: every namespaced door, never the cluster-scoped node proxy
    assert rows == {("team-a", "User alice", d.id) for d in DOORS if d.id != "rbac.node-proxy"}
    assert grants([everything, binding("b", "all", ALICE, ns="team-a")], "rbac.read-secrets") == [
        "get,list,watch secrets"
    ]
    # */subresource matches that subresource of any resource; pods/* is no wildcard
    sub = cluster_role("sub", rule([""], ["*/exec", "pods/*"], ["create"]))
    assert grants([sub, binding("b", "sub", ALICE, ns="team-a")], "rbac.connect") == [
        "create pods/exec"
    ]
    group = cluster_role("group", rule(["*"], ["ingresses"], ["update"]))
    # networking.k8s.io and the old extensions group, both matched by *, said once
    assert grants([group, binding("b", "group", ALICE, ns="team-a")], "rbac.expose") == [
        "update ingresses"
    ]
    wrong_group = cluster_role("apps", rule(["apps"], ["secrets", "pods/exec"], ["*"]))
    assert found([wrong_group, binding("b", "apps", ALICE, ns="team-a")]) == set()


def test_aggregated_cluster_roles_are_resolved_to_a_fixed_point() -> None:
    """As the apiserver bootstraps them: edit aggregates aggregate-to-edit and view (which
    aggregates aggregate-to-view); the stored rules of edit may still be empty."""
    to_view = {"rbac.authorization.k8s.io/aggregate-to-view": "true"}
    to_edit = {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}
    objects = [
        cluster_role("edit", aggregate=[{"matchLabels": to_edit}]),
        cluster_role("view", labels=to_edit, aggregate=[{"matchLabels": to_view}]),
        cluster_role("system:aggregate-to-view", rule([""], ["pods"], ["get"]), labels=to_view),
        cluster_role(
            "system:aggregate-to-edit",
            rule([""], ["secrets"], ["get", "list", "watch"]),
            labels=to_edit,
        ),
        cluster_role(
            "custom-view",
            rule([""], ["serviceaccounts/token"], ["create"]),
            labels=to_view,
        ),
        cluster_role("unselected", rule([""], ["pods/exec"], ["create"]), labels={"other": "true"}),
        binding("b", "edit", ALICE, ns="team-a"),
    ]
    assert found(objects) == {
        ("team-a", "User alice", "rbac.read-secrets"),
        ("team-a", "User alice", "rbac.token"),  # through view, aggregated into edit
    }
    # matchExpressions; an operator the controller cannot read picks nothing
    objects[0]["aggregationRule"]["clusterRoleSelectors"] = [
        {"matchExpressions": [{"key": "other", "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": "other", "operator": "Gt", "values": ["1"]}]},
    ]
    assert found(objects) == {("team-a", "User alice", "rbac.connect")}
    # an empty selector picks every ClusterRole, as the aggregation controller reads it
    objects[0]["aggregationRule"]["clusterRoleSelectors"] = [{}]
    assert {door for _, _, door in found(objects)} == {
        "rbac.read-secrets",
        "rbac.token",
        "rbac.connect",
    }


def test_resource_names_narrow_to_the_platforms_names() -> None:
    def narrowed(resource: str, verb: str, names: list[str]) -> set[tuple[str, str, str]]:
        r = cluster_role("r", rule([""], [resource], [verb], resourceNames=names))
        return found([r, binding("b", "r", ALICE, ns="team-a")])

    # a pattern's placeholder is any label value, * any text
    assert narrowed("configmaps", "update", ["init-config-map-r1"]) == {
        ("team-a", "User alice", "rbac.platform-data")
    }
    assert narrowed("configmaps", "update", ["my-settings"]) == set()
    assert narrowed("secrets", "patch", ["sec-train-r7"]) == {
        ("team-a", "User alice", "rbac.platform-data")
    }
    assert narrowed("secrets", "get", ["registry-credentials", "mine"]) == {
        ("team-a", "User alice", "rbac.read-secrets")
    }
    assert narrowed("secrets", "get", ["mine"]) == set()
    # the names a grant is narrowed to are said
    r = cluster_role("r", rule([""], ["secrets"], ["get"], resourceNames=["registry-credentials",
                                                                           "mine"]))  # fmt: skip
    assert grants([r, binding("b", "r", ALICE, ns="team-a")], "rbac.read-secrets") == [
        "get secrets[registry-credentials]"
    ]
    # names narrow no other door: a connection into one named Pod is still a door
    assert narrowed("pods/exec", "create", ["some-pod"]) == {
        ("team-a", "User alice", "rbac.connect")
    }
    # without platform names for ConfigMaps, no ConfigMap is the platform's data
    bare = Platform(exclusions=(frozenset(),))
    objects = [namespace("n"), cluster_role("r", rule([""], ["configmaps"], ["update"])),
               binding("b", "r", ALICE, ns="n")]  # fmt: skip
    assert rbac_report(objects, bare, shells=False).findings == []


def test_subjects_groups_and_service_accounts() -> None:
    r = cluster_role("r", rule([""], ["secrets"], ["get"]))
    objects = [
        r,
        binding(
            "b",
            "r",
            {"kind": "Group", "name": "team-a-devs", "apiGroup": "rbac.authorization.k8s.io"},
            {"kind": "ServiceAccount", "name": "runner"},  # no namespace: the binding's
            {"kind": "ServiceAccount", "name": "ci", "namespace": "tools"},
            {"kind": "Group", "name": "system:serviceaccounts:team-a"},
            ns="team-a",
        ),
    ]
    assert found(objects) == {
        ("team-a", "Group team-a-devs", "rbac.read-secrets"),
        ("team-a", "ServiceAccount team-a/runner", "rbac.read-secrets"),
        ("team-a", "ServiceAccount tools/ci", "rbac.read-secrets"),
        ("team-a", "Group system:serviceaccounts:team-a", "rbac.read-secrets"),
    }
    rows = to_rows(rbac_report([*NAMESPACES, *objects], PLATFORM, shells=False).findings)
    assert {"kind": "ServiceAccount", "name": "ci", "namespace": "tools"} in [
        row["subject"] for row in rows
    ]


def test_a_role_and_its_binding_in_the_same_namespace_only() -> None:
    objects = [
        role("reader", "team-a", rule([""], ["secrets"], ["watch"])),
        binding("b", "reader", ALICE, ns="team-a", kind="Role"),
        binding("b", "reader", {"kind": "User", "name": "bob"}, ns="team-b", kind="Role"),
    ]
    assert found(objects) == {("team-a", "User alice", "rbac.read-secrets")}


def test_cluster_role_bindings_are_reported_once_for_every_namespace() -> None:
    proxy = cluster_role("proxy", rule([""], ["nodes/proxy"], ["get"]),
                         rule([""], ["users", "groups"], ["impersonate"]),
                         rule([""], ["secrets"], ["list"]))  # fmt: skip
    rows = found([proxy, binding("crb", "proxy", ALICE)])
    assert rows == {
        (CLUSTER_WIDE, "User alice", "rbac.node-proxy"),
        (CLUSTER_WIDE, "User alice", "rbac.impersonate"),
        (CLUSTER_WIDE, "User alice", "rbac.read-secrets"),
    }
    # bound in a namespace only, a cluster-scoped resource is granted nowhere
    assert found([proxy, binding("rb", "proxy", ALICE, ns="team-a")]) == {
        ("team-a", "User alice", "rbac.read-secrets")
    }
    # a ClusterRoleBinding cannot name a Role
    objects = [role("r", "team-a", rule(["*"], ["*"], ["*"])),
               binding("crb", "r", ALICE, kind="Role")]  # fmt: skip
    assert found(objects) == set()


def test_excluded_namespaces_are_not_run_namespaces() -> None:
    r = cluster_role("r", rule([""], ["secrets"], ["get"]))
    objects = [
        r,
        *(binding("b", "r", ALICE, ns=ns) for ns in ("team-a", "kube-system", "platform")),
    ]
    assert found(objects) == {("team-a", "User alice", "rbac.read-secrets")}
    # a namespace one RunPolicy excludes and another governs is a run namespace
    two = Platform(exclusions=(frozenset({"platform"}), frozenset({"kube-system"})))
    report = rbac_report([*NAMESPACES, *objects], two, shells=False)
    assert report.namespaces == ["kube-system", "platform", "team-a", "team-b"]
    assert {f.namespace for f in report.findings} == {"kube-system", "platform", "team-a"}
    # -n: that namespace only, none when it is excluded
    assert found(objects, namespace="team-b") == set()
    assert rbac_report(objects, PLATFORM, shells=False, namespace="kube-system").namespaces == []
    # without Namespace objects (a file of bindings only), the bindings' namespaces
    bare = rbac_report(objects, PLATFORM, shells=False)
    assert bare.namespaces == ["team-a"]


def test_connections_only_while_the_shells_webhook_is_off() -> None:
    r = cluster_role("r", rule([""], ["pods/attach", "pods/portforward", "pods/proxy",
                                      "services/proxy"], ["get", "create"]))  # fmt: skip
    objects = [r, binding("b", "r", ALICE, ns="team-a")]
    report = rbac_report([*NAMESPACES, *objects], PLATFORM, shells=False)
    (finding,) = report.findings
    assert finding.note is not None and "shells webhook is off" in finding.note
    assert "shells webhook is off" in to_table(report.findings)
    assert to_rows(report.findings)[0]["note"] == finding.note
    assert rbac_report([*NAMESPACES, *objects], PLATFORM, shells=True).findings == []
    config = {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "runguard-shells"}}
    assert shells_webhook_installed([{"kind": "List", "items": [config]}])
    assert not shells_webhook_installed([{**config, "metadata": {"name": "runguard"}}])


def test_cluster_admins_components_and_the_platform_are_expected() -> None:
    everything = cluster_role("cluster-admin", rule(["*"], ["*"], ["*"]))
    secrets = cluster_role("secrets", rule([""], ["secrets"], ["get"]))
    objects = [
        everything,
        secrets,
        binding("admins", "cluster-admin", {"kind": "User", "name": "root"},
                {"kind": "Group", "name": "system:masters"}),
        binding("kcm", "secrets", {"kind": "User", "name": "system:kube-controller-manager"},
                {"kind": "ServiceAccount", "name": "x", "namespace": "kube-system"},
                {"kind": "Group", "name": "system:nodes"}),
        binding("core", "secrets", {"kind": "ServiceAccount", "name": "core",
                                    "namespace": "platform"},
                {"kind": "Group", "name": "platform-admins"}, ns="team-a"),
        # everyone: never expected
        binding("all", "secrets", {"kind": "Group", "name": "system:authenticated"},
                {"kind": "User", "name": "system:anonymous"}),
        # an admin of one namespace is no cluster admin
        binding("ns-admin", "cluster-admin", ALICE, ns="team-a"),
    ]  # fmt: skip
    report = rbac_report([*NAMESPACES, *objects], PLATFORM, shells=True)
    reasons = {str(f.subject): f.expected for f in report.findings}
    assert reasons == {
        "User root": "cluster admin",
        "Group system:masters": "cluster admin",
        "User system:kube-controller-manager": "Kubernetes component",
        "ServiceAccount kube-system/x": "Kubernetes component",
        "Group system:nodes": "Kubernetes component",
        "ServiceAccount platform/core": "platform identity",
        "Group platform-admins": "platform identity",
        "Group system:authenticated": None,
        "User system:anonymous": None,
        "User alice": None,
    }
    # a cluster admin's grants are expected whatever binding gives them
    objects.append(binding("more", "secrets", {"kind": "User", "name": "root"}, ns="team-a"))
    report = rbac_report([*NAMESPACES, *objects], PLATFORM, shells=True)
    assert [f.expected for f in report.findings if str(f.subject) == "User root"] == [
        "cluster admin"
    ] * len([f for f in report.findings if str(f.subject) == "User root"])
    assert ("team-a", "User root") in {(f.namespace, str(f.subject)) for f in report.findings}


def test_platform_of_reads_every_run_policy() -> None:
    policy = load_policy(REPO / "policies")
    platform = platform_of(policy)
    assert platform.exclusions == tuple(p.exclude_namespaces for p in policy.run_policies)
    assert "registry-credentials" in platform.secret_patterns
    assert "init-config-map-{labels[dhcore/run]}" in platform.config_map_patterns
    assert {
        "system:serviceaccount:digitalhub:core",
        "system:serviceaccount:digitalhub:kuberay-operator",
        "group:system:masters",
        "system:serviceaccount:kube-system:job-controller",
    } <= platform.identities
    operator = build_run_policy(
        {"spec": {"platform": {"identities": ["serviceaccount:p:core"], "operators": [
            {"identity": "mpi", "kinds": ["kubeflow.org/MPIJob"],
             "configMaps": ["{labels[mlrun/job]}-config"]}]}}},
        [],
    )  # fmt: skip
    platform = platform_of(Policy.of(operator))
    assert platform.config_map_patterns == ("{labels[mlrun/job]}-config",)
    assert {"system:serviceaccount:p:core", "mpi"} <= platform.identities


def test_platform_of_knows_where_the_platforms_accounts_live() -> None:
    policy = load_policy(REPO / "policies")
    assert "digitalhub" in platform_of(policy).account_namespaces
    bare = build_run_policy({"spec": {"platform": {"identities": ["group:ops", "alice"]}}}, [])
    assert platform_of(Policy.of(bare)).account_namespaces == frozenset()


def test_creating_secrets_is_a_token_where_a_platform_account_lives() -> None:
    """A Secret of type kubernetes.io/service-account-token for an account is filled by
    the token controller: ``create secrets`` where the platform's account lives is a
    token for it (runguard refuses one naming the account, in namespaces it looks at)."""
    platform = Platform(exclusions=PLATFORM.exclusions, account_namespaces=frozenset({"team-a"}))
    create = cluster_role("r", rule([""], ["secrets"], ["create"]))
    objects = [*NAMESPACES, create, binding("a", "r", ALICE, ns="team-a"),
               binding("b", "r", {"kind": "User", "name": "bob"}, ns="team-b")]  # fmt: skip
    report = rbac_report(objects, platform, shells=True)
    assert [(f.namespace, str(f.subject), f.door.id, f.grant_text()) for f in report.findings] == [
        ("team-a", "User alice", "rbac.token", "create secrets")
    ]
    # everywhere, so where the account lives too
    everywhere = [*NAMESPACES, create, binding("c", "r", {"kind": "User", "name": "bob"})]
    assert {(f.namespace, f.door.id) for f in rbac_report(everywhere, platform, shells=True)
            .findings} == {("*", "rbac.token")}  # fmt: skip
    assert not rbac_report(everywhere, PLATFORM, shells=True).findings  # no account at all


def test_reading_the_platforms_config_maps_by_their_names() -> None:
    def reads(*names: str) -> set[tuple[str, str, str]]:
        narrowed = {"resourceNames": list(names)} if names else {}
        r = cluster_role("r", rule([""], ["configmaps"], ["get", "watch"], **narrowed))
        return found([r, binding("b", "r", ALICE, ns="team-a")])

    door = {("team-a", "User alice", "rbac.read-config-maps")}
    assert reads() == door and reads("init-config-map-r1", "mine") == door
    assert reads("mine") == set()
    # without platform names for ConfigMaps, reading them reads none of the platform's
    bare = Platform(exclusions=(frozenset(),))
    objects = [namespace("n"), cluster_role("r", rule([""], ["configmaps"], ["list"])),
               binding("b", "r", ALICE, ns="n")]  # fmt: skip
    assert rbac_report(objects, bare, shells=True).findings == []


def test_snapshots_of_volumes() -> None:
    group = "snapshot.storage.k8s.io"
    snapshots = cluster_role("s", rule([group], ["volumesnapshots"], ["create"]))
    contents = cluster_role("c", rule([group], ["volumesnapshotcontents"], ["create"]))
    assert found([snapshots, binding("b", "s", ALICE, ns="team-a")]) == {
        ("team-a", "User alice", "rbac.snapshot")
    }
    # a content (of any volume, by its handle) is cluster-scoped: a RoleBinding grants none
    assert found([contents, binding("b", "c", ALICE, ns="team-a")]) == set()
    assert found([contents, binding("b", "c", ALICE)]) == {("*", "User alice", "rbac.snapshot")}


RBAC_GROUP = "rbac.authorization.k8s.io"


@pytest.mark.parametrize(
    ("rules", "door"),
    [
        ([rule([RBAC_GROUP], ["clusterroles"], ["bind"], resourceNames=["admin"]),
          rule([RBAC_GROUP], ["rolebindings"], ["create"])], True),
        ([rule([RBAC_GROUP], ["roles"], ["escalate", "update"])], True),
        ([rule([RBAC_GROUP], ["roles"], ["*"])], True),
        ([rule([RBAC_GROUP], ["clusterroles"], ["bind"])], False),  # no binding written
        ([rule([RBAC_GROUP], ["roles"], ["escalate"])], False),  # no role written
        ([rule([RBAC_GROUP], ["rolebindings", "roles"], ["create", "update", "patch"])], False),
        # a ClusterRole written only cluster-wide: a RoleBinding's escalate writes none
        ([rule([RBAC_GROUP], ["clusterroles"], ["escalate", "create"])], False),
    ],
    ids=["bind", "escalate", "roles-star", "bind-alone", "escalate-alone", "admin-like",
         "cluster-roles-in-a-namespace"],
)  # fmt: skip
def test_a_subject_that_may_grant_itself_rules(rules: list[Any], door: bool) -> None:
    """``rbac.grant``: bind with a binding written, or escalate with a role written, is
    any door at all (the grants may come from several bindings of the namespace)."""
    objects = [cluster_role("r", *rules), binding("b", "r", ALICE, ns="team-a")]
    assert found(objects) == ({("team-a", "User alice", "rbac.grant")} if door else set())
    split_ = [cluster_role(f"r{i}", r) for i, r in enumerate(rules)]
    split_ += [binding(f"b{i}", f"r{i}", ALICE, ns="team-a") for i in range(len(rules))]
    assert found(split_) == found(objects)


def edit_objects() -> list[Any]:
    r = cluster_role("r", rule([""], ["secrets"], ["get", "update"]),
                     rule([""], ["configmaps"], ["update"]),
                     rule([""], ["nodes/proxy"], ["get"]))  # fmt: skip
    return [*NAMESPACES, r, binding("b", "r", ALICE, ns="team-a"),
            binding("crb", "r", {"kind": "User", "name": "ops"})]  # fmt: skip


def test_policy_reports_a_cluster_report_and_one_per_run_namespace() -> None:
    report = rbac_report(edit_objects(), PLATFORM, shells=False)
    cluster, *namespaced = rbac_reports(POLICY_REPORTS, report, now=1700000000.5)
    assert (
        cluster["kind"] == "ClusterPolicyReport" and cluster["metadata"]["name"] == "runguard-rbac"
    )
    assert "namespace" not in cluster["metadata"]
    assert [r["metadata"]["namespace"] for r in namespaced] == ["team-a", "team-b"]
    team_a, team_b = namespaced
    assert team_b["results"] == [] and team_b["summary"]["fail"] == 0  # replaces an old one
    assert team_a["scope"] == {"apiVersion": "v1", "kind": "Namespace", "name": "team-a"}
    assert {r["rule"] for r in team_a["results"]} == {"rbac.read-secrets", "rbac.platform-data"}
    result = next(r for r in team_a["results"] if r["rule"] == "rbac.read-secrets")
    assert result["result"] == "fail" and result["severity"] == "high"
    assert result["resources"] == [{"apiVersion": RBAC, "kind": "RoleBinding", "name": "b",
                                    "namespace": "team-a"}]  # fmt: skip
    assert result["properties"] == {"subject": "User alice", "grants": "get secrets"}
    assert result["timestamp"] == {"seconds": 1700000000, "nanos": 500000000}
    assert all(isinstance(v, str) for r in team_a["results"] for v in r["properties"].values())
    assert {r["rule"] for r in cluster["results"]} == {
        "rbac.read-secrets", "rbac.platform-data", "rbac.node-proxy"
    }  # fmt: skip
    assert cluster["summary"]["fail"] == 3
    # expected subjects, asked for: skip results saying why
    objects = [*edit_objects(), binding("m", "r", {"kind": "Group", "name": "system:masters"})]
    report = rbac_report(objects, PLATFORM, shells=False)
    cluster = rbac_reports(POLICY_REPORTS, report, include_expected=True)[0]
    skipped = [r for r in cluster["results"] if r["result"] == "skip"]
    assert len(skipped) == 3 and cluster["summary"]["skip"] == 3
    assert {r["properties"]["expected"] for r in skipped} == {"cluster admin"}
    assert rbac_reports(POLICY_REPORTS, report)[0]["summary"]["skip"] == 0


REPORT_LABELS = {"app.kubernetes.io/managed-by": "runguard", "runguard.io/report": "rbac"}
NO_RESULTS = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}


def test_open_reports_a_cluster_report_and_one_per_run_namespace() -> None:
    report = rbac_report(edit_objects(), PLATFORM, shells=False)
    cluster_report, team_a, team_b = rbac_reports(OPEN_REPORTS, report, now=1700000000.5)
    when = {"seconds": 1700000000, "nanos": 500000000}
    via = [{"apiVersion": RBAC, "kind": "RoleBinding", "name": "b", "namespace": "team-a"}]
    about = {"policy": "runguard-rbac", "result": "fail", "category": "RBAC", "severity": "high",
             "source": "runguard", "timestamp": when, "scored": True, "resources": via}  # fmt: skip
    assert team_a == {
        "apiVersion": "openreports.io/v1alpha1",
        "kind": "Report",
        "metadata": {"name": "runguard-rbac", "namespace": "team-a", "labels": REPORT_LABELS},
        "source": "runguard",
        "scope": {"apiVersion": "v1", "kind": "Namespace", "name": "team-a"},
        "summary": {**NO_RESULTS, "fail": 2},
        "results": [
            {
                **about,
                "rule": "rbac.read-secrets",
                "message": "User alice may get secrets in this namespace: read Secrets",
                "properties": {"subject": "User alice", "grants": "get secrets"},
            },
            {
                **about,
                "rule": "rbac.platform-data",
                "message": "User alice may update configmaps,secrets in this namespace: change "
                "the data of platform-named ConfigMaps and Secrets",
                "properties": {"subject": "User alice", "grants": "update configmaps,secrets"},
            },
        ],
    }
    assert team_b == {  # nothing found: written, it replaces what an older report said
        "apiVersion": "openreports.io/v1alpha1",
        "kind": "Report",
        "metadata": {"name": "runguard-rbac", "namespace": "team-b", "labels": REPORT_LABELS},
        "source": "runguard",
        "scope": {"apiVersion": "v1", "kind": "Namespace", "name": "team-b"},
        "summary": NO_RESULTS,
        "results": [],
    }
    assert {k: v for k, v in cluster_report.items() if k != "results"} == {
        "apiVersion": "openreports.io/v1alpha1",
        "kind": "ClusterReport",
        "metadata": {"name": "runguard-rbac", "labels": REPORT_LABELS},
        "source": "runguard",
        "summary": {**NO_RESULTS, "fail": 3},
    }
    assert {r["rule"] for r in cluster_report["results"]} == {
        "rbac.read-secrets", "rbac.platform-data", "rbac.node-proxy"
    }  # fmt: skip


def test_both_formats_carry_the_same_rbac_results() -> None:
    """Only the object around the results differs: apiVersion, kind, and OpenReports'
    own ``source``."""
    objects = [*edit_objects(), binding("m", "r", {"kind": "Group", "name": "system:masters"})]
    report = rbac_report(objects, PLATFORM, shells=False)
    for include_expected in (False, True):
        policy_reports = rbac_reports(
            POLICY_REPORTS, report, include_expected=include_expected, now=9.0
        )
        open_reports = rbac_reports(
            OPEN_REPORTS, report, include_expected=include_expected, now=9.0
        )
        assert [(r["apiVersion"], r["kind"]) for r in policy_reports] == [
            ("wgpolicyk8s.io/v1alpha2", "ClusterPolicyReport"),
            ("wgpolicyk8s.io/v1alpha2", "PolicyReport"),
            ("wgpolicyk8s.io/v1alpha2", "PolicyReport"),
        ]
        assert [(r["apiVersion"], r["kind"]) for r in open_reports] == [
            ("openreports.io/v1alpha1", "ClusterReport"),
            ("openreports.io/v1alpha1", "Report"),
            ("openreports.io/v1alpha1", "Report"),
        ]
        assert all("source" not in r for r in policy_reports)  # not in wgpolicyk8s' format
        around = ("apiVersion", "kind", "source")
        assert [{k: v for k, v in r.items() if k not in around} for r in open_reports] == [
            {k: v for k, v in r.items() if k not in around} for r in policy_reports
        ]


def test_open_reports_validate_against_the_published_schemas() -> None:
    """Fails, skips (expected subjects, with why) and notes (the shells webhook off),
    and an empty report: all valid, nothing the apiserver would prune."""
    connect = cluster_role("connect", rule([""], ["pods/exec"], ["create"]))
    objects = [*edit_objects(), binding("m", "r", {"kind": "Group", "name": "system:masters"}),
               connect, binding("x", "connect", ALICE, ns="team-a")]  # fmt: skip
    report = rbac_report(objects, PLATFORM, shells=False)
    reports = rbac_reports(OPEN_REPORTS, report, include_expected=True, now=1700000000.5)
    cluster_report, *namespaced = reports
    results = [r for each in reports for r in each["results"]]
    assert {r["result"] for r in results} == {"fail", "skip"}
    assert any("expected" in r["properties"] for r in results)
    assert any("note" in r["properties"] for r in results)
    assert [] in [r["results"] for r in namespaced]
    for each, name in ((cluster_report, "clusterreports"), *((r, "reports") for r in namespaced)):
        typed = schema(crd(name))
        jsonschema.validate(each, typed)
        assert set(each) <= set(typed["properties"])
        fields = typed["properties"]["results"]["items"]["properties"]
        assert all(set(r) <= set(fields) for r in each["results"])
    # The schema checks what it types: a result outside its enum is refused.
    (team_a,) = [r for r in namespaced if r["metadata"]["namespace"] == "team-a"]
    bad = {**team_a, "results": [{**team_a["results"][0], "result": "denied"}]}
    with pytest.raises(jsonschema.ValidationError, match="denied"):
        jsonschema.validate(bad, schema(crd("reports")))


def test_the_table_and_json_rows() -> None:
    report = rbac_report(edit_objects(), PLATFORM, shells=False)
    lines = to_table(report.findings).splitlines()
    assert lines[0].split() == ["NAMESPACE", "SUBJECT", "DOOR", "GRANTS", "VIA"]
    assert [line.split()[0] for line in lines[1:]] == ["*", "*", "*", "team-a", "team-a"]
    assert "update configmaps,secrets" in lines[2]
    assert lines[4].endswith("RoleBinding/b -> ClusterRole/r")
    rows = to_rows(report.findings)
    assert rows[0] == {
        "namespace": "*",
        "subject": {"kind": "User", "name": "ops"},
        "door": "rbac.read-secrets",
        "title": "read Secrets",
        "grants": ["get secrets"],
        "via": ["ClusterRoleBinding/crb -> ClusterRole/r"],
        "expected": None,
        "note": None,
    }


# --- the command, offline -----------------------------------------------------------------


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": edit_objects()}))
    return path


def test_cli_reads_kubectl_output(state_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["audit", "--rbac", "-p", str(REPO / "policies"), "--cluster-state", str(state_file)]
    assert main([*args, "-o", "json"]) == 1  # findings
    rows = json.loads(capsys.readouterr().out)
    assert {(r["namespace"], r["subject"]["name"], r["door"]) for r in rows} == {
        ("*", "ops", "rbac.read-secrets"),
        ("*", "ops", "rbac.platform-data"),
        ("*", "ops", "rbac.node-proxy"),
        ("team-a", "alice", "rbac.read-secrets"),
        ("team-a", "alice", "rbac.platform-data"),
    }
    assert main([*args, "-n", "team-b", "-o", "policyreport"]) == 1  # the cluster-wide ones
    reports = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [r["kind"] for r in reports] == ["ClusterPolicyReport", "PolicyReport"]
    assert main([*args, "-n", "team-b"]) == 1
    out, err = capsys.readouterr()
    assert "User ops" in out and "User alice" not in out and "3 findings" in err


def test_cli_exit_0_without_findings_and_expected_on_demand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rbac.yaml"
    masters = {"kind": "Group", "name": "system:masters"}
    admin = [cluster_role("cluster-admin", rule(["*"], ["*"], ["*"])),
             binding("admins", "cluster-admin", masters)]  # fmt: skip
    path.write_text(yaml.safe_dump_all([namespace("team-a"), *admin]))
    args = ["audit", "--rbac", "-p", str(REPO / "policies"), "--cluster-state", str(path)]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [out.splitlines()[0]] and "expected, not shown" in err
    assert main([*args, "--include-expected", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["expected"] for r in rows} == {"cluster admin"}
    # shells on, by flag or by its webhook configuration in the files
    edit = [cluster_role("e", rule([""], ["pods/exec"], ["create"])),
            binding("b", "e", ALICE, ns="team-a")]  # fmt: skip
    path.write_text(yaml.safe_dump_all([namespace("team-a"), *edit]))
    assert main(args) == 1
    assert main([*args, "--shells", "on"]) == 0
    shells = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "runguard-shells"},
    }
    path.write_text(yaml.safe_dump_all([namespace("team-a"), *edit, shells]))
    assert main(args) == 0
    assert main([*args, "--shells", "off"]) == 1


def test_cli_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies = ["-p", str(REPO / "policies")]
    assert main(["audit", "--rbac", *policies, "--cluster-state", str(tmp_path / "none")]) == 2
    assert "--cluster-state" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("kind: [")
    assert main(["audit", "--rbac", *policies, "--cluster-state", str(tmp_path / "bad.yaml")]) == 2
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(namespace("a")))
    for extra in (["-o", "summary"], ["--write"], ["--policy-objects"]):
        assert main(["audit", "--rbac", *policies, "--cluster-state", str(ok), *extra]) == 2
    assert main(["audit", *policies, "--shells", "on"]) == 2  # --rbac's options alone
    assert "go with --rbac" in capsys.readouterr().err


def test_cli_prints_open_reports(state_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["audit", "--rbac", "-p", str(REPO / "policies"), "--cluster-state", str(state_file)]
    assert main([*args, "-n", "team-b", "-o", "openreports"]) == 1  # the cluster-wide ones
    reports = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(r["apiVersion"], r["kind"], r["source"]) for r in reports] == [
        ("openreports.io/v1alpha1", "ClusterReport", "runguard"),
        ("openreports.io/v1alpha1", "Report", "runguard"),
    ]
    assert reports[1]["metadata"]["namespace"] == "team-b" and reports[1]["results"] == []
    assert reports[0]["summary"]["fail"] == 3
    # --reports says what --write writes: alone, it is a mistake
    assert main([*args, "-o", "openreports", "--reports", "openreports"]) == 2
    assert "--reports goes with --write" in capsys.readouterr().err


# --- --write, against a recorded CustomObjectsApi ------------------------------------------


class Answer:
    """An apply's answer, read and released by ``release``."""

    def drain_conn(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class RecordedReports:
    """``kubernetes.client.CustomObjectsApi`` as ``--write`` calls it: each apply
    recorded by (apiVersion, plural, namespace, name); the kinds ``missing`` by format
    left out of discovery; a 404 to every apply of the group ``gone`` (its CRDs deleted
    since discovery)."""

    def __init__(self) -> None:
        self.applied: dict[tuple[str, str, str | None, str], dict[str, Any]] = {}
        self.missing: dict[str, list[str]] = {}
        self.gone = ""

    def __call__(self, _api_client: Any) -> RecordedReports:
        return self

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any,
        **options: Any,
    ) -> Answer:  # fmt: skip
        return self.apply(f"{group}/{version}", plural, namespace, name, body, options)

    def patch_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, body: Any, **options: Any
    ) -> Answer:
        return self.apply(f"{group}/{version}", plural, None, name, body, options)

    def apply(
        self, api: str, plural: str, namespace: str | None, name: str, body: Any,
        options: dict[str, Any],
    ) -> Answer:  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        if api.startswith(self.gone + "/"):
            raise ApiException(status=404, reason="Not Found")
        assert options["_content_type"] == "application/apply-patch+yaml" and options["force"]
        assert options["field_manager"] == "runguard-audit"
        self.applied[api, plural, namespace, name] = body
        return Answer()


NOW = 1700000000.5


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> RecordedReports:
    """A cluster holding ``edit_objects()``: connecting, listing, discovery and the
    applies faked, the rest of ``runguard audit --rbac --write`` as it runs."""
    reports = RecordedReports()

    @contextlib.contextmanager
    def connect(_args: Any) -> Iterator[object]:
        yield object()

    monkeypatch.setattr(cluster, "connect", connect)
    monkeypatch.setattr(audit_rbac, "_rbac_objects", lambda _client: edit_objects())
    monkeypatch.setattr(audit_rbac, "time", SimpleNamespace(time=lambda: NOW))
    monkeypatch.setattr(
        audit_write, "missing_kinds", lambda _client, form: reports.missing.get(form.name, [])
    )
    monkeypatch.setattr("kubernetes.client.CustomObjectsApi", reports)
    return reports


WRITE = ["audit", "--rbac", "-p", str(REPO / "policies"), "--shells", "off", "--write"]


def expected_applies(*forms: Any) -> dict[tuple[str, str, str | None, str], dict[str, Any]]:
    """What --write applies for each of ``forms``: ``rbac_reports``' objects, by key."""
    policy = load_policy(REPO / "policies")
    report = rbac_report(edit_objects(), platform_of(policy), shells=False)
    out = {}
    for form in forms:
        for each in rbac_reports(form, report, now=NOW):
            meta = each["metadata"]
            plural = form.plural if "namespace" in meta else form.cluster_plural
            out[form.api_version, plural, meta.get("namespace"), meta["name"]] = each
    return out


def test_write_applies_each_format_the_cluster_serves(
    recorded: RecordedReports, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(WRITE) == 0  # 0: every report stored, whatever was found
    err = capsys.readouterr().err
    assert "4 RBAC PolicyReports written (one ClusterPolicyReport)" in err
    assert "4 RBAC Reports written (one ClusterReport)" in err
    assert recorded.applied == expected_applies(POLICY_REPORTS, OPEN_REPORTS)
    assert sorted((api, plural, ns) for api, plural, ns, _ in recorded.applied) == [
        ("openreports.io/v1alpha1", "clusterreports", None),
        ("openreports.io/v1alpha1", "reports", "platform"),
        ("openreports.io/v1alpha1", "reports", "team-a"),
        ("openreports.io/v1alpha1", "reports", "team-b"),
        ("wgpolicyk8s.io/v1alpha2", "clusterpolicyreports", None),
        ("wgpolicyk8s.io/v1alpha2", "policyreports", "platform"),
        ("wgpolicyk8s.io/v1alpha2", "policyreports", "team-a"),
        ("wgpolicyk8s.io/v1alpha2", "policyreports", "team-b"),
    ]
    # --reports names one
    recorded.applied.clear()
    assert main([*WRITE, "--reports", "openreports"]) == 0
    assert recorded.applied == expected_applies(OPEN_REPORTS)


def test_write_without_a_formats_crds_says_what_to_install(
    recorded: RecordedReports, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded.missing["openreports"] = ["Report", "ClusterReport"]
    assert main(WRITE) == 0  # by default: what is served is written, the rest said
    err = capsys.readouterr().err
    assert "serves no openreports.io/v1alpha1 Report or ClusterReport" in err
    assert "github.com/openreports/reports-api" in err and "openreports not written" in err
    assert recorded.applied == expected_applies(POLICY_REPORTS)
    # Named, a format not served is an error, and nothing is written.
    recorded.applied.clear()
    assert main([*WRITE, "--reports", "openreports"]) == 2
    err = capsys.readouterr().err
    assert "cannot read which report CRDs the cluster serves: the cluster serves no " in err
    assert "or run without --reports openreports" in err and "Traceback" not in err
    assert recorded.applied == {}
    # None served: an error too.
    recorded.missing["policyreport"] = ["PolicyReport", "ClusterPolicyReport"]
    assert main(WRITE) == 2
    assert "no report format to write" in capsys.readouterr().err
    # Deleted since discovery: the apply's 404 said as a missing format is.
    recorded.missing.clear()
    recorded.gone = "openreports.io"
    assert main(WRITE) == 2
    err = capsys.readouterr().err
    assert "cannot write the RBAC Reports: 404: the cluster serves no openreports.io" in err
    assert recorded.applied == expected_applies(POLICY_REPORTS)  # written first


def test_an_empty_report_renders() -> None:
    report = RbacReport([], [], shells=True)
    assert to_table(report.findings) == "NAMESPACE  SUBJECT  DOOR  GRANTS  VIA"
    (cluster,) = rbac_reports(POLICY_REPORTS, report)
    assert cluster["results"] == [] and cluster["summary"]["fail"] == 0


def test_the_rule_ids_page_names_every_door_in_order() -> None:
    from webhook.cli.rules import rules_markdown

    text = rules_markdown()
    places = [text.find(f"`{d.id}`") for d in DOORS]
    assert -1 not in places and places == sorted(places)
