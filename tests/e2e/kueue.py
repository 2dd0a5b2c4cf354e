"""A real Kueue (``tests/e2e/build-kueue.sh``: its manager, built from the Go module proxy)
running out of cluster against the e2e apiserver, as the account its chart installs it
under (``system:serviceaccount:kueue-system:kueue-controller-manager``, bound to the
module's own ClusterRole): what runguard sees Kueue do is what a cluster's Kueue does.

``Kueue(cluster, directory).start()``:

- applies the module's CRDs (``config/components/crd/bases``, server-side: the workloads
  CRD is too large for a client-side apply's annotation) and its ClusterRole;
- writes its Configuration: webhook server on 127.0.0.1 with a certificate from
  ``runguard certs --host 127.0.0.1``, health probes on 127.0.0.1, metrics, leader election,
  internal certificate management and ``VisibilityOnDemand`` off, the integrations
  ``frameworks`` names (``batch/job`` alone by default; ``ray.io/rayjob`` needs the KubeRay
  CRDs served first: ``install_kuberay_crds``);
- starts the manager. With its certificate management off it reads a metrics certificate
  from the fixed path ``/etc/kueue/metrics/certs`` (and exits without one, metrics off or
  not): it runs in a mount namespace of its own (``unshare``) where a read-only overlay
  puts that folder, from this fixture's directory, over ``/etc``. Nothing is written
  outside ``directory``;
- once ``/readyz`` answers, registers the module's webhooks
  (``config/components/webhook/manifests.yaml``) by URL with its CA: those of Kueue's own
  kinds and of its integrations' kinds (a webhook of an integration that is off would fail
  closed), under the names its kustomization gives
  them (``kueue-mutating-webhook-configuration`` is called before ``runguard``), Kueue's and
  ``kube-system`` namespaces left out as there; then waits until its Job webhook suspends a
  queued Job (a server-side dry run).

``stop()`` deletes those configurations first (they fail closed: with Kueue gone no Job
could be created), then stops the process group. The CRDs and Kueue's objects stay: only
Kueue reads them.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .build import E2E_DIR, ClusterError
from .cluster import Cluster
from .devcluster import runguard_command
from .identities import Identity
from .processes import die_with_parent, free_port, kill_group, tail
from .runs import until

__all__ = [
    "KUEUE_ACCOUNT",
    "QUEUE_LABEL",
    "Kueue",
    "build_kueue",
    "install_kuberay_crds",
    "kueue_module",
    "kueue_version",
]

KUEUE_ACCOUNT = ("kueue-system", "kueue-controller-manager")  # its chart's default
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
BUILD_SCRIPT = E2E_DIR / "build-kueue.sh"
CLUSTER_ROLE = "kueue-manager-role"  # config/components/rbac/role.yaml, as kustomize names it
METRICS_CERTS = Path("kueue/metrics/certs")  # under /etc, read by cmd/kueue/main.go
KUEUE_GROUP = "kueue.x-k8s.io"  # Kueue's own kinds: their webhooks are always kept
# The (group, resource) an integration's webhooks are called for: kept when it is on.
FRAMEWORK_RESOURCES = {"batch/job": ("batch", "jobs"), "ray.io/rayjob": ("ray.io", "rayjobs")}
# KubeRay's CRDs the rayjob integration watches (a RayJob's RayCluster too), read from the
# ray-operator module Kueue's go.mod requires (the build downloaded it).
KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"
KUBERAY_CRDS = ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")
# What its kustomization leaves out of the integrations' webhooks (config/components/webhook).
NOT_IN = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                "values": ["kube-system", KUEUE_ACCOUNT[0]]}]}  # fmt: skip
START_TIMEOUT = 120.0  # its caches and webhook server on 2 busy cores: bounded, not a check


def kueue_version() -> str:
    """The version build-kueue.sh builds (its ``KUEUE_VERSION=`` pin)."""
    pinned = re.search(r"^KUEUE_VERSION=(v[0-9.]+)", BUILD_SCRIPT.read_text(), re.MULTILINE)
    if pinned is None:
        raise ClusterError(f"{BUILD_SCRIPT}: no KUEUE_VERSION")
    return pinned.group(1)


def build_kueue() -> Path:
    """Run build-kueue.sh (a no-op when cached) and return the manager's path."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise ClusterError(f"tests/e2e/build-kueue.sh failed with exit code {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


def kueue_module() -> Path:
    """The Kueue module's source in the Go module cache, which the build downloaded."""
    done = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise ClusterError(f"go env GOMODCACHE: {done.stderr}")
    module = Path(done.stdout.strip()) / f"sigs.k8s.io/kueue@{kueue_version()}"
    if not (module / "config" / "components").is_dir():
        raise ClusterError(f"{module}: no config/components (run tests/e2e/build-kueue.sh)")
    return module


def kuberay_crds(module: Path) -> list[Path]:
    """KubeRay's RayJob and RayCluster CRDs, of the version Kueue's ``module`` requires."""
    required = re.search(rf"^\s*{re.escape(KUBERAY_MODULE)} (v[0-9.]+)\s*$",
                         (module / "go.mod").read_text(), re.MULTILINE)  # fmt: skip
    if required is None:
        raise ClusterError(f"{module}/go.mod: no {KUBERAY_MODULE}")
    cache = module.parents[1]  # GOMODCACHE: the module is sigs.k8s.io/kueue@<version>
    bases = cache / f"{KUBERAY_MODULE}@{required.group(1)}" / "config" / "crd" / "bases"
    if not bases.is_dir():
        raise ClusterError(f"{bases}: missing (run tests/e2e/build-kueue.sh)")
    return [bases / name for name in KUBERAY_CRDS]


def install_kuberay_crds(cluster: Cluster) -> list[str]:
    """Serve KubeRay's own RayJob and RayCluster CRDs (server-side: too large for a
    client-side apply's annotation), as Kueue's rayjob integration needs them before it
    starts; their names."""
    names = []
    for crd in kuberay_crds(kueue_module()):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd),
                        check=True)  # fmt: skip
        names.append(yaml.safe_load(crd.read_text())["metadata"]["name"])

    def established(name: str) -> bool | None:
        # (not `kubectl wait`: it fails on a CRD that has no conditions yet)
        done = cluster.kubectl("get", "crd", name, "-o", "json")
        found = condition(json.loads(done.stdout), "Established") if done.returncode == 0 else None
        return True if found and found["status"] == "True" else None

    for name in names:
        until(f"CRD {name} established", lambda name=name: established(name), 60.0)
    return names


def webhook_configurations(
    module: Path, url: str, ca_bundle: str, frameworks: tuple[str, ...] = ("batch/job",)
) -> list[dict[str, Any]]:
    """The module's webhook configurations, as its kustomization names them, keeping the
    webhooks of Kueue's own kinds and of ``frameworks``' kinds, calling ``url`` instead
    of its Service."""
    source = module / "config" / "components" / "webhook" / "manifests.yaml"
    served = {FRAMEWORK_RESOURCES[f] for f in frameworks}
    configurations = []
    for document in yaml.safe_load_all(source.read_text()):
        if not document:
            continue
        kept = []
        for hook in document["webhooks"]:
            groups = {g for rule in hook["rules"] for g in rule["apiGroups"]}
            called = {(g, r) for rule in hook["rules"]
                      for g in rule["apiGroups"] for r in rule["resources"]}  # fmt: skip
            if groups != {KUEUE_GROUP} and not called <= served:
                continue
            hook = copy.deepcopy(hook)
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if groups != {KUEUE_GROUP}:
                hook["namespaceSelector"] = copy.deepcopy(NOT_IN)
            kept.append(hook)
        document["metadata"] = {"name": f"kueue-{document['metadata']['name']}",
                                "labels": {"app.kubernetes.io/name": "kueue"}}  # fmt: skip
        document["webhooks"] = kept
        configurations.append(document)
    return configurations


class Kueue:
    """Kueue's manager against ``cluster``, with its files under ``directory``, running
    the integrations ``frameworks`` names (``batch/job`` among them: the fixture's probe
    that its webhooks are called is a queued Job)."""

    def __init__(
        self, cluster: Cluster, directory: Path, frameworks: tuple[str, ...] = ("batch/job",)
    ) -> None:
        if "batch/job" not in frameworks or not set(frameworks) <= set(FRAMEWORK_RESOURCES):
            raise ValueError(f"frameworks: batch/job and any of {sorted(FRAMEWORK_RESOURCES)}")
        self.frameworks = frameworks
        self.cluster = cluster
        self.directory = directory.resolve()
        self.log = self.directory / "kueue.log"
        self.binary = build_kueue()
        self.module = kueue_module()
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.identity: Identity | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.registered = False

    # -- lifecycle --

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._install()
            self._spawn()
            until("Kueue's /readyz", self._ready, START_TIMEOUT)
            self._register()
            until("Kueue's Job webhook suspending a queued Job", self._suspends, START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    @contextlib.contextmanager
    def running(self, *objects: dict[str, Any]) -> Iterator[Kueue]:
        """Started, with ``objects`` applied (its ResourceFlavors), for the block; stopped
        after."""
        self.start()
        try:
            self.apply(*objects)
            yield self
        finally:
            self.stop()

    def stop(self, timeout: float = 20.0) -> None:
        """Unregister the webhooks and wait until the apiserver no longer calls them (a
        Job created then would fail on a Kueue gone), then SIGTERM the process group
        (SIGKILL if it lingers)."""
        try:
            if self.registered:
                self.cluster.kubectl(
                    "delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                    "-l", "app.kubernetes.io/name=kueue", "--ignore-not-found", "--wait",
                )  # fmt: skip
                self.registered = False
                until("Kueue's webhooks no longer called",
                      lambda: self._probe_job() is False or None, START_TIMEOUT)  # fmt: skip
        finally:
            if self._proc is not None:
                kill_group(self._proc.pid, timeout)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=1)
                self._proc = None

    # -- steps --

    def _install(self) -> None:
        """CRDs, the manager's ClusterRole, its account and kubeconfig, certificates and
        the Configuration."""
        crds = self.module / "config" / "components" / "crd" / "bases"
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds),
                             check=True)  # fmt: skip
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                             "-f", str(crds), check=True)  # fmt: skip
        role = yaml.safe_load((self.module / "config/components/rbac/role.yaml").read_text())
        role["metadata"] = {"name": CLUSTER_ROLE}
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(role), check=True)
        self.identity = self.cluster.service_account(*KUEUE_ACCOUNT, cluster_role=CLUSTER_ROLE)
        # and the Role on its namespace's Secrets (it waits for their informer to sync)
        rbac = self.module / "config" / "components" / "rbac"
        namespaced = [yaml.safe_load((rbac / f"manager_secrets_{what}.yaml").read_text())
                      for what in ("role", "role_binding")]  # fmt: skip
        for obj in namespaced:
            obj["metadata"] = {"name": "kueue-" + obj["metadata"]["name"],
                               "namespace": KUEUE_ACCOUNT[0]}  # fmt: skip
        binding = namespaced[1]
        binding["roleRef"]["name"] = namespaced[0]["metadata"]["name"]
        binding["subjects"] = [{"kind": "ServiceAccount", "name": KUEUE_ACCOUNT[1],
                                "namespace": KUEUE_ACCOUNT[0]}]  # fmt: skip
        listed = {"apiVersion": "v1", "kind": "List", "items": namespaced}
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)

        certs = self.directory / "certs"
        done = subprocess.run(
            [runguard_command(), "certs", "--service", "kueue-webhook-service",
             "--namespace", KUEUE_ACCOUNT[0], "--out", str(certs), "--host", "127.0.0.1"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ClusterError(f"runguard certs for Kueue: {done.stderr}")
        metrics = self.directory / "etc" / METRICS_CERTS
        metrics.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copyfile(certs / name, metrics / name)

        configuration = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_ACCOUNT[0],
            "manageJobsWithoutQueueName": False,
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "leaderElection": {"leaderElect": False},
            "integrations": {"frameworks": list(self.frameworks)},
            "featureGates": {"VisibilityOnDemand": False},
        }
        self.config = self.directory / "config.yaml"
        self.config.write_text(yaml.safe_dump(configuration, sort_keys=False))

    def _spawn(self) -> None:
        assert self.identity is not None
        # /etc/kueue/metrics/certs from self.directory/etc, in Kueue's mount namespace only
        # (a user namespace too when not root: an unprivileged overlay needs one).
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.append("--map-root-user")
        overlay = 'mount -t overlay overlay -o "lowerdir=$1:/etc" /etc && shift && exec "$@"'
        command = [
            *unshare, "sh", "-c", overlay, "sh", str(self.directory / "etc"),
            str(self.binary), f"--config={self.config}",
            f"--kubeconfig={self.identity.kubeconfig}", "--zap-log-level=info",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
                preexec_fn=die_with_parent,  # SIGKILLed if pytest dies, however it dies
            )

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise ClusterError(
                f"kueue exited with code {self._proc.returncode}; last lines of {self.log}:\n"
                + tail(self.log)
            )

    def _ready(self) -> bool | None:
        self._check_alive()
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return True if response.status == 200 else None
        except (OSError, urllib.error.HTTPError):
            return None

    def _register(self) -> None:
        ca = (self.directory / "certs" / "ca.crt").read_bytes()
        bundle = base64.b64encode(ca).decode()
        url = f"https://127.0.0.1:{self.webhook_port}"
        listed = {"apiVersion": "v1", "kind": "List",
                  "items": webhook_configurations(self.module, url, bundle,
                                                  self.frameworks)}  # fmt: skip
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        self.registered = True

    def _suspends(self) -> bool | None:
        """Kueue's Job webhook is called (and Kueue still runs)."""
        self._check_alive()
        return self._probe_job() or None

    def _probe_job(self) -> bool | None:
        """Whether a server-side dry run of a queued Job (no run: runguard leaves it) comes
        back suspended, which only Kueue's webhook does; None if it fails."""
        probe = {"apiVersion": "batch/v1", "kind": "Job",
                 "metadata": {"name": "kueue-probe", "labels": {QUEUE_LABEL: "probe"}},
                 "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                     {"name": "c", "image": "busybox"}]}}}}  # fmt: skip
        done = self.cluster.kubectl("create", "-n", "default", "--dry-run=server", "-o", "json",
                                    "-f", "-", input=json.dumps(probe))  # fmt: skip
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)["spec"].get("suspend") is True

    # -- Kueue's objects --

    def apply(self, *objects: dict[str, Any]) -> None:
        """Create or update Kueue objects (as cluster-admin, through Kueue's webhooks)."""
        listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)

    @contextlib.contextmanager
    def team(
        self,
        prefix: str,
        queue: str,
        quotas: dict[str, dict[str, str]],
        preemption: dict[str, str] | None = None,
    ) -> Iterator[str]:
        """A team's namespace (``prefix`` and a random suffix), its ClusterQueue named
        after it (``cluster_queue``'s ``quotas`` and ``preemption``) and its LocalQueue
        ``queue``, Active; the namespace deleted after (not waited on)."""
        name = f"{prefix}-{os.urandom(3).hex()}"
        self.cluster.kubectl("create", "namespace", name, check=True)
        try:
            self.apply(cluster_queue(name, name, quotas, preemption),
                       local_queue(queue, name, name))  # fmt: skip
            wait_active(self.cluster, name)
            yield name
        finally:
            self.cluster.kubectl("delete", "namespace", name, "--wait=false")

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        done = self.cluster.kubectl("get", "-n", namespace, "workloads.kueue.x-k8s.io",
                                    "-o", "json", check=True)  # fmt: skip
        items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
        return items

    def workload_of(self, namespace: str, job: str, kind: str = "Job") -> dict[str, Any] | None:
        """The Workload Kueue made for ``kind`` ``job`` (its owner), if any yet."""
        for workload in self.workloads(namespace):
            owners = workload["metadata"].get("ownerReferences", [])
            if any(o.get("kind") == kind and o.get("name") == job for o in owners):
                return workload
        return None


def resource_flavor(name: str, node_labels: dict[str, str],
                    tolerations: list[dict[str, str]]) -> dict[str, Any]:  # fmt: skip
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": {"nodeLabels": node_labels, "tolerations": tolerations}}  # fmt: skip


def cluster_queue(
    name: str,
    namespace: str,
    quotas: dict[str, dict[str, str]],
    preemption: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ClusterQueue for ``namespace``'s LocalQueues, one resource group covering every
    resource named in ``quotas`` (flavor -> resource -> nominal quota), flavors in order;
    ``preemption``: its preemption settings (e.g. ``{"withinClusterQueue":
    "LowerPriority"}``), else Kueue's default (none)."""
    resources = sorted({r for quota in quotas.values() for r in quota})
    flavors = [{"name": flavor,
                "resources": [{"name": r, "nominalQuota": quota[r]} for r in resources]}
               for flavor, quota in quotas.items()]  # fmt: skip
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    spec = {"namespaceSelector": selector,
            "resourceGroups": [{"coveredResources": resources, "flavors": flavors}]}  # fmt: skip
    if preemption is not None:
        spec["preemption"] = dict(preemption)
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def workload_priority_class(name: str, value: int) -> dict[str, Any]:
    """A WorkloadPriorityClass: a Job labelled ``kueue.x-k8s.io/priority-class: name``
    is admitted (and preempts) by ``value``."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": name}, "value": value,
            "description": "e2e: Kueue's preemption of runs"}  # fmt: skip


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}  # fmt: skip


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind``, if present."""
    for found in obj.get("status", {}).get("conditions", []):
        if found.get("type") == kind:
            return dict(found)
    return None


def wait_active(cluster: Cluster, name: str, timeout: float = 60.0) -> None:
    """Until ClusterQueue ``name`` is Active (its flavors exist, Kueue cached it)."""

    def active() -> bool | None:
        done = cluster.kubectl("get", "clusterqueues.kueue.x-k8s.io", name, "-o", "json")
        if done.returncode != 0:
            return None
        found = condition(json.loads(done.stdout), "Active")
        return True if found and found["status"] == "True" else None

    until(f"ClusterQueue {name} active", active, timeout)
