"""A project's own profiles (ProjectProfile) through the real apiserver.

runguard serves the shipped policies with its cluster-state watch (which reads the
ProjectProfiles with their spec) and its policy objects' webhook (``/validate-policy``),
registered in place of the session's; the ProjectProfile CRD and the two ClusterRoles of
the policy-objects component are applied as shipped, and the controller-manager runs,
so that its aggregation controller folds them into ``admin`` and ``view``. Then:

* a project admin (``admin`` bound in team A) creates a ProjectProfile in team A;
* a user of both teams (``edit`` in each) runs with it in team A, and gets its values;
* the same run in team B is refused, listing the profiles team B may use (team B's own
  among them);
* the project admin's profile above the RunPolicy's maximums is refused at ``kubectl
  apply`` with lint's message;
* the ``edit`` user cannot create one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from webhook.install import manifests
from webhook.policy.crd import CRD_FILES

from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .identities import Identity
from .runs import (
    REPO,
    Webhook,
    instead_of_the_session,
    rule_ids,
    run_pod,
    until,
    wait_for_policy_label,
)

pytestmark = pytest.mark.e2e

COMPONENT = REPO / "manifests" / manifests.POLICY_OBJECTS_DIR
PROFILE = {
    "apiVersion": "runguard.io/v1",
    "kind": "ProjectProfile",
    "metadata": {"name": "2xt4-small"},
    "spec": {
        "description": "Two T4s, 2 to 8 cores",
        "resources": {
            "requests": {"cpu": {"min": "2", "default": "4", "max": "8"}, "memory": "16Gi"},
            "limits": {"memory": "24Gi"},
        },
        "nodeSelector": {"example.com/pool": "t4"},
    },
}


@dataclass(frozen=True)
class Teams:
    a: str
    b: str
    admin: Identity  # admin in team A
    user: Identity  # edit in team A and team B


def bind(cluster: Cluster, namespace: str, role: str, user: str) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{role}-{user}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(binding), check=True)


def project_roles() -> list[dict[str, Any]]:
    """The component's ClusterRoles for projects' admins and viewers, as shipped."""
    docs = yaml.safe_load_all((COMPONENT / "rbac.yaml").read_text())
    return [d for d in docs if d and d["metadata"]["name"].startswith("runguard-project-")]


@pytest.fixture(scope="module")
def teams(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Teams]:
    crd = COMPONENT / CRD_FILES["ProjectProfile"]
    cluster.kubectl("apply", "--server-side", "-f", str(crd), check=True)
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/projectprofiles.runguard.io", check=True
    )
    listed = {"apiVersion": "v1", "kind": "List", "items": project_roles()}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
    suffix = os.urandom(3).hex()
    team_a, team_b = f"t-proj-a-{suffix}", f"t-proj-b-{suffix}"
    for name in (team_a, team_b):
        cluster.kubectl("create", "namespace", name, check=True)
    admin = cluster.user(f"project-admin-{suffix}", cluster_role=None)
    user = cluster.user(f"team-user-{suffix}", cluster_role=None)
    bind(cluster, team_a, "admin", admin.username)
    for name in (team_a, team_b):
        bind(cluster, name, "edit", user.username)
    server = Runguard(
        tmp_path_factory.mktemp("project-profiles"),
        REPO / "policies",
        serve_args=("--cluster-state", str(cluster.kubeconfig)),
    )
    prepare_cluster(cluster)
    with instead_of_the_session(webhook, cluster, server):
        hook = manifests.policy_object_webhook(
            url=server.url, ca_bundle=server.ca_file.read_bytes()
        )
        cluster.kubectl("apply", "-f", "-", input=json.dumps(hook), check=True)
        wait_for_policy_label(cluster, "digitalhub", "runguard with project profiles called")
        cluster.start_whole_path()
        try:
            # the aggregation controller has folded the component's role into admin's
            until(
                "admin may create projectprofiles",
                lambda: (
                    admin.kubectl(
                        "auth", "can-i", "create", "projectprofiles.runguard.io", "-n", team_a
                    ).returncode
                    == 0
                ),
                60,
            )
            yield Teams(team_a, team_b, admin, user)
        finally:
            cluster.stop_whole_path()
            cluster.kubectl(
                "delete", "validatingwebhookconfiguration", manifests.POLICY_CONFIGURATION_NAME
            )
            cluster.kubectl("delete", "namespace", team_a, team_b, "--wait=false")


def in_namespace(obj: dict[str, Any], namespace: str, **changes: Any) -> str:
    out = json.loads(json.dumps(obj))
    out["metadata"]["namespace"] = namespace
    out["metadata"].update(changes)
    return json.dumps(out)


def test_a_project_admin_gives_her_team_a_profile_only_her_team_may_use(
    cluster: Cluster, teams: Teams
) -> None:
    done = teams.admin.kubectl("apply", "-f", "-", input=in_namespace(PROFILE, teams.a))
    assert done.returncode == 0, done.stderr
    tiny = {**PROFILE, "metadata": {"name": "tiny"}, "spec": {"description": "one core"}}
    cluster.kubectl("apply", "-f", "-", input=in_namespace(tiny, teams.b), check=True)
    listed = teams.user.kubectl("get", "projectprofiles", "-n", teams.a, check=True).stdout
    header, row = listed.splitlines()
    assert header.split() == ["NAME", "CPU", "MEMORY", "GPU", "AGE"]
    assert row.split()[:3] == ["2xt4-small", '{"default":"4","max":"8","min":"2"}', "16Gi"]

    pod = json.dumps(run_pod("picked", "2xt4-small"))
    # the watch reads the new profile a moment after the apiserver stored it
    until(
        "the project profile in runguard's cache",
        lambda: (
            teams.user.kubectl(
                "create", "--dry-run=server", "-n", teams.a, "-f", "-", input=pod
            ).returncode
            == 0
        ),
    )
    done = teams.user.kubectl("create", "-n", teams.a, "-f", "-", input=pod)
    assert done.returncode == 0, done.stderr
    stored = json.loads(
        cluster.kubectl("get", "pod", "-n", teams.a, "picked", "-o", "json", check=True).stdout
    )
    assert stored["spec"]["nodeSelector"]["example.com/pool"] == "t4"
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert resources["limits"]["memory"] == "24Gi"

    done = teams.user.kubectl("create", "-n", teams.b, "-f", "-", input=pod)
    assert done.returncode != 0
    assert rule_ids(done.stderr) == {"profile.unknown"}
    assert (
        "profile '2xt4-small' does not exist (known: 1xa100, 1xt4, 2xa100, cpu-large, tiny)"
        in done.stderr
    )


def test_a_profile_above_the_maximums_is_refused_at_apply(teams: Teams) -> None:
    big = json.loads(in_namespace(PROFILE, teams.a, name="big"))
    big["spec"]["resources"]["requests"]["memory"] = "512Gi"
    done = teams.admin.kubectl("apply", "-f", "-", input=json.dumps(big))
    assert done.returncode != 0
    assert f"ProjectProfile {teams.a}/big does not load" in done.stderr
    assert (
        'spec.resources.requests.memory: "512Gi" is above the maximum "66Gi" (RunPolicy digitalhub)'
    ) in done.stderr
    assert teams.admin.kubectl("get", "projectprofile", "-n", teams.a, "big").returncode != 0


def test_an_edit_user_cannot_write_one(teams: Teams) -> None:
    mine = in_namespace(PROFILE, teams.a, name="mine")
    done = teams.user.kubectl("apply", "-f", "-", input=mine)
    assert done.returncode != 0
    assert "forbidden" in done.stderr.lower()
    assert teams.user.kubectl("auth", "can-i", "create", "projectprofiles.runguard.io",
                              "-n", teams.a).stdout.strip() == "no"  # fmt: skip
