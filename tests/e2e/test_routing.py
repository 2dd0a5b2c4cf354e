"""Fail closed, narrowly (docs/dev/guarantees.md, "Ownership"), through the real apiserver: the
webhook configurations ``runguard manifests`` renders for a policy that names its platform are
accepted, and while runguard is stopped exactly what it judges fails (run Pods, run
controllers, Pods outside the selector naming the platform's objects, objects created
with a platform name) and everything else is created.

A runguard of this module's own serves ``routing_policy()`` (ownership on, a selector
using every operator) and is registered beside the session's one under another name,
``runguard-routing``; it is stopped and started here, the session's never is. An object
refused because it is routed names this runguard's port in the apiserver's error.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client

from webhook.install import manifests

from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .runs import Webhook, controller, pod, rule_ids, session_policy, wait_for_admission

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
NAME = "runguard-routing"
EXCLUDED = "rg-routing-excluded"
PLATFORM_ACCOUNT = ("digitalhub", "core")  # namespace, ServiceAccount
PLATFORM = "system:serviceaccount:digitalhub:core"
STAMP = "runguard.io/requested-by"
RUN = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1", "dhcore/tier": "gold"}
SILVER_RUN = {**RUN, "dhcore/tier": "silver"}


def routing_policy() -> list[JSON]:
    """The session's platform policy with ownership on, a selector using In, NotIn,
    Exists and DoesNotExist, and a secret pattern with a dot."""
    documents = session_policy()
    spec = documents[0]["spec"]
    spec["selector"] = {
        "matchLabels": {"app.kubernetes.io/managed-by": "dhcore"},
        "matchExpressions": [
            {"key": "dhcore/run", "operator": "Exists"},
            {"key": "dhcore/tier", "operator": "In", "values": ["gold", "silver"]},
            {"key": "dhcore/kind", "operator": "NotIn", "values": ["build"]},
            {"key": "dhcore/exempt", "operator": "DoesNotExist"},
        ],
    }
    spec["excludeNamespaces"] = [*spec["excludeNamespaces"], EXCLUDED]
    spec["platform"] = {"identities": [PLATFORM]}
    spec["secrets"]["allowed"] = [*spec["secrets"]["allowed"], "registry.pull"]
    return documents


@dataclass
class Routing:
    """This module's runguard and the configurations registered for it."""

    server: Runguard
    configurations: list[JSON]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.server.port}"


def wait_until_called(cluster: Cluster, what: str, timeout: float = 60.0) -> None:
    """Until runguard answers through the apiserver: a claim with a platform name is
    refused to the admin (ownership.reserved-name). Bounded by ``timeout`` seconds."""
    claim = json.dumps(pvc("v-r1-probe"))
    deadline = time.monotonic() + timeout
    while True:
        done = cluster.kubectl(
            "create", "-n", "default", "--dry-run=server", "-o", "name", "-f", "-", input=claim
        )
        if done.returncode != 0 and "ownership.reserved-name" in rule_ids(done.stderr):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s: {done.stderr}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def routing(
    cluster: Cluster, webhook: Webhook, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Routing]:
    base = tmp_path_factory.mktemp("routing")
    server = Runguard(base, base / "policy")
    server.policy_dir.mkdir()
    (server.policy_dir / "policy.yaml").write_text(
        yaml.safe_dump_all(routing_policy(), sort_keys=False)
    )
    prepare_cluster(cluster)
    cluster.kubectl("create", "namespace", EXCLUDED)  # may exist already
    # One runguard in front of the cluster: the session's would also judge (and label)
    # the objects sent here, and this module's would judge what the session's labels.
    webhook.unregister(cluster)
    try:
        server.start()
        configurations = list(yaml.safe_load_all(server.manifests()))
        for configuration in configurations:
            configuration["metadata"]["name"] = NAME
            configuration["metadata"]["labels"]["app.kubernetes.io/name"] = NAME
        routing = Routing(server, configurations)
        listed = {"apiVersion": "v1", "kind": "List", "items": configurations}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        wait_until_called(cluster, "runguard-routing called")
        yield routing
    finally:
        cluster.kubectl(
            "delete", f"mutatingwebhookconfiguration/{NAME}",
            f"validatingwebhookconfiguration/{NAME}", "--ignore-not-found",
        )  # fmt: skip
        server.stop()
        webhook.register(cluster)
        wait_for_admission(cluster, active=True)


@pytest.fixture
def stopped(routing: Routing, cluster: Cluster) -> Iterator[Routing]:
    """This module's runguard, stopped (unreachable: connection refused); started again
    after the test, and called again before the next one."""
    routing.server.stop()
    try:
        yield routing
    finally:
        routing.server.start()
        wait_until_called(cluster, "runguard-routing called again")


# --- objects ------------------------------------------------------------------------


def pvc(name: str | None, **metadata: Any) -> JSON:
    """A claim named ``name`` (None: ``metadata`` says, e.g. ``generateName``)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {**({"name": name} if name else {}), **metadata},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def config_map(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}}


def secret(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "stringData": {"a": "1"}}  # fmt: skip


def claim_volume(claim: str) -> JSON:
    return {"name": "data", "persistentVolumeClaim": {"claimName": claim}}


def csi_volume(attributes: dict[str, str]) -> JSON:
    """An inline csi volume whose driver reads ``attributes`` (Azure File's secretName)."""
    return {"name": "share", "csi": {"driver": "file.csi.azure.com",
                                     "volumeAttributes": attributes}}  # fmt: skip


def with_env(env: list[JSON], env_from: list[JSON] | None = None) -> dict[str, Any]:
    """Pod spec keys: one container with ``env`` and ``envFrom``."""
    main: JSON = {"name": "main", "image": "python:3.11", "env": env}
    if env_from:
        main["envFrom"] = env_from
    return {"containers": [main]}


def secret_key(name: str) -> JSON:
    return {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "token"}}}


def stateful_set(name: str, template: JSON) -> JSON:
    deployment = controller("Deployment", name, template)
    return {**deployment, "kind": "StatefulSet",
            "spec": {**deployment["spec"], "serviceName": name}}  # fmt: skip


def replica_set(name: str, template: JSON) -> JSON:
    return {**controller("Deployment", name, template), "kind": "ReplicaSet"}


def daemon_set(name: str, template: JSON) -> JSON:
    deployment = controller("Deployment", name, template)
    spec = {k: v for k, v in deployment["spec"].items() if k != "replicas"}
    return {**deployment, "kind": "DaemonSet", "spec": spec}


def replication_controller(name: str, template: JSON) -> JSON:
    deployment = controller("Deployment", name, template)
    spec = {**deployment["spec"], "selector": {"app": name}}
    return {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


CREATE: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "Pod": lambda api: client.CoreV1Api(api).create_namespaced_pod,
    "PersistentVolumeClaim": lambda api: (
        client.CoreV1Api(api).create_namespaced_persistent_volume_claim
    ),
    "Secret": lambda api: client.CoreV1Api(api).create_namespaced_secret,
    "ConfigMap": lambda api: client.CoreV1Api(api).create_namespaced_config_map,
    "ReplicationController": lambda api: (
        client.CoreV1Api(api).create_namespaced_replication_controller
    ),
    "Job": lambda api: client.BatchV1Api(api).create_namespaced_job,
    "CronJob": lambda api: client.BatchV1Api(api).create_namespaced_cron_job,
    "Deployment": lambda api: client.AppsV1Api(api).create_namespaced_deployment,
    "StatefulSet": lambda api: client.AppsV1Api(api).create_namespaced_stateful_set,
    "ReplicaSet": lambda api: client.AppsV1Api(api).create_namespaced_replica_set,
    "DaemonSet": lambda api: client.AppsV1Api(api).create_namespaced_daemon_set,
}


def create(api_client: Any, namespace: str, obj: JSON, *, dry_run: bool = False) -> str | None:
    """Create ``obj`` with the Python client: None when the apiserver did, else its
    error message."""
    kwargs = {"dry_run": "All"} if dry_run else {}
    try:
        CREATE[obj["kind"]](api_client)(namespace, obj, _preload_content=False, **kwargs)
    except client.ApiException as error:
        return refusal(error)
    return None


def refusal(error: client.ApiException) -> str:
    """The message of the apiserver's Status in ``error``."""
    message: str = json.loads(error.body or "{}")["message"]
    return message


def unreachable(routing: Routing, webhook: str) -> str:
    """The start of the apiserver's error when ``webhook`` of this module's runguard
    cannot be called."""
    return (
        f'failed calling webhook "{webhook}": failed to call webhook: '
        f'Post "https://{routing.endpoint}/'
    )


# What runguard judges, and the first of its webhooks the apiserver calls for it.
ROUTED: dict[str, tuple[JSON, str]] = {
    "run Pod": (pod("run", RUN), manifests.MUTATING_WEBHOOK),
    "run Job": (controller("Job", "job", pod("x", RUN)), manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "run CronJob": (controller("CronJob", "cron", pod("x", RUN)),
                    manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "run Deployment": (controller("Deployment", "deploy", pod("x", SILVER_RUN)),
                       manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "run StatefulSet": (stateful_set("sts", pod("x", RUN)), manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "run ReplicaSet": (replica_set("rs", pod("x", RUN)), manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "run DaemonSet": (daemon_set("ds", pod("x", RUN)), manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "run ReplicationController": (replication_controller("rc", pod("x", RUN)),
                                  manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "Pod with a platform claim": (pod("copy", {"app": "tool"}, volumes=[claim_volume("v-r1-data")]),
                                  manifests.MUTATING_REFERENCES_WEBHOOK),
    "run labels but tier bronze, platform secret in env": (
        pod("bronze", {**RUN, "dhcore/tier": "bronze"}, **with_env([secret_key("sec-db-r1")])),
        manifests.MUTATING_REFERENCES_WEBHOOK),
    "Pod with a platform configMap in an init container's envFrom": (
        pod("init", initContainers=[{"name": "init", "image": "busybox:1.36", "envFrom": [
            {"configMapRef": {"name": "init-config-map-r1"}}]}]),
        manifests.MUTATING_REFERENCES_WEBHOOK),
    "Pod with a platform pull secret": (pod("pull", imagePullSecrets=[{"name": "registry.pull"}]),
                                        manifests.MUTATING_REFERENCES_WEBHOOK),
    "Pod with a projected platform secret": (
        pod("projected", volumes=[{"name": "p", "projected": {"sources": [
            {"secret": {"name": "sec-x-r9"}}]}}]),
        manifests.MUTATING_REFERENCES_WEBHOOK),
    # a claim of any name may be one made for another Pod: runguard reads its owner
    "Pod with an ordinary claim": (pod("claim", {"app": "tool"},
                                       volumes=[claim_volume("team-datasets")]),
                                   manifests.MUTATING_REFERENCES_WEBHOOK),
    "Pod naming an existing device claim": (
        pod("device", {"app": "tool"}, resourceClaims=[{"name": "g", "resourceClaimName": "x"}]),
        manifests.MUTATING_REFERENCES_WEBHOOK),
    "Pod giving a csi driver the platform's secret": (
        pod("csi", volumes=[csi_volume({"shareName": "data", "secretName": "sec-db-r1"})]),
        manifests.MUTATING_REFERENCES_WEBHOOK),
    "Job, no run labels, platform claim": (
        controller("Job", "copyjob", pod("x", {"app": "tool"},
                                         volumes=[claim_volume("v-r1-data")])),
        manifests.MUTATING_CONTROLLERS_WEBHOOK),
    "PVC with a platform name": (pvc("v-r1-data"), manifests.RESERVED_NAMES_WEBHOOK),
    "PVC with a generated platform name": (pvc(None, generateName="v-r1-"),
                                           manifests.RESERVED_NAMES_WEBHOOK),
    "Secret with a platform name": (secret("sec-db-r1"), manifests.RESERVED_NAMES_WEBHOOK),
    "ConfigMap with a platform name": (config_map("init-config-map-r1"),
                                       manifests.RESERVED_NAMES_WEBHOOK),
}  # fmt: skip

# What runguard does not judge: created while it is down.
NOT_ROUTED: dict[str, JSON] = {
    "plain Pod": pod("plain", {"app": "tool"}),
    "Pod with ordinary names": pod(
        "ordinary",
        volumes=[{"name": "c", "configMap": {"name": "settings"}},
                 csi_volume({"shareName": "data", "secretName": "sec-db"}),
                 {"name": "s", "secret": {"secretName": "registryxpull"}}],
        imagePullSecrets=[{"name": "sec-db"}],
        **with_env([secret_key("v-r1-data")], [{"configMapRef": {"name": "init-config-map"}}]),
    ),
    "run labels but tier bronze": pod("bronze", {**RUN, "dhcore/tier": "bronze"}),
    "run labels but kind build": pod("build", {**RUN, "dhcore/kind": "build"}),
    "run labels but exempt": pod("exempt", {**RUN, "dhcore/exempt": ""}),
    "managed-by only": pod("managed", {"app.kubernetes.io/managed-by": "dhcore"}),
    "Deployment without run labels": controller("Deployment", "web", pod("web", {"app": "web"})),
    "Job without run labels": controller("Job", "batch", pod("batch", {"app": "batch"})),
    "CronJob without run labels": controller("CronJob", "nightly", pod("n", {"app": "n"})),
    "ConfigMap with an ordinary name": config_map("settings"),
    "Secret with an ordinary name": secret("sec-db"),
    "PVC with an ordinary name": pvc("team-datasets"),
    "PVC named like a platform claim without its run": pvc("v-data"),
}  # fmt: skip


# --- the configurations as stored ----------------------------------------------------


def test_apiserver_stores_the_rendered_configurations(cluster: Cluster, routing: Routing) -> None:
    for rendered in routing.configurations:
        done = cluster.kubectl("get", rendered["kind"], NAME, "-o", "json", check=True)
        stored = json.loads(done.stdout)["webhooks"]
        assert [h["name"] for h in stored] == [h["name"] for h in rendered["webhooks"]]
        for want, got in zip(rendered["webhooks"], stored, strict=True):
            assert got["failurePolicy"] == "Fail"
            assert got["rules"] == want["rules"]
            assert got.get("matchConditions") == want.get("matchConditions")
            assert got.get("objectSelector", {}) == want.get("objectSelector", {})
    names = {h["name"] for c in routing.configurations for h in c["webhooks"]}
    assert names == {
        manifests.MUTATING_WEBHOOK, manifests.MUTATING_CONTROLLERS_WEBHOOK,
        manifests.MUTATING_REFERENCES_WEBHOOK, manifests.VALIDATING_WEBHOOK,
        manifests.CONTROLLERS_WEBHOOK, manifests.VALIDATING_REFERENCES_WEBHOOK,
        manifests.RESERVED_NAMES_WEBHOOK,
    }  # fmt: skip


# --- runguard unreachable ------------------------------------------------------------


def test_unreachable_runguard_refuses_exactly_what_it_judges(
    stopped: Routing, api_client: Any, namespace: str
) -> None:
    refused = {}
    for case, (obj, webhook) in ROUTED.items():
        error = create(api_client, namespace, copy.deepcopy(obj))
        refused[case] = error is not None and unreachable(stopped, webhook) in error
        assert error is None or "connection refused" in error, (case, error)
    assert refused == dict.fromkeys(ROUTED, True)

    created = {case: create(api_client, namespace, copy.deepcopy(obj))
               for case, obj in NOT_ROUTED.items()}  # fmt: skip
    assert created == dict.fromkeys(NOT_ROUTED)

    # An excluded namespace is never routed, runs included.
    for case in ("run Pod", "run Job", "PVC with a platform name"):
        assert create(api_client, EXCLUDED, ROUTED[case][0], dry_run=True) is None, case


def test_unreachable_runguard_refuses_updates_that_enter_its_scope(
    stopped: Routing, api_client: Any, namespace: str
) -> None:
    """UPDATE: a controller's condition reads the new object; ``kubectl debug`` adding a
    container that names a platform secret is judged, one that does not is not."""
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    assert create(api_client, namespace, NOT_ROUTED["Deployment without run labels"]) is None
    relabel = {"metadata": {"labels": {"team": "a"}}}
    apps.patch_namespaced_deployment("web", namespace, relabel, _preload_content=False)
    into_a_run = {"spec": {"template": {"metadata": {"labels": RUN}}}}
    with pytest.raises(client.ApiException) as raised:
        apps.patch_namespaced_deployment("web", namespace, into_a_run, _preload_content=False)
    # (the mutating webhook is called first: on UPDATE it keeps runguard's records)
    assert unreachable(stopped, manifests.MUTATING_CONTROLLERS_WEBHOOK) in refusal(raised.value)

    assert create(api_client, namespace, pod("tool", {"app": "tool"})) is None
    running = api_client.sanitize_for_serialization(core.read_namespaced_pod("tool", namespace))

    def debug(name: str, **extra: Any) -> None:
        body = copy.deepcopy(running)
        body["spec"]["ephemeralContainers"] = [{"name": name, "image": "busybox:1.36", **extra}]
        core.replace_namespaced_pod_ephemeralcontainers(
            "tool", namespace, body, dry_run="All", _preload_content=False
        )

    debug("plain")
    with pytest.raises(client.ApiException) as raised:
        debug("thief", envFrom=[{"secretRef": {"name": "sec-db-r1"}}])
    message = refusal(raised.value)
    assert unreachable(stopped, manifests.VALIDATING_REFERENCES_WEBHOOK) in message


def token_secret(account: str) -> JSON:
    annotations = {"kubernetes.io/service-account.name": account}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": f"token-{account}", "annotations": annotations}}  # fmt: skip


def test_unreachable_runguard_refuses_a_token_secret_for_the_platforms_account(
    stopped: Routing, cluster: Cluster, api_client: Any
) -> None:
    """A Secret the token controller would fill with the platform's token is judged
    (``ownership.service-account``) where the account lives; one for another account,
    or in another namespace, is not."""
    namespace, account = PLATFORM_ACCOUNT
    cluster.service_account(namespace, account, cluster_role=None)
    error = create(api_client, namespace, token_secret(account), dry_run=True)
    assert error is not None and unreachable(stopped, manifests.RESERVED_NAMES_WEBHOOK) in error
    assert create(api_client, namespace, token_secret("default"), dry_run=True) is None
    cluster.kubectl("create", "namespace", "rg-routing-tokens")  # may exist already
    assert create(api_client, "rg-routing-tokens", token_secret(account), dry_run=True) is None


def env_pod(references: int, length: int) -> JSON:
    """A Pod outside the selector whose one container reads ``references`` secrets with
    ordinary names of ``length`` characters, none the platform's."""
    env = [secret_key(f"s{i}-".ljust(length, "x")) for i in range(references)]
    return pod("env", {"app": "tool"}, **with_env(env))


def test_cost_budget_of_the_conditions(stopped: Routing, api_client: Any, namespace: str) -> None:
    """The apiserver does not estimate a condition's cost when it stores it, but bounds
    it at run time (1,000,000 units) and fails the request past that, as for an
    unreachable webhook (failurePolicy Fail): a Pod reading a thousand secrets with the
    longest names is within it (and not routed); one reading 6000 is refused whether
    runguard is up or not, closed rather than open."""
    assert create(api_client, namespace, env_pod(1000, 253), dry_run=True) is None
    error = create(api_client, namespace, env_pod(6000, 253), dry_run=True)
    assert error is not None and "cost limit exceeded" in error, error


# --- runguard up ---------------------------------------------------------------------


def stamp(api_client: Any, namespace: str, job: str) -> str | None:
    """The ``runguard.io/requested-by`` annotation of Job ``job``."""
    stored = client.BatchV1Api(api_client).read_namespaced_job(job, namespace)
    annotations = api_client.sanitize_for_serialization(stored)["metadata"].get("annotations")
    return (annotations or {}).get(STAMP)


def test_reachable_runguard_admits_runs_and_judges_what_it_is_sent(
    routing: Routing, cluster: Cluster, api_client: Any, namespace: str
) -> None:
    job = controller("Job", "finetune", pod("finetune", RUN))
    assert create(api_client, namespace, job) is None
    assert stamp(api_client, namespace, "finetune") == "runguard-e2e-admin"

    # The platform's run using a platform claim, and the claim, created by the platform
    # (allowed everything in the namespace: `edit` is empty without the controller that
    # aggregates it).
    platform = cluster.service_account(*PLATFORM_ACCOUNT, cluster_role=None)
    assert platform.username == PLATFORM
    cluster.kubectl(
        "create", "rolebinding", "platform", "-n", namespace, "--clusterrole=cluster-admin",
        f"--serviceaccount={':'.join(PLATFORM_ACCOUNT)}", check=True,
    )  # fmt: skip
    platform_api = platform.api_client()
    try:
        train = controller("Job", "train", pod("train", RUN, volumes=[claim_volume("v-r1-data")]))
        assert create(platform_api, namespace, train) is None
        assert create(platform_api, namespace, pvc("v-r1-data")) is None
    finally:
        platform_api.close()
    assert stamp(api_client, namespace, "train") == PLATFORM

    # The same names, asked for by someone else: judged, and denied.
    copied = create(api_client, namespace, ROUTED["Pod with a platform claim"][0])
    assert copied is not None and "ownership.not-a-run" in rule_ids(copied), copied
    assert f'"{manifests.VALIDATING_REFERENCES_WEBHOOK}" denied the request' in copied
    reserved = create(api_client, namespace, pvc("v-r1-other"))
    assert reserved is not None and "ownership.reserved-name" in rule_ids(reserved), reserved
    assert f'"{manifests.RESERVED_NAMES_WEBHOOK}" denied the request' in reserved
