"""Trust over time (docs/dev/guarantees.md) through the real apiserver and controllers, with the
shipped policies.

runguard serves ``policies/`` as shipped (two RunPolicies, ownership on, the platform's
ServiceAccount ``digitalhub/core``) with its cluster state watch, registered as
``runguard manifests`` renders it; the session's runguard is unregistered meanwhile. The
controller-manager, scheduler and kwok run: the platform's Deployment scales, rolls out
and rolls back, a StatefulSet scales, a Job's Pods are orphaned by the garbage collector,
a failed Pod of a Job is retried, and the attacks of a user with edit rights (relabeling,
rewritten owners, a debug container, a shell by ``kubectl exec`` or ``attach``, and
through the status subresources) are refused by the apiserver with runguard's message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from webhook.serving.reach import reached_pods
from webhook.serving.shells import PodReader

from .cluster import Cluster
from .devcluster import Runguard
from .identities import Identity
from .nodes import simulated_node
from .runs import (
    REPO,
    Webhook,
    platform_identity,
    rule_ids,
    shipped_on_the_whole_path,
    until,
    wait_for_policy_label,
)

pytestmark = pytest.mark.e2e

RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/project": "p1"}
WAIT = 90.0  # controllers, scheduler, kwok on 2 busy cores: bounded, not a timing check
SECRET = "sec-api-r1"  # the run's own secret (policies/runpolicy.yaml: sec-*-{run})
NODE_KEY = "runguard.io/e2e"
TAINT = {"key": NODE_KEY, "value": "trust", "effect": "NoSchedule"}
ON_OUR_NODE = {"nodeSelector": {NODE_KEY: "trust"}, "tolerations": [{**TAINT, "operator": "Equal"}]}


@pytest.fixture(scope="module")
def shipped(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Runguard]:
    """runguard with the shipped policies, in place of the session's, and the controllers."""
    base = tmp_path_factory.mktemp("trust")
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base, REPO / "policies", serve_args=state)
    with shipped_on_the_whole_path(webhook, cluster, server, shells=True):
        # A node of this module's own: the shared ones hold what earlier modules left.
        node = simulated_node("kwok-trust-0", cpu="64", memory="256Gi",
                              labels={NODE_KEY: "trust"}, taints=[TAINT])  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=json.dumps(node), check=True)
        try:
            yield server
        finally:
            cluster.kubectl("delete", "node", "kwok-trust-0", "--wait=false")


@pytest.fixture
def space(cluster: Cluster, shipped: Runguard) -> Iterator[str]:
    """A namespace of the test's own, with the run's secret the platform created."""
    name = f"t-trust-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", name, check=True)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
              "stringData": {"token": "x"}}  # fmt: skip
    platform_identity(cluster).kubectl("apply", "-n", name, "-f", "-",
                                       input=json.dumps(secret), check=True)  # fmt: skip
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def user(cluster: Cluster) -> Identity:
    """A data scientist with edit rights in every namespace (not the platform)."""
    return cluster.user("mallory", ("developers",))


def container(image: str = "python:3.11") -> dict[str, Any]:
    return {"name": "main", "image": image, "envFrom": [{"secretRef": {"name": SECRET}}]}


def run_deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    labels = {**RUN, "app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container()], **ON_OUR_NODE},
            },
        },
    }


def get(cluster: Cluster, namespace: str, what: str) -> Any:
    done = cluster.kubectl("get", "-n", namespace, *what.split(), "-o", "json", check=True)
    return json.loads(done.stdout)


def run_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(cluster, namespace, f"pods -l {selector}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def wait_pods(cluster: Cluster, namespace: str, selector: str, count: int,
              image: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The ``count`` Pods (of ``image``) once they exist and are Running."""

    def probe() -> list[dict[str, Any]] | None:
        found = run_pods(cluster, namespace, selector)
        if image is not None:
            found = [p for p in found if p["spec"]["containers"][0]["image"] == image]
        running = [p for p in found if p.get("status", {}).get("phase") == "Running"]
        return running if len(running) == count and len(found) == count else None

    return until(f"{count} running Pods {selector} in {namespace}", probe, WAIT)


def platform_made(pod: dict[str, Any]) -> bool:
    """The Pod is the platform's (runguard's record, written for the RunPolicy that
    governs it) and kept the run's secret."""
    annotations = pod["metadata"].get("annotations", {})
    env_from = pod["spec"]["containers"][0].get("envFrom", [])
    return (
        annotations.get("runguard.io/platform") == "true"
        and annotations.get("runguard.io/platform-policy") == "digitalhub"
        and env_from == [{"secretRef": {"name": SECRET}}]
    )


def test_a_run_deployment_scales_rolls_out_and_rolls_back(cluster: Cluster, space: str) -> None:
    core = platform_identity(cluster)
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(run_deployment("serve")),
                 check=True)  # fmt: skip
    first = wait_pods(cluster, space, "app=serve", 1)
    assert all(platform_made(p) for p in first)
    # scale (the deployment-controller re-copies the Deployment's annotations to its
    # ReplicaSet: runguard keeps the ReplicaSet's own records)
    core.kubectl("scale", "-n", space, "deployment/serve", "--replicas=3", check=True)
    scaled = wait_pods(cluster, space, "app=serve", 3)
    assert all(platform_made(p) for p in scaled)
    # roll out a new image, then back
    core.kubectl("set", "image", "-n", space, "deployment/serve", "main=python:3.12", check=True)
    done = core.kubectl("rollout", "status", "-n", space, "deployment/serve", "--timeout=90s")
    assert done.returncode == 0, done.stderr
    rolled = wait_pods(cluster, space, "app=serve", 3, image="python:3.12")
    assert all(platform_made(p) for p in rolled)
    core.kubectl("rollout", "undo", "-n", space, "deployment/serve", check=True)
    done = core.kubectl("rollout", "status", "-n", space, "deployment/serve", "--timeout=90s")
    assert done.returncode == 0, done.stderr
    back = wait_pods(cluster, space, "app=serve", 3, image="python:3.11")
    assert all(platform_made(p) for p in back)
    # No controller update was refused; a Pod created before runguard's cache saw its
    # ReplicaSet is refused as ownership.unknown and retried by the controller (the only
    # refusal allowed here).
    events = get(cluster, space, "events")["items"]
    refused = [e["message"] for e in events if "denied the request" in e.get("message", "")]
    assert [m for m in refused if "ownership.unknown" not in rule_ids(m)] == []


def test_a_run_statefulset_scales(cluster: Cluster, space: str) -> None:
    core = platform_identity(cluster)
    labels = {**RUN, "app": "db"}
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container()], **ON_OUR_NODE}}},
    }  # fmt: skip
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(statefulset), check=True)
    wait_pods(cluster, space, "app=db", 1)
    core.kubectl("scale", "-n", space, "statefulset/db", "--replicas=2", check=True)
    assert all(platform_made(p) for p in wait_pods(cluster, space, "app=db", 2))


def test_a_job_orphaned_by_the_garbage_collector(cluster: Cluster, space: str) -> None:
    core = platform_identity(cluster)
    running = {"pod-complete.stage.kwok.x-k8s.io/delay": "300s"}  # kwok: no completion yet
    template = {"metadata": {"labels": {**RUN, "app": "etl"}, "annotations": running},
                "spec": {"restartPolicy": "Never", "containers": [container()],
                         **ON_OUR_NODE}}  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "etl"},
           "spec": {"template": template}}  # fmt: skip
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(job), check=True)
    (pod,) = wait_pods(cluster, space, "app=etl", 1)
    assert platform_made(pod)
    core.kubectl("delete", "-n", space, "job/etl", "--cascade=orphan", check=True)

    def orphaned() -> dict[str, Any] | None:
        found = get(cluster, space, f"pod/{pod['metadata']['name']}")
        return None if found["metadata"].get("ownerReferences") else found

    left = until("the Pod orphaned by the garbage collector", orphaned, WAIT)
    assert platform_made(left)


def test_a_run_job_retries_a_failed_pod(cluster: Cluster, space: str) -> None:
    """The job-controller replaces a failed Pod of the platform's Job (removing its
    tracking finalizer from the old one): the retry is the platform's, as the first was."""
    core = platform_identity(cluster)
    running = {"pod-complete.stage.kwok.x-k8s.io/delay": "300s"}  # kwok: no completion yet
    template = {"metadata": {"labels": {**RUN, "app": "retry"}, "annotations": running},
                "spec": {"restartPolicy": "Never", "containers": [container()],
                         **ON_OUR_NODE}}  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "retry"},
           "spec": {"backoffLimit": 2, "template": template}}  # fmt: skip
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(job), check=True)
    (first,) = wait_pods(cluster, space, "app=retry", 1)
    assert platform_made(first)
    # What a kubelet reports when the container exits 1 (kwok only simulates success).
    failed = json.dumps({"status": {"phase": "Failed"}})
    cluster.kubectl("patch", "-n", space, f"pod/{first['metadata']['name']}",
                    "--subresource=status", "--type=merge", "-p", failed, check=True)  # fmt: skip

    def retried() -> dict[str, Any] | None:
        for pod in run_pods(cluster, space, "app=retry"):
            fresh = pod["metadata"]["name"] != first["metadata"]["name"]
            if fresh and pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    second = until("the Job's retry of its failed Pod", retried, WAIT)
    assert platform_made(second)
    assert get(cluster, space, "job/retry")["status"].get("failed") == 1


def test_relabeling_a_run_out_of_its_policy_is_refused(cluster: Cluster, space: str) -> None:
    core = platform_identity(cluster)
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(run_deployment("web")),
                 check=True)  # fmt: skip
    (pod,) = wait_pods(cluster, space, "app=web", 1)
    name = f"pod/{pod['metadata']['name']}"
    assert pod["metadata"]["labels"]["runguard.io/policy"] == "digitalhub"
    mallory = user(cluster)
    for change in ("app.kubernetes.io/managed-by-", "dhcore/run-", "dhcore/framework=k8sbuild"):
        done = mallory.kubectl("label", "-n", space, name, change, "--overwrite")
        assert done.returncode != 0 and "scope.labels" in rule_ids(done.stderr), change
    # runguard's own label is put back as it was (its mutating webhook, on UPDATE)
    mallory.kubectl("label", "-n", space, name, "runguard.io/policy=builds", "--overwrite")
    assert get(cluster, space, name)["metadata"]["labels"]["runguard.io/policy"] == "digitalhub"
    # rewriting its owners to another controller's is refused too
    owners = [{"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "0000",
               "controller": True}]  # fmt: skip
    patch = json.dumps({"metadata": {"ownerReferences": owners}})
    done = mallory.kubectl("patch", "-n", space, name, "--type=merge", "-p", patch)
    assert done.returncode != 0 and "ownership.owner-changed" in rule_ids(done.stderr)
    # and a debug container in a Pod holding the platform's secret, even by an admin
    done = cluster.kubectl("debug", "-n", space, name, "--image=busybox", "--attach=false")
    assert done.returncode != 0 and "ownership.debug" in rule_ids(done.stderr)
    # the platform may still label it with anything else
    core.kubectl("label", "-n", space, name, "note=ok", check=True)


def pending_platform_pod(
    cluster: Cluster, namespace: str, name: str, labels: dict[str, str]
) -> Identity:
    """The platform's run Pod ``name``, Pending (no node matches: no IP, no kubelet, so
    a door runguard lets through opens onto nothing); the platform's identity."""
    nowhere = {"nodeSelector": {NODE_KEY: "nowhere"}}
    run = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
           "spec": {"containers": [container()], **nowhere}}  # fmt: skip
    core = platform_identity(cluster)
    core.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(run), check=True)
    assert platform_made(get(cluster, namespace, f"pod/{name}"))
    return core


def test_a_shell_in_the_platforms_pod_is_refused_to_a_user(cluster: Cluster, space: str) -> None:
    """``kubectl exec`` and ``kubectl attach`` (CONNECT, whose object is the command, not
    the Pod): runguard reads the Pod with its cluster-state credentials and refuses a
    user a shell in the platform's run, as it refuses her a debug container. The Pods stay
    Pending (no node matches), so a shell runguard lets through stops at the apiserver
    ("does not have a host assigned") and never dials a kubelet."""
    nowhere = {"nodeSelector": {NODE_KEY: "nowhere"}}
    core = pending_platform_pod(cluster, space, "run", RUN)
    mallory = user(cluster)
    for shell in (("exec", "run", "--", "sh"), ("attach", "run")):
        done = mallory.kubectl(shell[0], "-n", space, *shell[1:], timeout=60)
        assert done.returncode != 0 and "ownership.debug" in rule_ids(done.stderr), done.stderr
        assert "validate-shells.runguard.io" in done.stderr
    # a port into it, through the pods/proxy subresource (kubectl port-forward waits for
    # a Running Pod: the same webhook, the same judgment)
    done = mallory.kubectl("get", "--raw", f"/api/v1/namespaces/{space}/pods/run/proxy/")
    assert done.returncode != 0 and "ownership.debug" in rule_ids(done.stderr), done.stderr
    # the platform gets past runguard, and so does she into a Pod of her own
    done = core.kubectl("exec", "-n", space, "run", "--", "sh", timeout=60)
    assert "does not have a host assigned" in done.stderr, done.stderr
    plain = {"name": "main", "image": "python:3.11"}
    mine = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mine", "labels": RUN},
            "spec": {"containers": [plain], **nowhere}}  # fmt: skip
    mallory.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(mine), check=True)
    done = mallory.kubectl("exec", "-n", space, "mine", "--", "sh", timeout=60)
    assert "does not have a host assigned" in done.stderr, done.stderr
    # A platform Pod's own token (an MPI launcher running its workers by kubectl exec) is
    # the platform: the apiserver names the Pod in the token's user (userInfo.extra).
    # The same account without that Pod's token (impersonated, or a plain token) is not.
    unbound = cluster.service_account(space, "launcher")
    launcher = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "launcher", "labels": RUN},
                "spec": {"serviceAccountName": "launcher", "containers": [container()],
                         **nowhere}}  # fmt: skip
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(launcher), check=True)
    stored = get(cluster, space, "pod/launcher")
    assert platform_made(stored)
    bind = (
        "create",
        "token",
        "launcher",
        "-n",
        space,
        "--bound-object-kind=Pod",
        "--bound-object-name=launcher",
        f"--bound-object-uid={stored['metadata']['uid']}",
    )
    # minting a token bound to the platform's Pod is the platform's (or its node's) too
    done = mallory.kubectl(*bind)
    assert done.returncode != 0 and "ownership.debug" in rule_ids(done.stderr), done.stderr
    assert "validate-pod-tokens.runguard.io" in done.stderr
    token = core.kubectl(*bind, check=True).stdout.strip()  # fmt: skip
    path = cluster.directory / "identities" / f"launcher-{space}.kubeconfig"
    cluster._user_kubeconfig(path, "launcher", {"token": token}, space)
    bound = Identity(cluster, unbound.username, unbound.groups, path)
    done = bound.kubectl("exec", "-n", space, "run", "--", "sh", timeout=60)
    assert "does not have a host assigned" in done.stderr, done.stderr
    done = unbound.kubectl("exec", "-n", space, "run", "--", "sh", timeout=60)
    assert done.returncode != 0 and "ownership.debug" in rule_ids(done.stderr), done.stderr


def test_a_proxy_into_the_platforms_pod_is_refused_by_any_name_or_service(
    cluster: Cluster, space: str
) -> None:
    """A proxy is judged on the Pods it reaches: ``pods/proxy`` in every name form
    (``name:port``, ``scheme:name:port``), and ``services/proxy`` through the Pods the
    Service's selector picks or its Endpoints or EndpointSlices name (a Service without a
    selector whose endpoints an admin wrote). The Pods stay Pending (no node matches):
    with no IP the apiserver proxies nowhere ("address not allowed", "no endpoints
    available"), so a proxy runguard lets through never dials anything. The
    cluster-state role as shipped may read what the judgment needs."""
    nowhere = {"nodeSelector": {NODE_KEY: "nowhere"}}
    core = pending_platform_pod(cluster, space, "head", {**RUN, "ray.io/node-type": "head"})
    mallory = user(cluster)
    plain = {"name": "main", "image": "python:3.11"}
    mine = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "mine", "labels": {**RUN, "app": "mine"}},
            "spec": {"containers": [plain], **nowhere}}  # fmt: skip
    ports = [{"name": "dashboard", "port": 8265}]
    services = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"ports": ports, **({"selector": selector} if selector else {})}}
        for name, selector in (("ray", {"ray.io/node-type": "head"}), ("mine", {"app": "mine"}),
                               ("manual", None), ("sliced", None))
    ]  # fmt: skip
    listed = {"apiVersion": "v1", "kind": "List", "items": [mine, *services]}
    mallory.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(listed), check=True)
    # Endpoints and an EndpointSlice naming the platform's Pod, written by an admin (edit
    # cannot write either); the apiserver proxies through the first up to 1.36, the second
    # from 1.37
    target = {"kind": "Pod", "namespace": space, "name": "head"}
    manual = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "manual"},
              "subsets": [{"addresses": [{"ip": "192.0.2.10", "targetRef": target}],
                           "ports": [{"name": "dashboard", "port": 8265}]}]}  # fmt: skip
    sliced = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": "sliced-1",
                           "labels": {"kubernetes.io/service-name": "sliced"}},
              "addressType": "IPv4", "ports": [{"name": "dashboard", "port": 8265}],
              "endpoints": [{"addresses": ["192.0.2.11"], "targetRef": target}]}  # fmt: skip
    listed = {"apiVersion": "v1", "kind": "List", "items": [manual, sliced]}
    cluster.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(listed), check=True)

    def proxy(who: Identity, path: str) -> Any:
        return who.kubectl("get", "--raw", f"/api/v1/namespaces/{space}/{path}/proxy/")

    for path in ("services/ray", "services/ray:8265", "services/http:ray:dashboard",
                 "services/manual", "services/sliced", "pods/head:8265",
                 "pods/https:head:8443"):  # fmt: skip
        done = proxy(mallory, path)
        assert done.returncode != 0 and "ownership.debug" in rule_ids(done.stderr), done.stderr
        assert "validate-shells.runguard.io" in done.stderr
    done = proxy(mallory, "services/ray:8265")
    assert f"Service {space}/ray reaches Pod {space}/head" in done.stderr, done.stderr
    # the platform gets past runguard; so does she to her own Pod, by any name form (the
    # controller may not have written the Service's empty Endpoints yet: not found)
    for who, path in ((core, "services/ray:8265"), (mallory, "services/mine:8265")):
        done = proxy(who, path)
        name = path.split("/")[1].split(":")[0]
        assert "runguard" not in done.stderr and (
            "no endpoints available" in done.stderr
            or f'endpoints "{name}" not found' in done.stderr
        ), done.stderr
    for path in ("pods/mine:8080", "pods/http:mine:8080"):
        done = proxy(mallory, path)
        assert "address not allowed" in done.stderr, done.stderr
    # what a proxy to a Service reads, with the cluster-state role as shipped
    shipped = yaml.safe_load_all((REPO / "manifests/cluster-state/rbac.yaml").read_text())
    (role,) = [d for d in shipped if d and d["kind"] == "ClusterRole"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(role), check=True)
    account = cluster.service_account(f"{space}-rg", "runguard",
                                      cluster_role=role["metadata"]["name"])  # fmt: skip
    reads = PodReader(str(account.kubeconfig))
    for name, pods in (("manual", ["head"]), ("sliced", ["head"]), ("mine", ["mine"])):
        reached = reached_pods(reads, space, name)
        assert reached.error is None and [p["metadata"]["name"] for p in reached.items] == pods
    cluster.kubectl("delete", "namespace", f"{space}-rg", "--wait=false")


# Connections the apiserver serves into what runs (CONNECT subresources of core/v1)
# that runguard leaves to RBAC: nodes/proxy reaches every Pod of a node, and the same
# permission opens the kubelet's port without the apiserver (docs/dev/server.md).
RBACS_DOORS = {"nodes/proxy"}


def test_every_connection_the_apiserver_serves_is_routed_or_rbacs(
    cluster: Cluster, shipped: Runguard
) -> None:
    """Read from the real apiserver's discovery: every ``exec``, ``attach``,
    ``portforward`` and ``proxy`` subresource of core/v1 is routed to the shells webhook
    as installed, or declared RBAC's; one the apiserver gains fails this test until it
    is classified, so a new door into a Pod is never open unseen."""
    discovery = cluster.get_json("/api/v1")
    doors = {
        r["name"]
        for r in discovery["resources"]
        if r["name"].partition("/")[2] in ("exec", "attach", "portforward", "proxy")
    }
    assert {"pods/exec", "services/proxy", "nodes/proxy"} <= doors
    installed = get(cluster, "default", "validatingwebhookconfiguration runguard-shells")
    routed = {
        resource
        for hook in installed["webhooks"]
        for rule in hook["rules"]
        if "CONNECT" in rule["operations"]
        for resource in rule["resources"]
    }
    assert doors - RBACS_DOORS == routed


def test_an_operator_from_before_runguard_is_adopted_by_a_rollout_restart(
    cluster: Cluster, shipped: Runguard
) -> None:
    """KubeRay's operator Deployment created while runguard was not registered carries no
    record: once runguard is, a Pod its old ReplicaSet makes (an eviction) is refused its
    account (``ownership.service-account``). An admin's ``kubectl rollout restart``
    (``platform.installers``: system:masters by default) records the Deployment as the
    installer's, and the new ReplicaSet's Pods run as the operator again."""
    name = f"kuberay-operator-{os.urandom(2).hex()}"
    labels = {"app": name}
    operator = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "digitalhub"},
                "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"serviceAccountName": "kuberay-operator",
                                               "containers": [{"name": "op", "image": "busybox"}],
                                               **ON_OUR_NODE}}}}  # fmt: skip
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "kuberay-operator", "namespace": "digitalhub"}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(account), check=True)
    shipped.unregister(cluster)
    try:
        until("runguard out of the path", lambda: _unjudged(cluster), WAIT)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(operator), check=True)
        (first,) = wait_pods(cluster, "digitalhub", f"app={name}", 1)
    finally:
        shipped.register(cluster)
        cluster.kubectl("apply", "-f", "-", input=shipped.manifests_with("--shells"), check=True)
        wait_for_policy_label(cluster, "digitalhub", "the shipped policies' runguard again")
    try:
        # an eviction: the old ReplicaSet's next Pod is refused its account
        cluster.kubectl("delete", "pod", "-n", "digitalhub", first["metadata"]["name"],
                        "--wait=false", check=True)  # fmt: skip

        def refused() -> bool | None:
            events = get(cluster, "digitalhub", "events")["items"]
            return True if any(
                "ownership.service-account" in rule_ids(e.get("message", ""))
                and name in e.get("involvedObject", {}).get("name", "")
                for e in events
            ) else None  # fmt: skip

        until("the old ReplicaSet's Pod refused", refused, WAIT)
        done = cluster.kubectl("rollout", "restart", "-n", "digitalhub", f"deployment/{name}")
        assert done.returncode == 0, done.stderr
        annotations = get(cluster, "digitalhub", f"deployment/{name}")["metadata"]["annotations"]
        assert annotations["runguard.io/platform"] == "installer"
        assert annotations["runguard.io/requested-by"] == "runguard-e2e-admin"
        (pod,) = wait_pods(cluster, "digitalhub", f"app={name}", 1)
        assert pod["metadata"]["annotations"]["runguard.io/platform"] == "installer"
        assert pod["spec"]["serviceAccountName"] == "kuberay-operator"
    finally:
        cluster.kubectl("delete", "deployment", "-n", "digitalhub", name, "--wait=false")


def _unjudged(cluster: Cluster) -> bool | None:
    """A server dry run of a run Pod comes back without runguard's label."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": RUN},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    done = cluster.kubectl("create", "-n", "default", "--dry-run=server", "-o", "json",
                           "-f", "-", input=json.dumps(probe))  # fmt: skip
    if done.returncode != 0:
        return None
    return None if "runguard.io/policy" in json.loads(done.stdout)["metadata"].get(
        "labels", {}) else True  # fmt: skip


def test_a_users_pod_as_the_platforms_service_account_is_refused(
    cluster: Cluster, shipped: Runguard
) -> None:
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "impostor"},
            "spec": {"serviceAccountName": "core",
                     "containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    done = user(cluster).kubectl("create", "-n", "digitalhub", "--dry-run=server", "-f", "-",
                                 input=json.dumps(bare))  # fmt: skip
    assert done.returncode != 0 and "ownership.service-account" in rule_ids(done.stderr)


def test_a_run_cronjob_fires_suspends_and_its_run_id_is_fixed(cluster: Cluster, space: str) -> None:
    """The platform's CronJob fires (cronjob-controller, then job-controller: the Pod is the
    platform's), is suspended and resumed; nobody moves it to another run."""
    core = platform_identity(cluster)
    running = {"pod-complete.stage.kwok.x-k8s.io/delay": "300s"}  # kwok: no completion yet
    template = {
        "metadata": {"labels": {**RUN, "app": "nightly"}, "annotations": running},
        "spec": {"restartPolicy": "Never", "containers": [container()], **ON_OUR_NODE},
    }
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
            "spec": {"schedule": "* * * * *", "concurrencyPolicy": "Forbid",
                     "jobTemplate": {"spec": {"template": template}}}}  # fmt: skip
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(cron), check=True)

    def fired() -> dict[str, Any] | None:
        pods = [p for p in run_pods(cluster, space, "app=nightly")
                if p.get("status", {}).get("phase") == "Running"]  # fmt: skip
        return pods[0] if pods else None

    # the next minute, then the Job and its Pod: bounded, not a timing check
    assert platform_made(until("the CronJob's first Job's Pod", fired, 60 + WAIT))
    for suspend in ("true", "false"):
        patch = json.dumps({"spec": {"suspend": suspend == "true"}})
        core.kubectl("patch", "-n", space, "cronjob/nightly", "--type=merge", "-p", patch,
                     check=True)  # fmt: skip
    other_run = json.dumps({"spec": {"jobTemplate": {"spec": {"template": {
        "metadata": {"labels": {"dhcore/run": "r2"}}}}}}})  # fmt: skip
    done = user(cluster).kubectl("patch", "-n", space, "cronjob/nightly", "--type=merge",
                                 "-p", other_run)  # fmt: skip
    assert done.returncode != 0 and "scope.labels" in rule_ids(done.stderr)
    stored = get(cluster, space, "cronjob/nightly")
    assert stored["metadata"]["labels"]["runguard.io/policy"] == "digitalhub"
    assert stored["metadata"]["annotations"]["runguard.io/platform"] == "true"
    assert stored["metadata"]["annotations"]["runguard.io/platform-policy"] == "digitalhub"


STATUS_WRITER = "runguard-e2e-status-writer"


def status_writer(cluster: Cluster) -> Identity:
    """A user with edit rights who may also write the status of Pods, Jobs and Deployments
    (as a team's readiness-gate controller may): the status subresources store the labels,
    annotations and owners sent with them, since only the spec is put back."""
    rules = [
        {
            "apiGroups": [group],
            "resources": [f"{resource}/status"],
            "verbs": ["get", "patch", "update"],
        }
        for group, resource in (("", "pods"), ("batch", "jobs"), ("apps", "deployments"))
    ]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": STATUS_WRITER}, "rules": rules}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(role), check=True)
    trudy = cluster.user("trudy", ("developers",))
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"{STATUS_WRITER}:trudy"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": STATUS_WRITER},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": "trudy"}]}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(binding), check=True)
    return trudy


def patch_status(who: Identity, namespace: str, target: str, metadata: dict[str, Any]) -> Any:
    return who.kubectl("patch", "-n", namespace, target, "--subresource=status", "--type=merge",
                       "-p", json.dumps({"metadata": metadata}))  # fmt: skip


def records(obj: dict[str, Any]) -> tuple[Any, ...]:
    meta = obj["metadata"]
    annotations = meta.get("annotations", {})
    return (
        meta.get("labels", {}).get("runguard.io/policy"),
        annotations.get("runguard.io/requested-by"),
        annotations.get("runguard.io/platform"),
    )


def test_status_subresources_neither_relabel_nor_forge_records(
    cluster: Cluster, space: str
) -> None:
    """pods/status, jobs/status and deployments/status keep the labels, annotations and
    owners they are sent: a run cannot leave its RunPolicy through them, runguard's records
    are put back, and a stamped object's owners are not rewritten."""
    core = platform_identity(cluster)
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(run_deployment("gate")),
                 check=True)  # fmt: skip
    (pod,) = wait_pods(cluster, space, "app=gate", 1)
    name = f"pod/{pod['metadata']['name']}"
    trudy = status_writer(cluster)
    done = patch_status(trudy, space, name, {"labels": {"app.kubernetes.io/managed-by": None}})
    assert done.returncode != 0 and "scope.labels" in rule_ids(done.stderr), done.stderr
    forged = {"labels": {"runguard.io/policy": "builds"},
              "annotations": {"runguard.io/requested-by": "trudy"}}  # fmt: skip
    patch_status(trudy, space, name, forged)
    assert records(get(cluster, space, name)) == records(pod)
    # The status traffic itself goes on: kwok keeps the Pod Running through pods/status.
    assert get(cluster, space, name)["status"]["phase"] == "Running"

    # Her own run Deployment, scaled to 0: a forged platform record through
    # deployments/status would make the Pods of its next template the platform's.
    mine = run_deployment("mine", replicas=0)
    trudy.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(mine), check=True)
    before = records(get(cluster, space, "deployment/mine"))
    assert before[2] != "true"
    patch_status(trudy, space, "deployment/mine",
                 {"annotations": {"runguard.io/platform": "true"}})  # fmt: skip
    assert records(get(cluster, space, "deployment/mine")) == before

    # The platform's Job: its owners are not hers to write, through jobs/status either.
    running = {"pod-complete.stage.kwok.x-k8s.io/delay": "300s"}
    template = {"metadata": {"labels": {**RUN, "app": "gated"}, "annotations": running},
                "spec": {"restartPolicy": "Never", "containers": [container()],
                         **ON_OUR_NODE}}  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gated"},
           "spec": {"suspend": True, "template": template}}  # fmt: skip
    core.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(job), check=True)
    owners = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "mine",
               "uid": get(cluster, space, "deployment/mine")["metadata"]["uid"],
               "controller": True}]  # fmt: skip
    done = patch_status(trudy, space, "job/gated", {"ownerReferences": owners})
    assert done.returncode != 0 and "ownership.owner-changed" in rule_ids(done.stderr), done.stderr
    assert not get(cluster, space, "job/gated")["metadata"].get("ownerReferences")


def test_an_ephemeral_volumes_claim_is_refused_to_another_pod(cluster: Cluster, space: str) -> None:
    """The ephemeral-volume controller makes ``owner-scratch`` for a Pod's generic
    ephemeral volume, owned by that Pod; a Pod of the user's outside every selector
    mounting it by name is refused (``ownership.not-a-run``: runguard's cache holds the
    claim's owner), a claim of no Pod's is not; with the shipped cluster-state role,
    which the watch of ResourceClaims needs too."""
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    owner = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "owner",
                                                             "labels": {"app": "owner"}},
             "spec": {"containers": [{"name": "c", "image": "busybox"}],
                      "volumes": [{"name": "scratch", "ephemeral": {
                          "volumeClaimTemplate": {"spec": claim}}}], **ON_OUR_NODE}}  # fmt: skip
    cluster.kubectl("apply", "-n", space, "-f", "-", input=json.dumps(owner), check=True)

    def made() -> dict[str, Any] | None:
        done = cluster.kubectl("get", "-n", space, "pvc/owner-scratch", "-o", "json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    generated = until("the ephemeral volume's claim", made, WAIT)
    assert [(o["kind"], o["name"]) for o in generated["metadata"]["ownerReferences"]] == [
        ("Pod", "owner")
    ]
    mine = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "mine"},
            "spec": claim}  # fmt: skip
    user(cluster).kubectl("apply", "-n", space, "-f", "-", input=json.dumps(mine), check=True)

    def mounting(name: str) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "reader", "labels": {"app": "x"}},
                           "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                    "volumes": [{"name": "d", "persistentVolumeClaim": {
                                        "claimName": name}}]}})  # fmt: skip

    def tried(name: str) -> Any:
        return user(cluster).kubectl("create", "-n", space, "--dry-run=server", "-f", "-",
                                     input=mounting(name))  # fmt: skip

    refused = until("runguard's cache holding the claim's owner",
                    lambda: (d := tried("owner-scratch")).returncode != 0 and d, WAIT)  # fmt: skip
    assert rule_ids(refused.stderr) == {"ownership.not-a-run"}, refused.stderr
    own = tried("mine")
    assert own.returncode == 0, own.stderr
