"""Operators' custom resources in the cluster state, through the real apiserver.

runguard serves the shipped policies, whose digitalhub RunPolicy names DigitalHub's
operators (Argo Workflows' controller owns Pods through ``argoproj.io/Workflow``, KubeAI
through ``kubeai.org/Model``, KubeRay through ``ray.io/RayJob`` and ``ray.io/RayCluster``),
with its cluster state watch, registered in place of the session's runguard. The CRDs
(reduced: namespaced, any spec) are installed only after runguard started: until then
the kinds are said in the log, do not hold ``/readyz`` back and an operator's Pod does not
get the platform's secret; once installed the watch lists them, and each operator's Pod
owned (by uid) by the platform's object keeps the secret while the same Pod owned by a
user's does not: the whole chain, the platform's custom resource, the operator's
request, runguard's records, through the real apiserver (KubeRay's two steps included:
the RayCluster it makes from a RayJob, copying its annotations, then the head Pod). Last,
a watch whose account may not list Workflows says so (403, what to grant) and lists
them once the rule is added.
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
from webhook.clusterstate.publication import create_directory
from webhook.clusterstate.reader import SharedClusterState

from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .identities import Identity
from .runs import (
    REPO,
    Webhook,
    instead_of_the_session,
    platform_identity,
    poll,
    rule_ids,
    until,
    wait_for_policy_label,
)

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
WORKFLOW = "argoproj.io/Workflow"
CRD = "workflows.argoproj.io"
# namespace, ServiceAccount: as the shipped policies name them (policies/runpolicy.yaml)
OPERATOR_ACCOUNT = ("digitalhub", "argo-workflow-controller")
KUBEAI_ACCOUNT = ("digitalhub", "digitalhub-kubeai")
KUBERAY_ACCOUNT = ("digitalhub", "kuberay-operator")
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}
SECRET = "sec-api-r1"  # the run's own secret (policies/runpolicy.yaml: sec-*-{run})
WAIT = 90.0  # the watch looks a missing kind up again with backoff (at most 30 s between)
RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Kind:
    """A custom resource kind an operator owns Pods through."""

    group: str
    version: str
    kind: str

    @property
    def plural(self) -> str:
        return self.kind.lower() + "s"

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def group_kind(self) -> str:
        return f"{self.group}/{self.kind}"


WORKFLOW_KIND = Kind("argoproj.io", "v1alpha1", "Workflow")
MODEL = Kind("kubeai.org", "v1", "Model")
RAYJOB = Kind("ray.io", "v1", "RayJob")
RAYCLUSTER = Kind("ray.io", "v1", "RayCluster")


def custom_resource_definition(kind: Kind) -> JSON:
    """The operator's CRD, reduced to what the apiserver needs: namespaced, any content."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd},
        "spec": {
            "group": kind.group,
            "names": {"kind": kind.kind, "listKind": kind.kind + "List", "plural": kind.plural,
                      "singular": kind.kind.lower()},
            "scope": "Namespaced",
            "versions": [{"name": kind.version, "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}}],
        },
    }  # fmt: skip


def install_crd(cluster: Cluster, kind: Kind = WORKFLOW_KIND) -> None:
    crd = json.dumps(custom_resource_definition(kind))
    cluster.kubectl("apply", "-f", "-", input=crd, check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{kind.crd}",
                    check=True)  # fmt: skip


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
    kubeai: Identity  # KubeAI's controller
    kuberay: Identity  # KubeRay's operator

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
    for kind in (WORKFLOW_KIND, MODEL, RAYJOB, RAYCLUSTER):
        cluster.kubectl("delete", "crd", kind.crd, "--ignore-not-found", "--wait", check=True)
    prepare_cluster(cluster)
    core = platform_identity(cluster)
    user = cluster.user("mallory", ("developers",))
    accounts = (OPERATOR_ACCOUNT, KUBEAI_ACCOUNT, KUBERAY_ACCOUNT)
    operator, kubeai, kuberay = (cluster.service_account(*a) for a in accounts)
    # What each needs, "edit" aside (filled by the controller-manager's aggregation, which
    # does not run here, and never covering a custom resource).
    apply(cluster, role(
        "rg-e2e-operators",
        [{"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["*"]},
         {"apiGroups": ["kubeai.org"], "resources": ["models"], "verbs": ["*"]},
         {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": ["*"]},
         {"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["*"]}],
        {"kind": "ServiceAccount", "name": "core", "namespace": "digitalhub"},
        *({"kind": "ServiceAccount", "name": name, "namespace": namespace}
          for namespace, name in accounts),
        {"kind": "User", "name": "mallory", "apiGroup": RBAC},
    ))  # fmt: skip
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base, REPO / "policies", serve_args=state)  # naming the operators
    with instead_of_the_session(webhook, cluster, server):  # ready while the CRDs are missing
        wait_for_policy_label(cluster, "digitalhub", "this module's runguard called")
        yield Served(server, core, user, operator, kubeai, kuberay)


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


def owner_reference(kind: Kind, name: str, uid: str) -> JSON:
    return {"apiVersion": kind.api_version, "kind": kind.kind, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def operator_pod(name: str, labels: JSON, owner: JSON, container: str, image: str) -> JSON:
    """A Pod an operator creates for ``owner``, reading the run's secret through envFrom."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": container, "image": image,
                                 "envFrom": [{"secretRef": {"name": SECRET}}]}]},
    }  # fmt: skip


def step_pod(name: str, workflow: str, uid: str) -> JSON:
    """The Pod Argo creates for a step of ``workflow``: a run reading the run's secret."""
    labels = {**RUN, "workflows.argoproj.io/workflow": workflow}
    owner = owner_reference(WORKFLOW_KIND, workflow, uid)
    return operator_pod(name, labels, owner, "main", "python:3.11")


def model_pod(name: str, model: str, uid: str) -> JSON:
    """The model server Pod KubeAI creates for ``model`` (tests/platforms/digitalhub/
    kubeai-model.yaml, reduced): KubeAI's labels, not a run."""
    labels = {"app": "model", "model": model, "app.kubernetes.io/managed-by": "kubeai"}
    owner = owner_reference(MODEL, model, uid)
    return operator_pod(name, labels, owner, "server", "substratusai/vllm:v0.6.3")


def ray_head_pod(name: str, cluster: str, uid: str) -> JSON:
    """The head Pod KubeRay creates for ``cluster`` (tests/platforms/digitalhub/
    ray-head.yaml, reduced): the run's labels from the head group's template, a run."""
    labels = {**RUN, "ray.io/cluster": cluster, "ray.io/node-type": "head"}
    owner = owner_reference(RAYCLUSTER, cluster, uid)
    return operator_pod(name, labels, owner, "ray-head", "rayproject/ray:2.55.1")


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
    return custom(who, namespace, WORKFLOW_KIND, name, spec)


def custom(who: Identity, namespace: str, kind: Kind, name: str, spec: JSON, **meta: Any) -> JSON:
    """A custom resource ``who`` creates, as the apiserver stored it."""
    obj = {"apiVersion": kind.api_version, "kind": kind.kind,
           "metadata": {"name": name, **meta}, "spec": spec}  # fmt: skip
    made = create(who, namespace, obj)
    assert made is not None
    return made


def cached(served: Served, kind: Kind, count: int) -> None:
    """Wait until runguard's cache holds ``count`` objects of ``kind``."""

    def holds() -> bool:
        status, body = served.server.readyz()
        return status == 200 and body["clusterState"]["objects"].get(kind.group_kind, 0) >= count

    poll(f"{count} {kind.kind} objects in runguard's cache", holds, timeout=30)


def synced(cluster: Cluster, served: Served, kind: Kind) -> None:
    install_crd(cluster, kind)
    poll(f"the {kind.kind} kind listed",
         lambda: served.metric("runguard_cluster_state_synced", kind.group_kind) == 1,
         WAIT)  # fmt: skip


def records(obj: JSON) -> tuple[str | None, str | None]:
    """runguard's stamp and platform record on ``obj``."""
    annotations = obj["metadata"].get("annotations", {})
    return annotations.get("runguard.io/requested-by"), annotations.get("runguard.io/platform")


def test_a_kind_not_installed_is_said_and_its_pods_do_not_get_the_secret(
    served: Served, space: str
) -> None:
    status, body = served.server.readyz()
    assert status == 200, body  # the missing CRDs do not hold the server back
    for kind in (WORKFLOW_KIND, MODEL, RAYJOB, RAYCLUSTER):
        assert kind.group_kind not in body["clusterState"]["waiting"]
        assert served.metric("runguard_cluster_state_synced", kind.group_kind) == 0
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
    synced(cluster, served, WORKFLOW_KIND)
    assert "argoproj.io/Workflow: served as workflows.argoproj.io/v1alpha1 (namespaced)" in (
        served.log()
    )
    mine = workflow(served.core, space, "pipeline")
    theirs = workflow(served.user, space, "lookalike")
    # runguard's records, written at CREATE (docs/dev/choices.md, "Trust over time")
    assert mine["metadata"]["annotations"]["runguard.io/platform"] == "true"
    assert "runguard.io/platform" not in theirs["metadata"].get("annotations", {})
    cached(served, WORKFLOW_KIND, 2)
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


def test_kubeais_model_pod_follows_the_platforms_model_by_uid(
    cluster: Cluster, served: Served, space: str
) -> None:
    """KubeAI: the Core's Model, then KubeAI's model server Pod (not a run: KubeAI's
    labels) reading the run's secret; a user's Model's Pod is refused."""
    synced(cluster, served, MODEL)
    spec = {"url": "hf://meta-llama/Llama-3.2-1B-Instruct", "engine": "VLLM",
            "resourceProfile": "cpu:1", "envFrom": [{"secretRef": {"name": SECRET}}]}  # fmt: skip
    mine = custom(served.core, space, MODEL, "llama", spec)
    theirs = custom(served.user, space, MODEL, "llama-2", spec)
    assert records(mine) == ("system:serviceaccount:digitalhub:core", "true")
    assert records(theirs) == (None, None)  # a user's own: nothing recorded, never routed
    cached(served, MODEL, 2)
    platform = create(served.kubeai, space, model_pod("model-llama-1", "llama",
                                                      mine["metadata"]["uid"]))  # fmt: skip
    assert kept_secret(platform), platform
    users = create(served.kubeai, space, model_pod("model-llama-2", "llama-2",
                                                   theirs["metadata"]["uid"]))  # fmt: skip
    assert users is None  # ownership.not-a-run: denied, not admitted without its secret
    # The Core's Model is its model server's template: its spec is not the user's to
    # change (her image would run with the run's secret); annotating it is.
    target = f"{MODEL.plural}.{MODEL.group}/llama"
    rewrite = json.dumps({"spec": {"url": "hf://mallory/exfiltrate"}})
    done = served.user.kubectl("patch", "-n", space, target, "--type=merge", "-p", rewrite)
    assert done.returncode != 0 and "ownership.changed" in rule_ids(done.stderr), done.stderr
    served.user.kubectl("annotate", "-n", space, target, "note=seen", check=True)
    served.core.kubectl("patch", "-n", space, target, "--type=merge",
                        "-p", json.dumps({"spec": {"resourceProfile": "cpu:2"}}),
                        check=True)  # fmt: skip


def test_kuberays_head_pod_follows_the_platforms_rayjob_through_its_raycluster(
    cluster: Cluster, served: Served, space: str
) -> None:
    """KubeRay: the Core's RayJob; KubeRay's RayCluster from it (owned by uid, the RayJob's
    annotations copied, as rayjob_controller.go does); the head Pod from the RayCluster, a
    run. A user's RayJob (no records of runguard's, so none to copy) yields a RayCluster
    runguard records nothing on and a head Pod without the run's secret."""
    synced(cluster, served, RAYJOB)
    synced(cluster, served, RAYCLUSTER)
    heads = {}
    for who, name in ((served.core, "train"), (served.user, "train-2")):
        job = custom(who, space, RAYJOB, name, {"entrypoint": "python main.py"})
        copied = job["metadata"].get("annotations", {})
        cached(served, RAYJOB, 1 if who is served.core else 2)
        owner = owner_reference(RAYJOB, name, job["metadata"]["uid"])
        made = custom(served.kuberay, space, RAYCLUSTER, f"{name}-x7k2q",
                      {"rayVersion": "2.55.1"}, annotations=copied,
                      ownerReferences=[owner])  # fmt: skip
        # the Core's: recorded as the platform's; a user's: nothing recorded
        expected = (("system:serviceaccount:digitalhub:kuberay-operator", "true")
                    if who is served.core else (None, None))  # fmt: skip
        assert records(made) == expected, made["metadata"]
        cached(served, RAYCLUSTER, 1 if who is served.core else 2)
        heads[name] = create(served.kuberay, space,
                             ray_head_pod(f"{name}-head", made["metadata"]["name"],
                                          made["metadata"]["uid"]))  # fmt: skip
    assert kept_secret(heads["train"]), heads["train"]
    users = heads["train-2"]
    assert users is not None  # a run: admitted, the secret stripped (onForbidden: Strip)
    assert "envFrom" not in users["spec"]["containers"][0], users["spec"]
    assert users["metadata"]["labels"]["runguard.io/policy"] == "digitalhub"


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
