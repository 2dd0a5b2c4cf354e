"""What the e2e scenarios submit and how they read the answers.

The session policy (``session_policy()``) is the platform policy from
``tests/cases/_policies/platform`` with the shipped selector (``dhcore/run`` must
exist) and one more excluded namespace. The objects are built as dicts, the way a
user writes them; the same dict goes to ``kubectl apply`` (as JSON) and to the Python
client.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from harness import eventually

from .build import ClusterError
from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .identities import Identity

REPO = Path(__file__).resolve().parents[2]
PLATFORM_POLICY = REPO / "tests" / "cases" / "_policies" / "platform" / "policy.yaml"
EXCLUDED_NAMESPACE = "rg-excluded"
RUN_LABELS = {"app.kubernetes.io/managed-by": "dhcore", "dhcore/run": "r1"}
PLATFORM_ACCOUNT = ("digitalhub", "core")  # namespace, ServiceAccount

JSON = dict[str, Any]
T = TypeVar("T")


def session_policy() -> list[JSON]:
    """The platform policy, also excluding EXCLUDED_NAMESPACE."""
    documents = list(yaml.safe_load_all(PLATFORM_POLICY.read_text()))
    # Maximums hold per run (docs/dev/guarantees.md, "Every admitted object"): the GPU profile
    # leaves room for a sidecar.
    for doc in documents:
        if doc["kind"] == "Profile" and doc["metadata"]["name"] == "1xa100":
            doc["spec"]["resources"]["limits"]["memory"] = "48Gi"
    spec = documents[0]["spec"]
    spec["selector"]["matchExpressions"] = [{"key": "dhcore/run", "operator": "Exists"}]
    spec["excludeNamespaces"] = [*spec["excludeNamespaces"], EXCLUDED_NAMESPACE]
    return documents


class Webhook(Runguard):
    """The session's runguard, with what a test needs to disturb it and put it back."""

    policy_file: Path
    policy_text: str
    digest: str

    def policy(self) -> list[JSON]:
        return list(yaml.safe_load_all(self.policy_text))

    def write_policy(self, documents: list[JSON]) -> None:
        """Rewrite the policy file in place, as an admin editing it would."""
        self.policy_file.write_text(yaml.safe_dump_all(documents, sort_keys=False))

    def restore_policy(self) -> None:
        """Put the session policy back; wait until every worker can serve it."""
        self.policy_file.write_text(self.policy_text)
        self.wait_for_policy(self.digest)

    def wait_for_policy(self, digest: str, timeout: float = 30.0) -> None:
        """Until every worker serves ``digest`` with no rejected edit."""
        self.wait_for_workers(
            lambda ready: ready["policy"]["digest"] == digest and "rejected" not in ready,
            f"policy {digest}",
            timeout,
        )

    def wait_for_workers(
        self, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30.0
    ) -> None:
        """Until the latest /readyz answer of *every* worker passes ``check``. Each answer
        names the worker that gave it (fresh connections land on either), so this waits
        for word from each one rather than trusting the first."""
        deadline = time.monotonic() + timeout
        latest: dict[int, dict[str, Any]] = {}
        while True:
            status, ready = self.readyz()
            if status == 200:
                latest[ready["worker"]] = ready
            workers = self.worker_pids()
            if workers and all(pid in latest and check(latest[pid]) for pid in workers):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{what}: runguard workers answered {latest} ({timeout:.0f}s)")
            time.sleep(0.05)

    def worker_pids(self) -> set[int]:
        """The gunicorn workers: the server process's children."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            return {int(pid) for pid in children.read_text().split()}
        except OSError:
            return set()


# --- objects --------------------------------------------------------------------------


def pod(name: str, labels: Mapping[str, str] | None = None, **spec: Any) -> JSON:
    """A Pod with one container; ``spec`` keys replace or add to its spec."""
    body: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
    }
    if labels:
        body["metadata"]["labels"] = dict(labels)
    body["spec"].update(copy.deepcopy(spec))
    return body


def run_pod(name: str, template: str | None = None, **spec: Any) -> JSON:
    labels = dict(RUN_LABELS)
    if template is not None:
        labels["dhcore/template"] = template
    return pod(name, labels, **spec)


def messy_run_pod(name: str) -> JSON:
    """A run that runguard fixes at every step: the 1xa100 profile over the user's
    resources and priority class, defaults and clamping in a sidecar, root, a team PVC
    mounted in both containers, someone else's secret next to the run's own."""
    return run_pod(
        name,
        "1xa100",
        securityContext={"runAsUser": 0, "fsGroup": 0},
        priorityClassName="low",
        containers=[
            {
                "name": "main",
                "image": "python:3.11",
                "command": ["python", "train.py"],
                "resources": {"requests": {"cpu": "2", "memory": "1Gi"}},
                "env": [
                    {
                        "name": "PASSWORD",
                        "valueFrom": {"secretKeyRef": {"name": "someone-elses", "key": "pw"}},
                    },
                    {
                        "name": "DB",
                        "valueFrom": {"secretKeyRef": {"name": "sec-db-r1", "key": "url"}},
                    },
                ],
                "volumeMounts": [
                    {"name": "shared", "mountPath": "/shared"},
                    {"name": "work", "mountPath": "/work"},
                ],
            },
            {
                "name": "sidecar",
                "image": "busybox:1.36",
                # the apiserver defaults the request to the limit: both get clamped
                "resources": {"limits": {"ephemeral-storage": "100Gi"}},
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            },
        ],
        volumes=[
            {"name": "shared", "persistentVolumeClaim": {"claimName": "team-datasets"}},
            {"name": "work", "persistentVolumeClaim": {"claimName": "v-r1-work"}},
        ],
    )


# What the apiserver stores for messy_run_pod, field by field (the apiserver's own
# defaults, terminationMessagePath and the like, are left out of the comparison).
HARDENED_CONTAINER = {
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
MESSY_MUTATED_SPEC: JSON = {
    "securityContext": {
        "runAsUser": 8877,
        "fsGroup": 999,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "priorityClassName": "high",
    "runtimeClassName": "nvidia",
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "node-lifecycle", "operator": "NotIn", "values": ["spot"]}
                        ]
                    }
                ]
            }
        }
    },  # fmt: skip
    "volumes": [{"name": "work", "persistentVolumeClaim": {"claimName": "v-r1-work"}}],
    "containers": [
        {
            "name": "main",
            "image": "python:3.11",
            "command": ["python", "train.py"],
            "resources": {
                "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"},
                "limits": {"memory": "48Gi", "nvidia.com/gpu": "1"},
            },
            "env": [
                {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "sec-db-r1", "key": "url"}}},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
            ],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            "securityContext": HARDENED_CONTAINER,
        },
        {
            "name": "sidecar",
            "image": "busybox:1.36",
            "resources": {
                "requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "50Gi"},
                "limits": {"memory": "282Mi", "ephemeral-storage": "50Gi"},
            },
            "securityContext": HARDENED_CONTAINER,
        },
    ],
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
MESSY_MUTATIONS = {
    "profile.applied",
    "resources.defaults",
    "resources.memory-limit",
    "resources.clamped",
    "security.root",
    "volumes.pre-existing",
    "secrets.forbidden",
    "scheduling.preemption-mode",
}
# One warning per step, each naming what it changed.
MESSY_WARNINGS = [
    "runguard: profile 1xa100 applied",
    "runguard: defaults filled: cpu request 100m, memory request 256Mi",
    "runguard: memory limit set to request x 1.1: sidecar 282Mi",
    "runguard: resources clamped: ephemeral-storage request 100Gi -> 50Gi, "
    "ephemeral-storage limit 100Gi -> 50Gi",
    "runguard: root and privileges stripped: pod runAsUser 0, pod fsGroup 0",
    "runguard: pre-existing volumes removed: shared",
    "runguard: secrets not managed by the platform removed: someone-elses",
    "runguard: preemption mode prevent applied",
]


def platform_identity(cluster: Cluster) -> Identity:
    """The platform as the apiserver sees it: ServiceAccount ``digitalhub/core``
    (``system:serviceaccount:digitalhub:core``), allowed to edit everything, with a
    token of its own. ``.kubectl(...)`` and ``.api_client()`` act as it."""
    return cluster.service_account(*PLATFORM_ACCOUNT)


def noncompliant_run_pod(name: str) -> JSON:
    """Nothing runguard may fix: an unknown profile, the host network, a hostPath."""
    return run_pod(
        name,
        "8xh100",
        hostNetwork=True,
        containers=[
            {
                "name": "main",
                "image": "python:3.11",
                "volumeMounts": [{"name": "host", "mountPath": "/host"}],
            }
        ],
        volumes=[{"name": "host", "hostPath": {"path": "/var/run"}}],
    )


NONCOMPLIANT_RULES = {"profile.unknown", "security.host-namespace", "volumes.forbidden-type"}


def controller(kind: str, name: str, template: JSON) -> JSON:
    """A Job, CronJob or Deployment whose pod template is ``template``'s metadata and
    spec; the controller itself carries no run labels (the platform labels the Pods)."""
    template = {"metadata": template["metadata"], "spec": copy.deepcopy(template["spec"])}
    template["metadata"] = {"labels": template["metadata"].get("labels", {})}
    if kind in ("Job", "CronJob"):
        template["spec"]["restartPolicy"] = "Never"
        job_spec: JSON = {"template": template, "backoffLimit": 0}
        if kind == "Job":
            return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                    "spec": job_spec}  # fmt: skip
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": job_spec}},
        }
    labels = {"app": name, **template["metadata"]["labels"]}
    template["metadata"]["labels"] = labels
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def pod_template(obj: JSON) -> JSON:
    if obj["kind"] == "CronJob":
        template: JSON = obj["spec"]["jobTemplate"]["spec"]["template"]
    else:
        template = obj["spec"]["template"]
    return template


# --- answers --------------------------------------------------------------------------


def kubectl_warnings(stderr: str) -> list[str]:
    """The ``Warning:`` lines kubectl printed for the apiserver's Warning headers."""
    return [line.removeprefix("Warning: ") for line in stderr.splitlines()
            if line.startswith("Warning: ")]  # fmt: skip


def header_warnings(headers: Any) -> list[str]:
    """The texts of ``Warning: 299 - "..."`` response headers (RFC 7234 warn-text)."""
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else [headers["Warning"]]
    texts = []
    for value in values:
        for match in re.finditer(r'299 - "((?:[^"\\]|\\.)*)"', value):
            texts.append(re.sub(r"\\(.)", r"\1", match.group(1)))
    return texts


def rule_ids(message: str) -> set[str]:
    """The ``[rule.id]`` markers of runguard's denial message."""
    return set(re.findall(r"\[([a-z]+\.[a-z-]+)\]", message))


def is_subset(part: Any, whole: Any) -> bool:
    """Whether every field of ``part`` is in ``whole`` with the same value (lists
    element by element, same length): what was sent, within what was stored."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            key in whole and is_subset(value, whole[key]) for key, value in part.items()
        )
    if isinstance(part, list):
        return (
            isinstance(whole, list)
            and len(part) == len(whole)
            and all(is_subset(p, w) for p, w in zip(part, whole, strict=True))
        )
    return bool(part == whole)


def picked(whole: Any, like: Any) -> Any:
    """``whole`` cut down to the fields of ``like``, for an equality assert whose
    failure shows the difference."""
    if isinstance(like, dict) and isinstance(whole, dict):
        return {key: picked(whole[key], value) for key, value in like.items() if key in whole}
    if isinstance(like, list) and isinstance(whole, list) and len(like) == len(whole):
        return [picked(w, p) for p, w in zip(like, whole, strict=True)]
    return whole


def apply(cluster: Cluster, namespace: str, obj: JSON, *args: str) -> Any:
    """``kubectl apply -n NS -f -`` of one object, sent as JSON."""
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", *args, input=json.dumps(obj))


def create(cluster: Cluster, namespace: str, obj: JSON, *args: str) -> Any:
    """``kubectl create -n NS -f -`` of one object, sent as JSON."""
    return cluster.kubectl("create", "-n", namespace, "-f", "-", *args, input=json.dumps(obj))


def get(cluster: Cluster, namespace: str, kind: str, name: str) -> JSON:
    done = cluster.kubectl("get", "-n", namespace, kind, name, "-o", "json", check=True)
    got: JSON = json.loads(done.stdout)
    return got


def exists(cluster: Cluster, namespace: str, kind: str, name: str) -> bool:
    done = cluster.kubectl("get", "-n", namespace, kind, name, "--ignore-not-found", "-o", "name")
    if done.returncode != 0:
        raise ClusterError(done.stderr)
    return bool(done.stdout.strip())


def until(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """``harness.eventually``: call ``probe`` every 0.2 s until it returns something
    true; return that. Every wait in the e2e tests is bounded."""
    return eventually(what, probe, timeout)


def poll(what: str, check: Callable[[], Any], timeout: float = 30.0) -> float:
    """``until`` for a yes/no ``check``: the seconds it took. The default bounds waits
    for what runguard promises within seconds (a policy reload)."""
    started = time.monotonic()
    until(what, lambda: bool(check()) or None, timeout)
    return time.monotonic() - started


def wait_for_admission(cluster: Cluster, *, active: bool, timeout: float = 30.0) -> None:
    """Until both webhooks are (or are no longer) called, seen by a server-side dry run
    of a run Pod that runguard mutates (warnings) and denies (hostNetwork)."""
    probe = json.dumps(run_pod("admission-probe", hostNetwork=True))
    deadline = time.monotonic() + timeout
    while True:
        done = cluster.kubectl(
            "create", "-n", "default", "--dry-run=server", "-o", "name", "-f", "-", input=probe
        )
        mutated = any(w.startswith("runguard:") for w in kubectl_warnings(done.stderr))
        denied = done.returncode != 0 and "validate.runguard.io" in done.stderr
        if (mutated and denied) if active else (done.returncode == 0 and not mutated):
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"runguard admission not {'active' if active else 'gone'} after "
                f"{timeout:.0f}s: {done.stderr}"
            )
        time.sleep(0.2)


def wait_for_policy_label(
    cluster: Cluster,
    policy: str,
    what: str,
    timeout: float = 30.0,
    labels: Mapping[str, str] | None = None,
) -> None:
    """Until the apiserver calls a runguard serving RunPolicy ``policy``: a server dry run
    of a run Pod (a DigitalHub run, or one with ``labels``) comes back with that
    RunPolicy's label."""
    run = {**RUN_LABELS, "dhcore/project": "p1"} if labels is None else dict(labels)
    probe = json.dumps({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "probe", "labels": run},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})  # fmt: skip

    def labelled() -> bool | None:
        done = cluster.kubectl("create", "-n", "default", "--dry-run=server", "-o", "json",
                               "-f", "-", input=probe)  # fmt: skip
        if done.returncode != 0:
            return None
        labels = json.loads(done.stdout)["metadata"].get("labels", {})
        return True if labels.get("runguard.io/policy") == policy else None

    until(what, labelled, timeout)


@contextmanager
def instead_of_the_session(webhook: Webhook, cluster: Cluster, server: Runguard) -> Iterator[None]:
    """``server`` started and registered in place of the session's runguard for the block
    (two runguards in one cluster would judge, and label, each other's objects); the
    session's registered again after."""
    webhook.unregister(cluster)
    try:
        server.start()
        server.register(cluster)
        yield
    finally:
        if server.registered:
            server.unregister(cluster)
        server.stop()
        webhook.register(cluster)
        wait_for_admission(cluster, active=True)


@contextmanager
def shipped_on_the_whole_path(
    webhook: Webhook, cluster: Cluster, server: Runguard, *, shells: bool = False
) -> Iterator[None]:
    """``server`` (the shipped policies, or a copy edited) in place of the session's, with
    the platform's namespace and ServiceAccount digitalhub/core and the controllers for
    the block; with ``shells``, the shells' webhook too, as the cluster-state component
    ships it."""
    prepare_cluster(cluster)
    platform_identity(cluster)
    with instead_of_the_session(webhook, cluster, server):
        if shells:
            shells_webhook = server.manifests_with("--shells")
            cluster.kubectl("apply", "-f", "-", input=shells_webhook, check=True)
        wait_for_policy_label(cluster, "digitalhub", "the shipped policies' runguard called")
        cluster.start_whole_path()
        try:
            yield
        finally:
            cluster.stop_whole_path()
