"""Operators' custom resources in the cluster state, through the real apiserver.

runguard serves the shipped policies with an operator added to the digitalhub RunPolicy
(``system:serviceaccount:digitalhub:argo`` owns Pods through ``argoproj.io/Workflow``),
with its cluster state watch, registered in place of the session's runguard. The
Workflow CRD (namespaced, any spec) is installed only after runguard started: until then
the kind is said in the log, does not hold ``/readyz`` back and an operator's Pod does not
get the platform's secret; once it is installed the watch lists it, and an operator's
Pod owned by the platform's Workflow (by uid) keeps the secret while the same Pod owned
by a Workflow a user created does not. Last, a watch whose account may not list
Workflows says so (403, what to grant) and lists them once the rule is added.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.clusterstate import KINDS
from webhook.clusterstate.process import WatchProcess
from webhook.clusterstate.publication import SharedClusterState, create_directory

from .cluster import Cluster, Identity
from .devcluster import Runguard, prepare_cluster
from .runs import (
    REPO,
    Webhook,
    instead_of_the_session,
    platform_identity,
    poll,
    until,
    wait_for_policy_label,
)

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
WORKFLOW = "argoproj.io/Workflow"
CRD = "workflows.argoproj.io"
OPERATOR_ACCOUNT = ("digitalhub", "argo")  # namespace, ServiceAccount
OPERATOR = "system:serviceaccount:digitalhub:argo"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}
SECRET = "sec-api-r1"  # the run's own secret (policies/runpolicy.yaml: sec-*-{run})
WAIT = 90.0  # the watch looks a missing kind up again with backoff (at most 30 s between)
RBAC = "rbac.authorization.k8s.io"


def workflow_crd() -> JSON:
    """Argo's Workflow, reduced to what the apiserver needs: namespaced, any content."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": "argoproj.io",
            "names": {"kind": "Workflow", "listKind": "WorkflowList", "plural": "workflows",
                      "singular": "workflow"},
            "scope": "Namespaced",
            "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}}],
        },
    }  # fmt: skip


def install_crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(workflow_crd()), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}",
                    check=True)  # fmt: skip


def operator_policies(directory: Path) -> Path:
    """The shipped policies, the digitalhub RunPolicy naming the Argo operator."""
    directory.mkdir()
    for source in sorted((REPO / "policies").glob("*.yaml")):
        documents = list(yaml.safe_load_all(source.read_text()))
        for document in documents:
            if document.get("kind") == "RunPolicy" and document["metadata"]["name"] == "digitalhub":
                document["spec"]["platform"]["operators"] = [
                    {"identity": OPERATOR, "kinds": [WORKFLOW]}
                ]
        (directory / source.name).write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return directory


def role(name: str, rules: list[JSON], *subjects: JSON) -> list[JSON]:
    """A ClusterRole and its binding to ``subjects``."""
    return [
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": rules},
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
         "subjects": list(subjects)},
    ]  # fmt: skip


def apply(cluster: Cluster, objects: list[JSON]) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)


@dataclass
class Served:
    """This module's runguard and the identities acting on the cluster."""

    server: Runguard
    core: Identity  # the platform
    user: Identity  # a data scientist with edit rights
    operator: Identity  # Argo's workflow controller

    def metric(self, name: str, kind: str) -> float | None:
        context = ssl.create_default_context(cafile=str(self.server.ca_file))
        with urllib.request.urlopen(f"{self.server.url}/metrics", context=context,
                                    timeout=5) as answer:  # fmt: skip
            text = answer.read().decode()
        match = re.search(rf'^{name}{{kind="{re.escape(kind)}"}} (\S+)$', text, re.M)
        return float(match[1]) if match else None

    def log(self) -> str:
        return self.server.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("operators")
    cluster.kubectl("delete", "crd", CRD, "--ignore-not-found", "--wait", check=True)
    prepare_cluster(cluster)
    core = platform_identity(cluster)
    user = cluster.user("mallory", ("developers",))
    operator = cluster.service_account(*OPERATOR_ACCOUNT)
    # What each needs, "edit" aside (filled by the controller-manager's aggregation, which
    # does not run here, and never covering a custom resource).
    apply(cluster, role(
        "rg-e2e-operators",
        [{"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["*"]},
         {"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["*"]}],
        {"kind": "ServiceAccount", "name": "core", "namespace": "digitalhub"},
        {"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT[1], "namespace": OPERATOR_ACCOUNT[0]},
        {"kind": "User", "name": "mallory", "apiGroup": RBAC},
    ))  # fmt: skip
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base, operator_policies(base / "policies"), serve_args=state)
    with instead_of_the_session(webhook, cluster, server):  # ready while the CRD is missing
        wait_for_policy_label(cluster, "digitalhub", "this module's runguard called")
        yield Served(server, core, user, operator)


@pytest.fixture
def space(cluster: Cluster, served: Served) -> Iterator[str]:
    """A namespace of the test's own, with the run's secret the platform created."""
    name = f"t-operators-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", name, check=True)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
              "stringData": {"token": "x"}}  # fmt: skip
    served.core.kubectl("apply", "-n", name, "-f", "-", input=json.dumps(secret), check=True)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def step_pod(name: str, workflow: str, uid: str) -> JSON:
    """The Pod Argo creates for a step of ``workflow``: a run reading the run's secret."""
    owner = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": workflow,
             "uid": uid, "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**RUN, "workflows.argoproj.io/workflow": workflow},
                     "ownerReferences": [owner]},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "python:3.11",
                                 "envFrom": [{"secretRef": {"name": SECRET}}]}]},
    }  # fmt: skip


def create(who: Identity, namespace: str, obj: JSON, *args: str) -> JSON | None:
    """``obj`` as the apiserver stored it (or would: ``--dry-run=server``); None when
    it was refused."""
    done = who.kubectl("create", "-n", namespace, "-o", "json", *args, "-f", "-",
                       input=json.dumps(obj))  # fmt: skip
    if done.returncode != 0:
        assert "denied the request" in done.stderr, done.stderr
        return None
    created: JSON = json.loads(done.stdout)
    return created


def kept_secret(pod: JSON | None) -> bool:
    """The Pod was created, is the platform's (runguard's record) and kept the run's
    secret."""
    if pod is None:
        return False
    annotations = pod["metadata"].get("annotations", {})
    env_from = pod["spec"]["containers"][0].get("envFrom", [])
    return bool(annotations.get("runguard.io/platform") == "true") and env_from == [
        {"secretRef": {"name": SECRET}}
    ]


def workflow(who: Identity, namespace: str, name: str) -> JSON:
    spec = {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "x"}}]}
    made = create(who, namespace, {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                   "metadata": {"name": name}, "spec": spec})  # fmt: skip
    assert made is not None
    return made


def test_a_kind_not_installed_is_said_and_its_pods_do_not_get_the_secret(
    served: Served, space: str
) -> None:
    status, body = served.server.readyz()
    assert status == 200, body  # the missing CRD does not hold the server back
    assert WORKFLOW not in body["clusterState"]["waiting"]
    assert served.metric("runguard_cluster_state_synced", WORKFLOW) == 0
    poll("the missing kind said in the log",
         lambda: "argoproj.io/Workflow: discovery" in served.log(), timeout=30)  # fmt: skip
    said = [line for line in served.log().splitlines() if "argoproj.io/Workflow: discovery" in line]
    assert "is its CustomResourceDefinition installed?" in said[0], said[0]
    assert "Pods owned by Workflow objects fail closed (ownership.unknown)" in said[0]
    pod = create(served.operator, space, step_pod("early", "pipeline", "no-such-uid"),
                 "--dry-run=server")  # fmt: skip
    assert not kept_secret(pod)


def test_once_installed_an_operators_pod_follows_the_platforms_workflow_by_uid(
    cluster: Cluster, served: Served, space: str
) -> None:
    install_crd(cluster)
    poll("the Workflow kind listed",
         lambda: served.metric("runguard_cluster_state_synced", WORKFLOW) == 1, WAIT)  # fmt: skip
    assert "argoproj.io/Workflow: served as workflows.argoproj.io/v1alpha1 (namespaced)" in (
        served.log()
    )
    mine = workflow(served.core, space, "pipeline")
    theirs = workflow(served.user, space, "lookalike")
    # runguard's records, written at CREATE (docs/choices.md, "Trust over time")
    assert mine["metadata"]["annotations"]["runguard.io/platform"] == "true"
    assert "runguard.io/platform" not in theirs["metadata"].get("annotations", {})

    def cached() -> bool:
        status, body = served.server.readyz()
        return status == 200 and body["clusterState"]["objects"].get(WORKFLOW, 0) >= 2

    poll("both Workflows in runguard's cache", cached, timeout=30)
    uid = mine["metadata"]["uid"]
    platform = create(served.operator, space, step_pod("step-1", "pipeline", uid))
    assert kept_secret(platform), platform
    user_uid = theirs["metadata"]["uid"]
    users = create(served.operator, space, step_pod("step-2", "lookalike", user_uid))
    assert not kept_secret(users), users
    # a Workflow's uid under another name proves nothing
    borrowed = create(served.operator, space, step_pod("step-3", "lookalike", uid),
                      "--dry-run=server")  # fmt: skip
    assert not kept_secret(borrowed)


def test_a_kind_the_watch_may_not_list_is_said_then_listed_once_granted(
    cluster: Cluster, tmp_path: Path
) -> None:
    install_crd(cluster)
    # The watch's account with the shipped role only (manifests/cluster-state/rbac.yaml).
    shipped = yaml.safe_load_all((REPO / "manifests/cluster-state/rbac.yaml").read_text())
    (cluster_role,) = [d for d in shipped if d and d["kind"] == "ClusterRole"]
    apply(cluster, [cluster_role])
    account = cluster.service_account("rg-e2e-watch", "runguard",
                                      cluster_role=cluster_role["metadata"]["name"])  # fmt: skip
    directory = create_directory(str(tmp_path), (WORKFLOW,))
    log = tmp_path / "watch.log"
    with open(log, "wb") as output:
        watch = WatchProcess(directory, str(account.kubeconfig), KINDS, (WORKFLOW,),
                             output=output)  # fmt: skip
        watch.start()
        try:
            state = SharedClusterState(directory)
            until("the built-in kinds synced, Workflows forbidden",
                  lambda: all(state.synced(k) for k in KINDS)
                  and state.problems() == {WORKFLOW: "forbidden"}, timeout=60)  # fmt: skip
            assert WORKFLOW not in state.stats()  # /readyz would not wait for it
            text = log.read_text()
            assert "argoproj.io/Workflow: list: HTTP 403" in text, text[-2000:]
            assert ("grant runguard's ServiceAccount get, list, watch on workflows in API group "
                    "argoproj.io") in text  # fmt: skip
            # The rule docs/operations.md tells an admin to add.
            apply(cluster, role(
                "rg-e2e-watch-operators",
                [{"apiGroups": ["argoproj.io"], "resources": ["workflows"],
                  "verbs": ["get", "list", "watch"]}],
                {"kind": "ServiceAccount", "name": "runguard", "namespace": "rg-e2e-watch"},
            ))  # fmt: skip
            poll("Workflows listed once granted", lambda: state.synced("Workflow"), WAIT)
            assert state.problems() == {}
        finally:
            watch.stop()
