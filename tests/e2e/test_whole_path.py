"""The whole path: the platform creates Jobs, Deployments, CronJobs and bare Pods; the
real controllers create the Pods runguard mutates; the real scheduler places them on
kwok's simulated nodes, where they run.

This module starts kube-controller-manager, kube-scheduler and kwok beside the
session's apiserver (``Cluster.start_whole_path``) and stops them at its end, so the
other modules keep their admission-only cluster, where Pods stay Pending. What the
earlier modules left (Jobs, Deployments, Pods) is deleted before the controllers start:
scheduled first, it would hold the simulated nodes' GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from webhook.engine.review import TEMPLATE_KEPT

from .build import kubernetes_version
from .cluster import Cluster
from .devcluster import PRIORITIES, Runguard
from .nodes import (
    A100_PRODUCT,
    GPU_PRODUCT_LABEL,
    MLRUN_SPOT_LABELS,
    PLATFORM_SPOT_LABELS,
    SIMULATED_NODES,
)
from .runs import (
    GPU_TOLERATION,
    REPO,
    RUN_LABELS,
    Webhook,
    apply,
    controller,
    header_warnings,
    is_subset,
    kubectl_warnings,
    picked,
    platform_identity,
    pod,
    pod_template,
    rule_ids,
    run_pod,
    until,
)

pytestmark = pytest.mark.e2e


NODES = {node["metadata"]["name"]: node["metadata"]["labels"] for node in SIMULATED_NODES}
CPU_NODES = {name for name in NODES if name.startswith("kwok-cpu-")}
SPOT_NODES = {
    name
    for name, labels in NODES.items()
    if MLRUN_SPOT_LABELS.items() <= labels.items() or PLATFORM_SPOT_LABELS.items() <= labels.items()
}
# kwok completes a Job's Pod this long after it runs (its pod-complete stage reads these
# annotations): long enough for a test polling every 0.2 s to see it Running.
RUN_FOR = {
    "pod-complete.stage.kwok.x-k8s.io/delay": "4s",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "4s",
}
CONTROLLER = "system:serviceaccount:kube-system:{}-controller"
# What preemption mode prevent makes of a run's affinity (the session policy's spot nodes).
NOT_ON_SPOT = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "node-lifecycle", "operator": "NotIn", "values": ["spot"]}]}]}}}  # fmt: skip
WAIT = 60.0  # scheduling, running, completing: seconds at most, on 2 busy cores


def new_namespace(cluster: Cluster, stem: str) -> str:
    name = f"t-{stem}-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", name, check=True)
    return name


@pytest.fixture(scope="module")
def whole_path(cluster: Cluster, webhook: Webhook) -> Iterator[Cluster]:
    """The session's cluster with controllers, scheduler and simulated nodes running."""
    cluster.start_whole_path()
    try:
        yield cluster
    finally:
        cluster.stop_whole_path()


@pytest.fixture(scope="module", autouse=True)
def cron(whole_path: Cluster) -> str:
    """A CronJob due every minute, created first so that its minute passes while the
    other tests run (``test_cronjob_...`` is last); its namespace."""
    namespace = new_namespace(whole_path, "cron")
    template = run_pod("retrain", "1xa100", containers=[TRAIN])
    cronjob = controller("CronJob", "retrain", template)
    cronjob["spec"]["schedule"] = "* * * * *"
    cronjob["spec"]["concurrencyPolicy"] = "Forbid"
    pod_template(cronjob)["metadata"]["annotations"] = dict(RUN_FOR)
    api = platform_identity(whole_path).api_client()
    try:
        client.BatchV1Api(api).create_namespaced_cron_job(namespace, cronjob)
    finally:
        api.close()
    return namespace


@pytest.fixture
def core(api_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


TRAIN = {"name": "main", "image": "python:3.11", "command": ["python", "train.py"]}


def run_job(name: str, profile: str | None) -> dict[str, Any]:
    """A Job as the platform submits a run: the run labels on the template only."""
    job = controller("Job", name, run_pod(name, profile, containers=[TRAIN]))
    pod_template(job)["metadata"]["annotations"] = dict(RUN_FOR)
    return job


# --- reading what the controllers did ---------------------------------------------------


def pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[dict[str, Any]]:
    listed = core.list_namespaced_pod(namespace, label_selector=selector)
    items: list[dict[str, Any]] = core.api_client.sanitize_for_serialization(listed)["items"]
    return items


def wait_for_pods(
    core: client.CoreV1Api, namespace: str, selector: str, count: int = 1, **conditions: Any
) -> list[dict[str, Any]]:
    """The ``count`` Pods matching ``selector`` once each passes ``conditions``
    (``phase="Running"``, ``scheduled=True``), within WAIT seconds."""

    def ok(item: dict[str, Any]) -> bool:
        status = item.get("status", {})
        if "phase" in conditions and status.get("phase") != conditions["phase"]:
            return False
        return not conditions.get("scheduled") or bool(item["spec"].get("nodeName"))

    def probe() -> list[dict[str, Any]] | None:
        found = pods(core, namespace, selector)
        return found if len(found) == count and all(ok(p) for p in found) else None

    return until(f"{count} Pod(s) {selector} in {namespace} {conditions}", probe, WAIT)


def creators(cluster: Cluster, namespace: str, resource: str) -> list[str]:
    """Who created each ``resource`` stored in ``namespace`` (dry runs left out), oldest
    first, from the apiserver's audit log. (A controller's Pods have only a generateName
    there: the namespace, one per test, is what ties them to the test.)"""
    events = cluster.audit_events(verb="create", resource=resource, namespace=namespace)
    return [
        e["user"]["username"]
        for e in events
        if e["responseStatus"]["code"] == 201 and "dryRun" not in e["requestURI"]
    ]


def as_bare_pod(core: client.CoreV1Api, namespace: str, template: dict[str, Any]) -> dict[str, Any]:
    """What runguard and the apiserver make of ``template`` submitted as a Pod (server
    dry run): the Pod a controller creates from it must come out the same."""
    metadata = {**template["metadata"], "name": "dry-run"}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}
    made = core.create_namespaced_pod(namespace, body, dry_run="All")
    spec: dict[str, Any] = core.api_client.sanitize_for_serialization(made)["spec"]
    return spec


def by_toleration(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its tolerations sorted (their order means nothing to the scheduler)."""
    tolerations = sorted(spec.get("tolerations", []), key=lambda t: json.dumps(t, sort_keys=True))
    return {**spec, "tolerations": tolerations} if tolerations else spec


def assert_gpu_run(spec: dict[str, Any], product: str) -> None:
    """The 1xa100 profile of the session policy, over a Pod that asked for nothing."""
    main = spec["containers"][0]
    assert main["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "48Gi", "nvidia.com/gpu": "1"},
    }
    assert spec["nodeSelector"] == {GPU_PRODUCT_LABEL: product}
    assert GPU_TOLERATION in spec["tolerations"]
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("nvidia", "high")
    assert spec["priority"] == PRIORITIES["high"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def wait_for_completion(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    """The Job's status once its Complete condition is true."""

    def completed() -> dict[str, Any] | None:
        job = client.BatchV1Api(api_client).read_namespaced_job(name, namespace)
        status: dict[str, Any] = api_client.sanitize_for_serialization(job).get("status", {})
        conditions = status.get("conditions", [])
        done = any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)
        return status if done else None

    return until(f"Job {name} complete", completed, WAIT)


# --- a run Job, through the job-controller, onto a GPU node ------------------------------


def test_job_run_pod_is_mutated_runs_on_a_gpu_node_and_completes_kubectl(
    whole_path: Cluster, api_client: Any, core: client.CoreV1Api, runguard: Webhook
) -> None:
    namespace = new_namespace(whole_path, "job")
    job = run_job("train", "1xa100")
    done = apply(whole_path, namespace, job)
    assert done.returncode == 0, done.stderr
    warnings = kubectl_warnings(done.stderr)
    # the profile is written into the Job's template, where a queue counts it
    assert warnings[0].startswith("runguard: profile 1xa100 applied:") and TEMPLATE_KEPT not in (
        warnings
    )
    stored = whole_path.kubectl("get", "job", "train", "-n", namespace, "-o", "json", check=True)
    stored_spec = pod_template(json.loads(stored.stdout))["spec"]
    assert stored_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert stored_spec["nodeSelector"] == {GPU_PRODUCT_LABEL: A100_PRODUCT}

    selector = "batch.kubernetes.io/job-name=train"
    (created,) = wait_for_pods(core, namespace, selector)
    # The job-controller's Pod, mutated as the same template submitted by hand would be.
    # (the same tolerations, in another order: the apiserver appends its default ones to
    # the profile's that the template holds, and the profile's to a bare Pod's defaults)
    expected = by_toleration(as_bare_pod(core, namespace, pod_template(job)))
    assert is_subset(expected, by_toleration(created["spec"])), picked(created["spec"], expected)
    assert_gpu_run(created["spec"], A100_PRODUCT)
    labels = created["metadata"]["labels"]
    assert {**RUN_LABELS, "dhcore/template": "1xa100"}.items() <= labels.items()
    assert created["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert creators(whole_path, namespace, "pods") == [CONTROLLER.format("job")]

    # The real scheduler puts it on the A100 node; kwok runs it, then completes it.
    (running,) = wait_for_pods(core, namespace, selector, phase="Running")
    assert NODES[running["spec"]["nodeName"]][GPU_PRODUCT_LABEL] == A100_PRODUCT
    status = wait_for_completion(api_client, namespace, "train")
    assert status["succeeded"] == 1
    done = whole_path.kubectl("get", "job", "train", "-n", namespace, "-o", "name")
    assert done.stdout.strip() == "job.batch/train"


def test_job_from_the_platform_identity_python_client(
    whole_path: Cluster, api_client: Any, core: client.CoreV1Api, runguard: Webhook
) -> None:
    """The platform's ServiceAccount creates the Job; the job-controller the Pod."""
    namespace = new_namespace(whole_path, "platform")
    platform = platform_identity(whole_path)
    assert platform.username == "system:serviceaccount:digitalhub:core"
    api = platform.api_client()
    try:
        _, status, headers = client.BatchV1Api(api).create_namespaced_job_with_http_info(
            namespace, run_job("train", "1xa100")
        )
    finally:
        api.close()
    assert status == 201
    assert header_warnings(headers)[0].startswith("runguard: profile 1xa100 applied:")
    assert TEMPLATE_KEPT not in header_warnings(headers)

    (running,) = wait_for_pods(
        core, namespace, "batch.kubernetes.io/job-name=train", phase="Running"
    )
    assert_gpu_run(running["spec"], A100_PRODUCT)
    assert NODES[running["spec"]["nodeName"]][GPU_PRODUCT_LABEL] == A100_PRODUCT
    assert creators(whole_path, namespace, "jobs") == [platform.username]
    assert creators(whole_path, namespace, "pods") == [CONTROLLER.format("job")]


# --- a Deployment, through the deployment and replicaset controllers ---------------------


def test_deployment_run_pods_are_mutated_and_run_on_cpu_nodes_kubectl(
    whole_path: Cluster, core: client.CoreV1Api, runguard: Webhook
) -> None:
    namespace = new_namespace(whole_path, "deploy")
    deployment = controller("Deployment", "serve", run_pod("serve", containers=[TRAIN]))
    deployment["spec"]["replicas"] = 2
    done = apply(whole_path, namespace, deployment)
    assert done.returncode == 0, done.stderr

    running = wait_for_pods(core, namespace, "app=serve", count=2, phase="Running")
    expected = as_bare_pod(core, namespace, pod_template(deployment))
    for item in running:
        spec = item["spec"]
        assert is_subset(expected, spec), picked(spec, expected)
        # The session policy's default profile, and its default preemption mode, prevent.
        assert spec["containers"][0]["resources"] == {
            "requests": {"cpu": "1", "memory": "2Gi"},
            "limits": {"memory": "4Gi"},
        }
        assert spec["priorityClassName"] == "medium"
        assert spec["affinity"] == NOT_ON_SPOT
        assert spec["nodeName"] in CPU_NODES, spec["nodeName"]
    assert creators(whole_path, namespace, "pods") == [CONTROLLER.format("replicaset")] * 2
    assert creators(whole_path, namespace, "replicasets") == [CONTROLLER.format("deployment")]


# --- a run the template check lets through and the Pod check refuses ---------------------


def test_pod_refused_after_the_job_was_accepted_is_a_failed_create_event(
    whole_path: Cluster, core: client.CoreV1Api, runguard: Webhook
) -> None:
    """A queued Job (``suspend: true``, as Kueue creates them) accepted under one
    policy; the admin then removes the profile it names. Resuming it is an update
    whose violation was already there, so the template check lets it through with a
    warning; the job-controller's Pod is refused, and ``kubectl describe job`` says
    why: a FailedCreate event carrying runguard's message."""
    namespace = new_namespace(whole_path, "refused")
    job = run_job("train", "1xa100")
    job["spec"]["suspend"] = True
    assert apply(whole_path, namespace, job).returncode == 0

    runguard.write_policy([d for d in runguard.policy() if d["metadata"]["name"] != "1xa100"])
    runguard.wait_for_workers(
        lambda ready: ready["policy"]["digest"] != runguard.digest and "rejected" not in ready,
        "the policy without 1xa100",
    )

    done = whole_path.kubectl(
        "patch", "job", "train", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"suspend": false}}',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert any("already present: [profile.unknown]" in w for w in kubectl_warnings(done.stderr)), (
        done.stderr
    )

    def described() -> str | None:
        text = whole_path.kubectl("describe", "job", "train", "-n", namespace).stdout
        return text if "FailedCreate" in text else None

    text = until("a FailedCreate event on the Job", described, WAIT)
    (line,) = [line for line in text.splitlines() if "FailedCreate" in line]
    assert line.split()[:2] == ["Warning", "FailedCreate"]
    assert "job-controller" in line
    assert 'Error creating: admission webhook "validate.runguard.io" denied the request' in line
    assert "runguard denied Pod" in line
    assert rule_ids(line) == {"profile.unknown"}
    assert "profile '1xa100' does not exist" in line
    assert not pods(core, namespace, "batch.kubernetes.io/job-name=train")


# --- MLRun's preemption modes, decided by the real scheduler -----------------------------

MLRUN_POLICY = REPO / "policies" / "examples" / "mlrun"
MLRUN_PRIORITIES = {"igz-workload-low": 1000, "igz-workload-medium": 10000,
                    "igz-workload-high": 100000}  # fmt: skip
SPOT_TOLERATION = {"key": "app.iguazio.com/lifecycle", "operator": "Equal",
                   "value": "preemptible", "effect": "NoSchedule"}  # fmt: skip


def mlrun_pod(name: str, mode: str | None, **spec: Any) -> dict[str, Any]:
    """A Pod as MLRun creates it for a run of kind job, with_preemption_mode(mode)."""
    labels = {"mlrun/class": "job", "mlrun/project": "demo", "mlrun/function": "trainer",
              "mlrun/uid": name}  # fmt: skip
    body = pod(name, labels, **spec)
    if mode is not None:
        body["metadata"]["annotations"] = {"runguard.io/preemption-mode": mode}
    return body


def asks_for_spot(name: str, mode: str | None) -> dict[str, Any]:
    """A run whose own spec steers it to spot nodes (selector and toleration)."""
    return mlrun_pod(
        name, mode, nodeSelector=dict(MLRUN_SPOT_LABELS), tolerations=[SPOT_TOLERATION]
    )


@pytest.fixture(scope="class")
def mlrun(whole_path: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second runguard serving a copy of the MLRun example policy, registered beside
    the session's one under other names (its objectSelector is MLRun's labels); its
    namespace."""
    base = tmp_path_factory.mktemp("mlrun")
    shutil.copytree(MLRUN_POLICY, base / "policy")
    server = Runguard(base, base / "policy")
    classes = [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": name}, "value": value}
        for name, value in MLRUN_PRIORITIES.items()
    ]  # fmt: skip
    listed = {"apiVersion": "v1", "kind": "List", "items": classes}
    whole_path.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
    namespace = new_namespace(whole_path, "mlrun")
    server.start()
    names = []
    try:
        configs = list(yaml.safe_load_all(server.manifests()))
        for config in configs:
            config["metadata"]["name"] = "runguard-mlrun"
            config["metadata"]["labels"]["app.kubernetes.io/name"] = "runguard-mlrun"
            names.append(f"{config['kind'].lower()}/runguard-mlrun")
        listed = {"apiVersion": "v1", "kind": "List", "items": configs}
        whole_path.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)

        def active() -> bool:
            probe = json.dumps(mlrun_pod("probe", "constrain"))
            done = whole_path.kubectl(
                "create", "-n", namespace, "--dry-run=server", "-o", "name", "-f", "-",
                input=probe,
            )  # fmt: skip
            return "runguard: preemption mode constrain applied" in done.stderr

        until("the MLRun runguard called by the apiserver", active)
        yield namespace
    finally:
        if names:
            whole_path.kubectl("delete", *names, "--ignore-not-found")
        server.stop()


def placed(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """The node the scheduler bound Pod ``name`` to, once it runs there."""
    (running,) = wait_for_pods(
        core, namespace, f"mlrun/uid={name}", phase="Running", scheduled=True
    )
    node: str = running["spec"]["nodeName"]
    return node


class TestMLRunPreemptionModes:
    """policies/examples/mlrun: spot nodes are ``app.iguazio.com/lifecycle:
    preemptible`` (labelled and tainted so, ``kwok-spot-0``); Pods created with the
    Python client, as MLRun does; the scheduler decides where they go."""

    def test_prevent_keeps_runs_off_spot_even_when_they_ask_for_it(
        self, mlrun: str, core: client.CoreV1Api
    ) -> None:
        for name, mode in (("prevent-0", "prevent"), ("prevent-1", "prevent"),
                           ("default-0", None)):  # fmt: skip
            created = core.create_namespaced_pod(mlrun, asks_for_spot(name, mode))
            spec = core.api_client.sanitize_for_serialization(created)["spec"]
            assert SPOT_TOLERATION not in spec.get("tolerations", [])
            assert "nodeSelector" not in spec
        for name in ("prevent-0", "prevent-1", "default-0"):
            node = placed(core, mlrun, name)
            assert node not in SPOT_NODES, (name, node)
            assert node in CPU_NODES, (name, node)

    def test_constrain_keeps_runs_on_spot(self, mlrun: str, core: client.CoreV1Api) -> None:
        names = [f"constrain-{i}" for i in range(3)]
        for name in names:
            core.create_namespaced_pod(mlrun, mlrun_pod(name, "constrain"))
        for name in names:
            assert placed(core, mlrun, name) == "kwok-spot-0", name

    def test_allow_lets_a_run_onto_spot(self, mlrun: str, core: client.CoreV1Api) -> None:
        # Without runguard's toleration this one could go nowhere: its own selector
        # names spot nodes, whose taint it does not tolerate.
        body = mlrun_pod("allow-spot", "allow", nodeSelector=dict(MLRUN_SPOT_LABELS))
        core.create_namespaced_pod(mlrun, body)
        assert placed(core, mlrun, "allow-spot") == "kwok-spot-0"
        core.create_namespaced_pod(mlrun, mlrun_pod("allow-any", "allow"))
        assert placed(core, mlrun, "allow-any") in CPU_NODES | {"kwok-spot-0"}

    def test_none_leaves_the_run_as_it_was(
        self, mlrun: str, core: client.CoreV1Api, whole_path: Cluster
    ) -> None:
        body = mlrun_pod("none-spot", "none", nodeSelector=dict(MLRUN_SPOT_LABELS))
        core.create_namespaced_pod(mlrun, body)

        def unschedulable() -> dict[str, Any] | None:
            read = core.read_namespaced_pod("none-spot", mlrun)
            status = core.api_client.sanitize_for_serialization(read)["status"]
            return next(
                (c for c in status.get("conditions", [])
                 if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"),
                None,
            )  # fmt: skip

        condition = until("the scheduler's verdict on none-spot", unschedulable, WAIT)
        message = condition["message"]
        if kubernetes_version() < (1, 34):  # the scheduler names the taint
            assert "untolerated taint {app.iguazio.com/lifecycle: preemptible}" in message, message
        else:
            # Since 1.35 (and later 1.34 patches) it names none: taint keys and values can
            # be sensitive (kubernetes/kubernetes#134740).
            assert "untolerated taint(s)" in message and "iguazio" not in message, message
        # The taint is the spot nodes': runguard gave the run no toleration of it.
        tolerations = core.read_namespaced_pod("none-spot", mlrun).spec.tolerations or []
        assert "app.iguazio.com/lifecycle" not in {t.key for t in tolerations}


# --- last: the CronJob created when the module started ----------------------------------


def test_cronjob_run_pod_is_mutated_through_two_controllers(
    whole_path: Cluster, api_client: Any, core: client.CoreV1Api, cron: str
) -> None:
    """The cronjob-controller creates the Job at the minute, the job-controller its
    Pod: mutated, on the A100 node, Running."""
    ran = until(
        "the CronJob's Pod running",
        lambda: [p for p in pods(core, cron, "dhcore/run=r1")
                 if p["status"].get("phase") in ("Running", "Succeeded")] or None,
        75.0,  # the next minute, then scheduling
    )  # fmt: skip
    running = min(ran, key=lambda p: p["metadata"]["creationTimestamp"])
    assert_gpu_run(running["spec"], A100_PRODUCT)
    assert NODES[running["spec"]["nodeName"]][GPU_PRODUCT_LABEL] == A100_PRODUCT
    assert creators(whole_path, cron, "cronjobs") == ["system:serviceaccount:digitalhub:core"]
    assert set(creators(whole_path, cron, "jobs")) == {CONTROLLER.format("cronjob")}
    assert set(creators(whole_path, cron, "pods")) == {CONTROLLER.format("job")}
    assert running["metadata"]["ownerReferences"][0]["kind"] == "Job"
