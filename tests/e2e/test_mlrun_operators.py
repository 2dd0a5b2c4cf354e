"""MLRun's operators through the real apiserver: the example MLRun policy, the MPIJob and
SparkApplication CRDs (reduced: namespaced, any content), the chain whole.

runguard serves ``policies/examples/mlrun`` with ``enforcement: Deny`` (as an
installation runs it once the warnings stop), its cluster state watch following the
operators' kinds, in place of the session's runguard. The MLRun API
(``mlrun:mlrun-api``) and a user each create an MPIJob and a SparkApplication; the
operators' ServiceAccounts (``mlrun:mpi-operator``, ``mlrun:spark-operator``) then
create the Pods as the operators build them (mpi-operator v0.3.0's worker, the
spark-operator's driver once its webhook made the SparkApplication the owner,
tests/platforms/mlrun/). From the platform's objects the Pods keep MLRun's secrets,
IPC_LOCK, the operator's ConfigMaps and the V3IO daemon's node directories; from the
user's they are refused, and a Pod the user submits herself gets none of it either.
The Spark driver's account (``sparkapp`` of ``default-tenant``, the namespace the
example names) then creates executors owned by the driver Pod, found in runguard's
cache of the Pods it governs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import Cluster
from .devcluster import Runguard
from .identities import Identity
from .runs import REPO, Webhook, instead_of_the_session, poll, wait_for_policy_label

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
RBAC = "rbac.authorization.k8s.io"
MPIJOB = ("kubeflow.org", "v1", "MPIJob", "mpijobs")
SPARK = ("sparkoperator.k8s.io", "v1beta2", "SparkApplication", "sparkapplications")
PROJECT = "fraud"
RUN = {"mlrun/class": "mpijob", "mlrun/project": PROJECT, "mlrun/function": "trainer"}
AUTH = "mlrun-auth-secrets.c29a30e28e4a11b58caac2394aaac55767ddf697862cd15298f2354a"
PROJECT_SECRET = f"mlrun-project-secrets-{PROJECT}"


# A *.k8s.io group needs the approval annotation; the chart's CRD carries this one
# (kubeflow/spark-operator chart 1.1.25 crds/sparkoperator.k8s.io_sparkapplications.yaml).
APPROVED = {"api-approved.kubernetes.io":
            "https://github.com/GoogleCloudPlatform/spark-on-k8s-operator/pull/1298"}  # fmt: skip


def crd(group: str, version: str, kind: str, plural: str) -> JSON:
    """An operator's CRD reduced to what the apiserver needs: namespaced, any content."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    annotations = APPROVED if group.endswith(".k8s.io") else {}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "annotations": annotations},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                      "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{"name": version, "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}}],
        },
    }  # fmt: skip


def apply(cluster: Cluster, objects: list[JSON]) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)


def example_policies(directory: Path) -> Path:
    """The MLRun example, its ``mlrun`` RunPolicy enforcing (Deny)."""
    directory.mkdir()
    for source in sorted((REPO / "policies" / "examples" / "mlrun").glob("*.yaml")):
        documents = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for document in documents:
            if document["kind"] == "RunPolicy" and document["metadata"]["name"] == "mlrun":
                document["spec"]["enforcement"] = "Deny"
        (directory / source.name).write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return directory


@dataclass
class Served:
    server: Runguard
    mlrun: Identity  # the MLRun API
    mpi: Identity  # the mpi-operator
    spark: Identity  # the spark-operator
    user: Identity


@pytest.fixture(scope="module")
def served(cluster: Cluster, webhook: Webhook, tmp_path_factory: Any) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("mlrun-operators")
    definitions = [crd(*MPIJOB), crd(*SPARK)]
    apply(cluster, definitions)
    for definition in definitions:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        f"crd/{definition['metadata']['name']}", check=True)  # fmt: skip
    mlrun = cluster.service_account("mlrun", "mlrun-api")
    mpi = cluster.service_account("mlrun", "mpi-operator")
    spark = cluster.service_account("mlrun", "spark-operator")
    user = cluster.user("mallory-mlrun", ("developers",))
    # What each needs beyond "edit", which never covers a custom resource.
    accounts = [{"kind": "ServiceAccount", "name": n, "namespace": "mlrun"}
                for n in ("mlrun-api", "mpi-operator", "spark-operator")]  # fmt: skip
    apply(cluster, [
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole",
         "metadata": {"name": "rg-e2e-mlrun-operators"},
         "rules": [{"apiGroups": [MPIJOB[0]], "resources": [MPIJOB[3]], "verbs": ["*"]},
                   {"apiGroups": [SPARK[0]], "resources": [SPARK[3]], "verbs": ["*"]},
                   {"apiGroups": [""], "resources": ["pods", "secrets", "configmaps"],
                    "verbs": ["*"]}]},
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "rg-e2e-mlrun-operators"},
         "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "rg-e2e-mlrun-operators"},
         "subjects": [*accounts, {"kind": "User", "name": "mallory-mlrun", "apiGroup": RBAC}]},
    ])  # fmt: skip
    state = ("--cluster-state", str(cluster.kubeconfig))
    server = Runguard(base, example_policies(base / "policies"), serve_args=state)
    with instead_of_the_session(webhook, cluster, server):
        wait_for_policy_label(cluster, "mlrun", "this module's runguard called",
                              labels={"mlrun/class": "job", "mlrun/project": PROJECT})  # fmt: skip
        poll("the operators' kinds listed", lambda: operator_kinds_synced(server), 90)
        yield Served(server, mlrun, mpi, spark, user)


def operator_kinds_synced(server: Runguard) -> bool:
    status, body = server.readyz()
    state = body.get("clusterState", {})
    kinds = [*(f"{group}/{kind}" for group, _, kind, _ in (MPIJOB, SPARK)), "Pod"]
    listed = all(k in state.get("objects", {}) and k not in state["waiting"] for k in kinds)
    return status == 200 and listed


@pytest.fixture
def space(cluster: Cluster, served: Served) -> Iterator[str]:
    """A namespace of the test's own with MLRun's secrets, created by the MLRun API."""
    name = f"t-mlrun-ops-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", name, check=True)
    secrets = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": n},
                "stringData": {"accessKey": "x"}} for n in (AUTH, PROJECT_SECRET)]  # fmt: skip
    for secret in secrets:
        served.mlrun.kubectl("apply", "-n", name, "-f", "-", input=json.dumps(secret), check=True)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def create(who: Identity, namespace: str, obj: JSON, *args: str) -> tuple[JSON | None, str]:
    """``obj`` as the apiserver stored it, or None when it was refused; and stderr (the
    warnings, or the denial)."""
    done = who.kubectl("create", "-n", namespace, "-o", "json", *args, "-f", "-",
                       input=json.dumps(obj))  # fmt: skip
    if done.returncode != 0:
        assert "denied the request" in done.stderr, done.stderr
        return None, done.stderr
    created: JSON = json.loads(done.stdout)
    return created, done.stderr


def custom(who: Identity, namespace: str, what: tuple[str, str, str, str], name: str) -> JSON:
    group, version, kind, _ = what
    made, _ = create(who, namespace, {"apiVersion": f"{group}/{version}", "kind": kind,
                                      "metadata": {"name": name, "labels": RUN},
                                      "spec": {}})  # fmt: skip
    assert made is not None
    return made


def cached(served: Served, what: tuple[str, str, str, str], count: int) -> bool:
    status, body = served.server.readyz()
    objects = body.get("clusterState", {}).get("objects", {})
    return status == 200 and objects.get(f"{what[0]}/{what[2]}", 0) >= count


def volume_sources(pod: JSON) -> list[tuple[str, str | None, str | None]]:
    """Each volume's name, node path and ConfigMap, as sent or stored (defaults aside)."""
    return [(v["name"], v.get("hostPath", {}).get("path"), v.get("configMap", {}).get("name"))
            for v in pod["spec"].get("volumes", [])]  # fmt: skip


def owned_by(owner: JSON) -> list[JSON]:
    meta = owner["metadata"]
    return [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
             "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]  # fmt: skip


def secret_env() -> list[JSON]:
    return [
        {"name": "V3IO_ACCESS_KEY",
         "valueFrom": {"secretKeyRef": {"name": AUTH, "key": "accessKey"}}},
        {"name": "MLRUN_K8S_SECRET__DB_PASSWORD",
         "valueFrom": {"secretKeyRef": {"name": PROJECT_SECRET, "key": "accessKey"}}},
    ]  # fmt: skip


def mpi_worker(job: JSON) -> JSON:
    """Worker 0 as mpi-operator v0.3.0 creates it from MLRun's template."""
    name = job["metadata"]["name"]
    labels = {**RUN, "mlrun/job": name, "group-name": "kubeflow.org", "mpi-job-name": name,
              "mpi-job-role": "worker", "replica-index": "0"}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-worker-0", "labels": labels,
                     "ownerReferences": owned_by(job)},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "base", "image": "mlrun/mlrun-gpu:1.7.0", "command": ["sleep"],
                "args": ["365d"], "env": secret_env(),
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                "volumeMounts": [{"name": "mpi-job-config", "mountPath": "/etc/mpi"}],
            }],
            "volumes": [{"name": "mpi-job-config", "configMap": {
                "name": f"{name}-config",
                "items": [{"key": "kubexec.sh", "path": "kubexec.sh", "mode": 365}]}}],
        },
    }  # fmt: skip


def spark_driver(app: JSON | None, namespace: str) -> JSON:
    """The driver as the spark-operator submits it, after its webhook made ``app`` the
    owner and added the V3IO daemon mounts of ``with_igz_spark``."""
    labels = {**RUN, "mlrun/class": "spark", "spark-role": "driver"}
    daemon = [
        ("shm", f"/var/run/iguazio/dayman-shm/{namespace}", "/dev/shm"),
        ("v3iod-comm", f"/var/run/iguazio/dayman/{namespace}", "/var/run/iguazio/dayman"),
    ]
    volumes = [{"name": n, "hostPath": {"path": p, "type": ""}} for n, p, _ in daemon]
    volumes += [
        {"name": "v3io-config", "configMap": {"name": "spark-operator-v3io-config"}},
        {
            "name": "spark-conf-volume-driver",
            "configMap": {"name": "spark-drv-8f2e4a6c1b3d5e7f-conf-map"},
        },
    ]
    mounts = [{"name": n, "mountPath": m} for n, _, m in daemon]
    mounts += [
        {"name": "v3io-config", "mountPath": "/etc/config/v3io"},
        {"name": "spark-conf-volume-driver", "mountPath": "/opt/spark/conf"},
    ]
    meta: JSON = {"name": "spark-etl-driver", "labels": labels}
    if app is not None:
        meta["ownerReferences"] = owned_by(app)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "spark-kubernetes-driver",
                                 "image": "iguazio/spark-app:3.2.3-b2", "env": secret_env(),
                                 "volumeMounts": mounts}],
                 "volumes": volumes},
    }  # fmt: skip


def env_names(pod: JSON) -> list[str]:
    return [e["name"] for e in pod["spec"]["containers"][0].get("env", [])]


def test_the_mpi_operators_pod_keeps_what_mlrun_gave_the_platforms_mpijob(
    served: Served, space: str
) -> None:
    mine = custom(served.mlrun, space, MPIJOB, "train-1")
    theirs = custom(served.user, space, MPIJOB, "train-2")
    assert mine["metadata"]["annotations"]["runguard.io/platform"] == "true"
    assert "runguard.io/platform" not in theirs["metadata"].get("annotations", {})
    poll("both MPIJobs in runguard's cache", lambda: cached(served, MPIJOB, 2))
    # The operator's ConfigMap is not a name the platform reserves: the operator makes it.
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "train-1-config", "ownerReferences": owned_by(mine)},
        "data": {"kubexec.sh": "#!/bin/sh\n", "hostfile": "train-1-worker-0 slots=1\n"},
    }
    made, _ = create(served.mpi, space, config)  # fmt: skip
    assert made is not None
    pod, warnings = create(served.mpi, space, mpi_worker(mine))
    assert pod is not None, warnings
    assert pod["metadata"]["annotations"]["runguard.io/platform"] == "true"
    assert env_names(pod) == ["V3IO_ACCESS_KEY", "MLRUN_K8S_SECRET__DB_PASSWORD"]
    assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == "train-1-config"
    # The same worker of the user's MPIJob: its ConfigMap is refused ...
    refused, denial = create(served.mpi, space, mpi_worker(theirs), "--dry-run=server")
    assert refused is None and "volumes.pre-existing" in denial, denial
    assert "train-2-config" in denial
    # ... and without it, it is admitted with nothing of the platform's.
    bare = mpi_worker(theirs)
    bare["spec"]["volumes"] = []
    bare["spec"]["containers"][0]["volumeMounts"] = []
    pod, warnings = create(served.mpi, space, bare, "--dry-run=server")
    assert pod is not None, warnings
    assert env_names(pod) == []
    assert "add" not in pod["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert "runguard.io/platform" not in pod["metadata"].get("annotations", {})


def test_the_spark_driver_keeps_the_v3io_daemon_mounts_of_the_platforms_application(
    served: Served, space: str
) -> None:
    mine = custom(served.mlrun, space, SPARK, "spark-etl-1")
    theirs = custom(served.user, space, SPARK, "spark-etl-2")
    poll("both SparkApplications in runguard's cache",
         lambda: cached(served, SPARK, 2))  # fmt: skip
    driver = spark_driver(mine, space)
    pod, warnings = create(served.spark, space, driver)
    assert pod is not None, warnings
    assert volume_sources(pod)[:4] == volume_sources(driver)
    assert env_names(pod) == ["V3IO_ACCESS_KEY", "MLRUN_K8S_SECRET__DB_PASSWORD"]
    # The user's SparkApplication, and the user's own Pod: no node directory.
    for who, app in ((served.spark, theirs), (served.user, None)):
        refused, denial = create(who, space, spark_driver(app, space), "--dry-run=server")
        assert refused is None and "volumes.forbidden-type" in denial, denial
        assert "only runs the platform creates may use it" in denial
    # Another namespace's daemon is not this run's, even for the platform's driver.
    elsewhere = spark_driver(mine, "other-tenant")
    refused, denial = create(served.spark, space, elsewhere, "--dry-run=server")
    assert refused is None and "/var/run/iguazio/dayman/other-tenant" in denial, denial
    # The label the spark-operator's webhook finds a driver's owner by is not the user's
    # to write: her application naming the platform's would get its driver owned by it.
    group, version, kind, _ = SPARK
    borrowed = {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": "spark-etl-3", "labels": RUN},
        "spec": {"driver": {"labels": {"sparkoperator.k8s.io/app-name": "spark-etl-1"}}},
    }
    refused, denial = create(served.user, space, borrowed, "--dry-run=server")
    assert refused is None and "ownership.reserved-label" in denial, denial


# --- Spark executors: created by the driver, as sparkapp, owned by the driver Pod -------

TENANT = "default-tenant"  # the example's sparkapp operator is this namespace's account


@pytest.fixture
def tenant(cluster: Cluster, served: Served) -> Iterator[Identity]:
    """The example's runs' namespace, MLRun's secrets in it; its sparkapp account."""
    sparkapp = cluster.service_account(TENANT, "sparkapp")
    # The driver creates its executors (the spark-operator chart binds its apps' account so).
    apply(cluster, [
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
         "metadata": {"name": "rg-e2e-sparkapp", "namespace": TENANT},
         "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "rg-e2e-mlrun-operators"},
         "subjects": [{"kind": "ServiceAccount", "name": "sparkapp", "namespace": TENANT}]},
    ])  # fmt: skip
    poll("sparkapp may create pods", lambda: sparkapp.kubectl(
        "auth", "can-i", "create", "pods", "-n", TENANT).returncode == 0)  # fmt: skip
    secrets = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": n},
                "stringData": {"accessKey": "x"}} for n in (AUTH, PROJECT_SECRET)]  # fmt: skip
    for secret in secrets:
        served.mlrun.kubectl("apply", "-n", TENANT, "-f", "-", input=json.dumps(secret),
                             check=True)  # fmt: skip
    yield sparkapp
    cluster.kubectl("delete", "namespace", TENANT, "--wait=false")


def bare(pod: JSON) -> JSON:
    """``pod`` without MLRun's secrets and volumes: what anyone may run."""
    pod = json.loads(json.dumps(pod))
    pod["spec"]["volumes"] = []
    container = pod["spec"]["containers"][0]
    container["env"], container["volumeMounts"] = [], []
    return pod


def spark_executor(driver: JSON | None, namespace: str) -> JSON:
    """Executor 1 as the driver creates it (BasicExecutorFeatureStep): owned by the driver
    Pod (controller, no blockOwnerDeletion), as sparkapp, with the driver's mounts and
    the ConfigMap the driver makes for its executors."""
    pod = spark_driver(None, namespace)
    labels = {**RUN, "mlrun/class": "spark", "spark-role": "executor", "spark-exec-id": "1"}
    pod["metadata"] = {"name": "spark-etl-exec-1", "labels": labels}
    if driver is not None:
        meta = driver["metadata"]
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod",
                                               "name": meta["name"], "uid": meta["uid"],
                                               "controller": True}]  # fmt: skip
    pod["spec"]["serviceAccountName"] = "sparkapp"
    pod["spec"]["containers"][0]["name"] = "spark-kubernetes-executor"
    conf = pod["spec"]["volumes"][-1]
    conf["name"], conf["configMap"]["name"] = "spark-conf-volume-exec", "spark-exec-3e5a-conf-map"
    pod["spec"]["containers"][0]["volumeMounts"][-1]["name"] = "spark-conf-volume-exec"
    return pod


def test_a_spark_executor_keeps_what_the_platforms_driver_has(
    served: Served, tenant: Identity
) -> None:
    sparkapp = tenant
    mine = custom(served.mlrun, TENANT, SPARK, "spark-etl-3")
    theirs = custom(served.user, TENANT, SPARK, "spark-etl-4")
    # The user's application's driver: only what anyone may run (not as sparkapp).
    their_driver, warnings = create(served.spark, TENANT, bare(spark_driver(theirs, TENANT)))
    assert their_driver is not None, warnings
    driver = spark_driver(mine, TENANT)
    driver["metadata"]["name"] = "spark-etl-3-driver"
    driver["spec"]["serviceAccountName"] = "sparkapp"
    poll("the platform's SparkApplication in runguard's cache", lambda: create(
        served.spark, TENANT, driver, "--dry-run=server")[0] is not None, 60)  # fmt: skip
    my_driver, warnings = create(served.spark, TENANT, driver)
    assert my_driver is not None, warnings
    assert my_driver["metadata"]["annotations"]["runguard.io/platform"] == "true"
    # Once the driver is in runguard's cache (the Pods it governs), its executor is the
    # platform's: MLRun's secrets, the daemon's node directories, the exec ConfigMap.
    executor = spark_executor(my_driver, TENANT)
    poll("the platform's driver in runguard's cache", lambda: create(
        sparkapp, TENANT, executor, "--dry-run=server")[0] is not None, 60)  # fmt: skip
    pod, warnings = create(sparkapp, TENANT, executor)
    assert pod is not None, warnings
    assert pod["metadata"]["annotations"]["runguard.io/platform"] == "true"
    assert env_names(pod) == ["V3IO_ACCESS_KEY", "MLRUN_K8S_SECRET__DB_PASSWORD"]
    assert volume_sources(pod)[: len(executor["spec"]["volumes"])] == volume_sources(executor)
    # The executor of the user's driver (in the cache before the platform's), one with no
    # driver, and the user's own Pod running as sparkapp: refused.
    for who, owner in ((sparkapp, their_driver), (sparkapp, None), (served.user, None)):
        refused, denial = create(who, TENANT, spark_executor(owner, TENANT), "--dry-run=server")
        assert refused is None and "ownership.service-account" in denial, denial
    refused, denial = create(sparkapp, TENANT, spark_executor(their_driver, TENANT),
                             "--dry-run=server")  # fmt: skip
    assert refused is None and "volumes.forbidden-type" in denial, denial
