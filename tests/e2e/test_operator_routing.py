"""The operators' objects through the real apiserver: what reaches runguard, and what it
refuses there (tests/engine/attacks/test_operators.py holds the same chains offline).

runguard serves the shipped policies with its cluster-state watch, registered in place of
the session's runguard; the operators' CRDs are installed first, KubeAI's Model with its
``scale`` and ``status`` subresources (as KubeAI's own CRD has them). Then:

- ``kubectl scale`` of the platform's Model (``models/scale``) by a user is refused,
  KubeAI's own scale and the user's scale of her own Model go through;
- a user's RayJob whose ``spec.clusterSelector`` names the platform's RayCluster is
  refused (KubeRay would submit her job to it), one naming her own cluster is created;
- with runguard stopped, a user's own Workflow is created and updated (by herself and by
  Argo's controller) as if runguard were not installed, while a run-labelled Workflow,
  one claiming runguard's records, Argo's update of the platform's Workflow, her RayJob
  naming a cluster and her scale of a Model fail closed: the README's runbook, "everything
  else is unaffected", for the operators' kinds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from webhook.install import manifests

from . import runs
from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .identities import Identity
from .runs import Webhook, rule_ids
from .test_operator_watch import (
    KUBEAI_ACCOUNT,
    KUBERAY_ACCOUNT,
    MODEL,
    OPERATOR_ACCOUNT,
    RAYCLUSTER,
    RAYJOB,
    RUN,
    WAIT,
    WORKFLOW_KIND,
    Kind,
    Served,
    apply,
    custom,
    custom_resource_definition,
    records,
    role,
)

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
KINDS = (WORKFLOW_KIND, MODEL, RAYJOB, RAYCLUSTER)
SPEC = {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "x"}}]}


def install(cluster: Cluster, kind: Kind) -> None:
    """The operator's CRD, reduced; a Model with KubeAI's scale and status subresources."""
    crd = custom_resource_definition(kind)
    if kind == MODEL:
        crd["spec"]["versions"][0]["subresources"] = {
            "status": {},
            "scale": {"specReplicasPath": ".spec.replicas",
                      "statusReplicasPath": ".status.replicas"},
        }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(crd), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{kind.crd}",
                    check=True)  # fmt: skip


@pytest.fixture(scope="module")
def served(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("operator-routing")
    prepare_cluster(cluster)
    for kind in KINDS:
        install(cluster, kind)
    core = runs.platform_identity(cluster)
    user = cluster.user("mallory", ("developers",))
    accounts = (OPERATOR_ACCOUNT, KUBEAI_ACCOUNT, KUBERAY_ACCOUNT)
    operator, kubeai, kuberay = (cluster.service_account(*a) for a in accounts)
    resources = [f"{k.plural}{sub}" for k in KINDS for sub in ("", "/status", "/scale")]
    apply(cluster, role(
        "rg-e2e-operator-routing",
        [{"apiGroups": sorted({k.group for k in KINDS}), "resources": resources, "verbs": ["*"]}],
        {"kind": "ServiceAccount", "name": "core", "namespace": "digitalhub"},
        *({"kind": "ServiceAccount", "name": name, "namespace": namespace}
          for namespace, name in accounts),
        {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"},
    ))  # fmt: skip
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base, runs.REPO / "policies", serve_args=state)
    with runs.instead_of_the_session(webhook, cluster, server):
        runs.wait_for_policy_label(cluster, "digitalhub", "this module's runguard called")
        found = Served(server, core, user, operator, kubeai, kuberay)
        for kind in KINDS:
            runs.poll(f"the {kind.kind} kind listed",
                 lambda k=kind: found.metric("runguard_cluster_state_synced", k.group_kind) == 1,
                 WAIT)  # fmt: skip
        yield found


@pytest.fixture
def space(cluster: Cluster, served: Served) -> Iterator[str]:
    name = f"t-oprouting-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", name, check=True)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def refused_with(who: Identity, rule: str, *args: str, input: str | None = None) -> bool:
    """``kubectl ARGS`` as ``who`` is refused by runguard under ``rule``."""
    done = who.kubectl(*args, input=input)
    return done.returncode != 0 and rule in rule_ids(done.stderr)


def stored(who: Identity, namespace: str, kind: Kind, name: str) -> JSON:
    done = who.kubectl("get", "-n", namespace, f"{kind.plural}.{kind.group}", name, "-o", "json",
                       check=True)  # fmt: skip
    obj: JSON = json.loads(done.stdout)
    return obj


def test_kubectl_scale_of_the_platforms_model_is_refused(served: Served, space: str) -> None:
    model = f"models.{MODEL.group}"
    platform = custom(served.core, space, MODEL, "llama", {"replicas": 1, "url": "hf://x/y"})
    assert records(platform) == (served.core.username, "true")
    custom(served.user, space, MODEL, "mine", {"replicas": 1, "url": "hf://x/y"})
    # once runguard's cache holds the Model (until then: ownership.unknown, also refused)
    scale = ("scale", "-n", space, f"{model}/llama", "--replicas=3")
    runs.until("the platform's Model scaled by mallory refused as the platform's",
          lambda: refused_with(served.user, "ownership.changed", *scale, "--dry-run=server")
          or None)  # fmt: skip
    done = served.user.kubectl(*scale)
    assert done.returncode != 0 and rule_ids(done.stderr) == {"ownership.changed"}, done.stderr
    assert "scaling it is the platform's" in done.stderr
    assert stored(served.core, space, MODEL, "llama")["spec"]["replicas"] == 1
    # KubeAI's autoscaler scales it; mallory scales her own
    served.kubeai.kubectl("scale", "-n", space, f"{model}/llama", "--replicas=2", check=True)
    served.user.kubectl("scale", "-n", space, f"{model}/mine", "--replicas=3", check=True)
    assert stored(served.core, space, MODEL, "llama")["spec"]["replicas"] == 2
    assert stored(served.user, space, MODEL, "mine")["spec"]["replicas"] == 3


def rayjob(cluster: str) -> JSON:
    return {"apiVersion": RAYJOB.api_version, "kind": RAYJOB.kind,
            "metadata": {"name": f"job-{cluster}"},
            "spec": {"entrypoint": "python -c 'import os; print(os.environ)'",
                     "clusterSelector": {"ray.io/cluster": cluster}}}  # fmt: skip


def test_a_users_rayjob_on_the_platforms_raycluster_is_refused(served: Served, space: str) -> None:
    platform = custom(served.core, space, RAYCLUSTER, "platform-ray", {"headGroupSpec": {}})
    assert records(platform) == (served.core.username, "true")
    custom(served.user, space, RAYCLUSTER, "mine", {"headGroupSpec": {}})
    create = ("create", "-n", space, "-f", "-")
    job = json.dumps(rayjob("platform-ray"))
    runs.until("mallory's RayJob on the platform's RayCluster refused",
          lambda: refused_with(served.user, "ownership.reference", *create, "--dry-run=server",
                               input=job) or None)  # fmt: skip
    done = served.user.kubectl(*create, input=job)
    assert done.returncode != 0 and rule_ids(done.stderr) == {"ownership.reference"}, done.stderr
    assert "platform-ray is the platform's" in done.stderr
    served.user.kubectl(*create, input=json.dumps(rayjob("mine")), check=True)
    # the platform may name its own cluster
    served.core.kubectl(*create, input=json.dumps(rayjob("platform-ray")), check=True)


def ray_template(labels: JSON) -> JSON:
    return {"metadata": {"labels": labels},
            "spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.9.0"}]}}  # fmt: skip


def test_a_rayjobs_run_templates_are_stored_with_the_profile(served: Served, space: str) -> None:
    """Her RayJob whose head and worker templates are a run's (its own metadata names no
    run) reaches /mutate through the operators' webhook (cel-go evaluating the template
    terms, [*] over the worker groups): stored with the profile where Kueue counts it.
    One whose templates are no run's is stored as sent."""
    run = {**RUN, "dhcore/template": "1xa100"}
    spec = {"entrypoint": "python main.py",
            "rayClusterSpec": {"headGroupSpec": {"template": ray_template(run)},
                               "workerGroupSpecs": [{"groupName": "gpu",
                                                     "template": ray_template(run)}]}}  # fmt: skip
    custom(served.user, space, RAYJOB, "gpu-run", spec)
    cluster = stored(served.user, space, RAYJOB, "gpu-run")["spec"]["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"],
                     cluster["workerGroupSpecs"][0]["template"]):  # fmt: skip
        main = template["spec"]["containers"][0]
        assert main["resources"]["requests"]["nvidia.com/gpu"] == "1", main
        assert template["spec"]["runtimeClassName"] == "nvidia"
    mine = {**spec, "rayClusterSpec": {"headGroupSpec": {"template": ray_template({"app": "x"})},
                                       "workerGroupSpecs": [{"groupName": "cpu"}]}}  # fmt: skip
    custom(served.user, space, RAYJOB, "mine", mine)
    assert stored(served.user, space, RAYJOB, "mine")["spec"] == mine


def failed_calling(served: Served, done: Any) -> bool:
    """The request failed because an operators' webhook of this runguard is unreachable."""
    webhooks = (manifests.MUTATING_OPERATORS_WEBHOOK, manifests.OPERATORS_WEBHOOK)
    return done.returncode != 0 and any(
        f'failed calling webhook "{name}"' in done.stderr for name in webhooks
    )


def test_with_runguard_down_a_users_own_workflow_is_unaffected(
    served: Served, space: str, cluster: Cluster
) -> None:
    platform = custom(served.core, space, WORKFLOW_KIND, "pipeline", SPEC, labels=dict(RUN))
    assert records(platform) == (served.core.username, "true")
    hers = custom(served.user, space, WORKFLOW_KIND, "mine", SPEC)
    assert records(hers) == (None, None)  # nothing that would route it later
    custom(served.core, space, MODEL, "llama", {"replicas": 1})
    step = json.dumps({"metadata": {"labels": {"workflows.argoproj.io/phase": "Running"}},
                       "status": {"phase": "Running"}})  # fmt: skip
    served.server.stop()
    try:
        # a user's own Workflow: created, updated by her and by Argo's controller
        again = custom(served.user, space, WORKFLOW_KIND, "mine-2", SPEC)
        assert records(again) == (None, None)
        for who, name in ((served.operator, "mine"), (served.user, "mine"),
                          (served.operator, "mine-2")):  # fmt: skip
            done = who.kubectl("patch", "-n", space, f"workflows.{WORKFLOW_KIND.group}", name,
                               "--type=merge", "-p", step)  # fmt: skip
            assert done.returncode == 0, done.stderr
        # what runguard judges fails closed
        create = ("create", "-n", space, "-f", "-")
        run = {"apiVersion": WORKFLOW_KIND.api_version, "kind": WORKFLOW_KIND.kind,
               "metadata": {"name": "run", "labels": dict(RUN)}, "spec": SPEC}  # fmt: skip
        claims = {
            **run,
            "metadata": {"name": "claims", "annotations": {"runguard.io/platform": "true"}},
        }
        for obj in (run, claims, rayjob("anything")):
            done = served.user.kubectl(*create, input=json.dumps(obj))
            assert failed_calling(served, done), (obj["metadata"], done.stderr)
        done = served.operator.kubectl("patch", "-n", space, f"workflows.{WORKFLOW_KIND.group}",
                                       "pipeline", "--type=merge", "-p", step)  # fmt: skip
        assert failed_calling(served, done), done.stderr
        done = served.user.kubectl("scale", "-n", space, f"models.{MODEL.group}/llama",
                                   "--replicas=4")  # fmt: skip
        assert failed_calling(served, done), done.stderr
    finally:
        served.server.start()
        runs.wait_for_policy_label(cluster, "digitalhub", "this module's runguard called again")
