"""runguard in front of an e2e cluster: its certificates, ``runguard serve``, the webhook
configurations, and the cluster objects the shipped profiles name.

Used by ``tests/e2e/conftest.py`` (one webhook per test session) and by ``make
cluster``::

    python tests/e2e/devcluster.py up --dir DIR [--policy DIR] [--admission-only]
    python tests/e2e/devcluster.py down --dir DIR

``up`` starts etcd + kube-apiserver and the whole path (``cluster.py``: the
controller-manager, the scheduler and kwok's simulated CPU, GPU and spot nodes, unless
``--admission-only``), then ``runguard certs --host 127.0.0.1``, ``runguard serve`` on
a free loopback port serving the policy directory *in place* (edit it and the next
admission uses it), the PriorityClasses and the RuntimeClass the profiles name, and
``runguard manifests --url ... | kubectl apply``. It prints the ``export
KUBECONFIG=...`` line on stdout; ``down`` stops everything. With ``--policy-objects``
the policy is the cluster's RunPolicy and Profile objects instead: the CRDs of
``manifests/policy-objects`` installed, the policy directory applied with ``kubectl
apply -f``, runguard serving them (``--policy-objects``) and checking them (its policy
webhook registered by URL too).

runguard is driven only through its command line, as an admin would drive it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the harness is the package tests.e2e all the same
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.e2e"

from .build import ClusterError, build_binaries
from .cluster import Cluster
from .nodes import SIMULATED_NODES
from .processes import die_with_parent, free_port, kill_group, tail
from .realnode import (
    REAL_NODE_TAINT,
    REAL_NODE_TOLERATION,
    Netns,
    RealNode,
    build_image,
    ensure_tools,
    taint_text,
)

__all__ = ["CLUSTER_OBJECTS", "PRIORITIES", "Runguard", "prepare_cluster", "main"]

RUNGUARD_STATE = "runguard.json"
REAL_NODES = {"type": "real"}  # the real nodes' label (kwok's are type: kwok)
REPO = Path(__file__).resolve().parents[2]

# The apiserver's Priority and RuntimeClass plugins refuse a Pod naming a class that
# does not exist, so the classes the profiles name must be there first.
PRIORITIES = {"low": 1000, "medium": 10000, "high": 100000}
CLUSTER_OBJECTS: list[dict[str, Any]] = [
    *(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": f"runguard e2e: {name} priority runs",
        }
        for name, value in PRIORITIES.items()
    ),
    {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    },
]


def runguard_command() -> str:
    """The ``runguard`` of this Python environment (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "runguard"
    return str(beside) if beside.is_file() else "runguard"


def prepare_cluster(cluster: Cluster) -> None:
    """Create the PriorityClasses and RuntimeClass runguard's profiles name."""
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_list(CLUSTER_OBJECTS)), check=True)


def _list(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


class Runguard:
    """``runguard serve`` on a loopback port, with certificates from ``runguard certs``.

    ``directory`` holds ``certs/``, ``runguard.log`` (stdout and stderr: the decision
    log and the server's log) and, for ``up``, the pid. The port is kept across
    ``stop()`` / ``start()``, so a restarted server is the one the cluster knows.
    With ``owned=True`` the server dies with this process, however it dies.
    ``command`` is the program run for ``serve`` in place of ``runguard`` (a benchmark's
    wrapper of runguard's command line); the other commands are ``runguard``'s.
    """

    def __init__(
        self,
        directory: Path | str,
        policy_dir: Path | str,
        *,
        port: int | None = None,
        workers: int = 2,
        owned: bool = True,
        serve_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
        command: Sequence[str] = (),
    ) -> None:
        self.directory = Path(directory).resolve()
        self.policy_dir = Path(policy_dir).resolve()
        self.certs = self.directory / "certs"
        self.log = self.directory / "runguard.log"
        self.port = port or free_port()
        self.workers = workers
        self.owned = owned
        self.serve_args = tuple(serve_args)  # more `runguard serve` options (--client-ca)
        # Where it listens and how it is started: inside a cluster's network namespace
        # (``Cluster.command_prefix``), on that namespace's address.
        self.host = host
        self.command_prefix = tuple(command_prefix)
        self.command = tuple(command) or (runguard_command(),)
        self.pid: int | None = None
        self.registered = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.certs / "ca.crt"

    # -- lifecycle --

    def write_certs(self) -> None:
        """``runguard certs --host HOST``: the apiserver calls it by IP."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._run(
            "certs", "--service", "runguard", "--namespace", "runguard",
            "--out", str(self.certs), "--host", self.host,
        )  # fmt: skip

    def start(self, timeout: float = 60.0) -> None:
        """Start ``runguard serve`` (certificates first if there are none); wait until ready."""
        if not (self.certs / "tls.crt").is_file():
            self.write_certs()
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                [
                    *self.command_prefix,
                    *self.command,
                    "serve",
                    "-p",
                    str(self.policy_dir),
                    "--cert",
                    str(self.certs / "tls.crt"),
                    "--key",
                    str(self.certs / "tls.key"),
                    "--bind",
                    f"{self.host}:{self.port}",
                    "--workers",
                    str(self.workers),
                    *self.serve_args,
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
                preexec_fn=die_with_parent if self.owned else None,
            )
        self.pid = self._proc.pid
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group (master and workers), SIGKILL if it lingers."""
        if self.pid is not None:
            kill_group(self.pid, timeout)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
        self.pid = None
        self._proc = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until ``/readyz`` answers 200 (a policy is loaded); fails if the server exits."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ClusterError(
                    f"runguard serve exited with code {self._proc.returncode}; last lines of "
                    f"{self.log}:\n{tail(self.log)}"
                )
            try:
                status, body = self.readyz()
            except OSError as error:
                last = str(error)
            else:
                if status == 200:
                    return
                last = f"HTTP {status}: {body}"
            time.sleep(0.1)
        raise ClusterError(f"runguard not ready after {timeout:.0f}s ({last}):\n{tail(self.log)}")

    def readyz(self) -> tuple[int, dict[str, Any]]:
        """``GET /readyz``: the status code and the JSON detail (policy, rejected edits)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    # -- registration --

    def manifests(self, output: str = "yaml") -> str:
        """``runguard manifests --url``: the webhook configurations, calling this server."""
        return self.manifests_with("-o", output)

    def manifests_with(self, *args: str, floor: bool = False) -> str:
        """``runguard manifests --url`` with more options (``--policy-objects``); the
        floor only when asked (``unregister`` leaves ValidatingAdmissionPolicies, and a
        module sharing the cluster must not meet another's)."""
        return self._run(
            "manifests", "-p", str(self.policy_dir), "--url", self.url,
            "--ca-bundle", str(self.ca_file), *args, *(() if floor else ("--no-floor",)),
        )  # fmt: skip

    def register(self, cluster: Cluster) -> None:
        cluster.kubectl("apply", "-f", "-", input=self.manifests(), check=True)
        self.registered = True

    def unregister(self, cluster: Cluster) -> None:
        cluster.kubectl(
            "delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            "-l", "app.kubernetes.io/name=runguard", "--ignore-not-found", "--wait",
            check=True,
        )  # fmt: skip
        self.registered = False

    def _run(self, *args: str) -> str:
        done = subprocess.run(
            [runguard_command(), *args], capture_output=True, text=True, check=False, timeout=60
        )
        if done.returncode != 0:
            raise ClusterError(
                f"runguard {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
            )
        return done.stdout


# --- the shipped manifests, installed as an admin installs them -----------------------


def install_overlay(
    directory: Path,
    image: str,
    node_selector: dict[str, str],
    tolerations: Sequence[dict[str, str]] = (),
) -> Path:
    """``manifests/`` as shipped, with certificates from ``runguard certs`` (for the
    Service ``runguard.runguard.svc``), and an overlay doing what docs/operations.md
    asks of an admin: the image's name (``images``); plus ``node_selector`` keeping the
    replicas on the real nodes, as kwok's would only pretend to run them, and
    ``tolerations`` of those nodes' taint (``REAL_NODE_TOLERATION``). The shipped
    manifests name neither: both are this cluster's."""
    base = directory / "manifests"
    subprocess.run(["rm", "-rf", str(base), str(directory / "overlay")], check=True)
    shutil.copytree(REPO / "manifests", base, ignore=shutil.ignore_patterns("certs"))
    done = subprocess.run(
        [runguard_command(), "certs", "--service", "runguard", "--namespace", "runguard",
         "--out", str(base / "certs")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"runguard certs: {done.stderr}")
    name, _, tag = image.rpartition(":")
    overlay = directory / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../manifests"],
                "images": [{"name": "runguard", "newName": name, "newTag": tag}],
                "patches": [
                    {
                        "target": {"kind": "Deployment", "name": "runguard"},
                        "patch": json.dumps([
                            {"op": "add", "path": "/spec/template/spec/nodeSelector",
                             "value": node_selector},
                            *([{"op": "add", "path": "/spec/template/spec/tolerations",
                                "value": list(tolerations)}] if tolerations else []),
                        ]),
                    }
                ],
            },
            indent=2,
        )
    )  # fmt: skip
    return overlay


def install(cluster: Cluster, overlay: Path, timeout: float = 180.0) -> None:
    """The README's install, step by step: the namespace, the server-side dry run,
    runguard without its webhooks, until rolled out and every replica Ready, then the
    webhook configurations (by Service reference), until the apiserver calls them."""
    cluster.kubectl("apply", "-f", str(overlay.parent / "manifests" / "namespace.yaml"),
                    check=True)  # fmt: skip
    cluster.kubectl("apply", "-k", str(overlay), "--dry-run=server", check=True)
    cluster.kubectl("apply", "-k", str(overlay), "-l", "app.kubernetes.io/component!=admission",
                    check=True)  # fmt: skip
    cluster.kubectl("-n", "runguard", "rollout", "status", "deployment/runguard",
                    f"--timeout={timeout:.0f}s", check=True, timeout=timeout + 30)  # fmt: skip
    wait_ready_replicas(cluster, timeout)
    cluster.kubectl("apply", "-k", str(overlay), check=True)
    wait_called(cluster, timeout)


def run_labels(cluster: Cluster) -> dict[str, str]:
    """Labels a Pod needs to be a run: what the registered mutate.runguard.io webhook's
    objectSelector asks (``Exists`` and ``In`` satisfied by a value of their own)."""
    configuration = cluster.get_json(
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/runguard"
    )
    (hook,) = [h for h in configuration["webhooks"] if h["name"] == "mutate.runguard.io"]
    selector = hook.get("objectSelector", {})
    labels = dict(selector.get("matchLabels", {}))
    for expression in selector.get("matchExpressions", []):
        if expression["operator"] == "Exists":
            labels[expression["key"]] = "probe"
        elif expression["operator"] == "In":
            labels[expression["key"]] = expression["values"][0]
    return labels


def mutating_calls(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The mutating webhooks the apiserver called for the creation of Pod ``name`` (its
    audit annotations ``mutation.webhook.admission.k8s.io/round_*``)."""
    calls = []
    for event in cluster.audit_events(verb="create", resource="pods", namespace=namespace,
                                      name=name):  # fmt: skip
        for key, value in event.get("annotations", {}).items():
            if key.startswith("mutation.webhook.admission.k8s.io/"):
                calls.append(json.loads(value))
    return calls


def wait_called(cluster: Cluster, timeout: float = 60.0) -> None:
    """Until a server-side dry run of a run Pod is sent to mutate.runguard.io (seen in
    the audit log): registered webhooks are called once the apiserver's informers and
    the Service's endpoints have caught up."""
    labels = ",".join(f"{k}={v}" for k, v in run_labels(cluster).items())
    deadline = time.monotonic() + timeout
    for attempt in range(10_000):
        name = f"runguard-install-probe-{attempt}"
        cluster.kubectl("-n", "default", "run", name, "--image=x", "--restart=Never",
                        "--dry-run=server", "-l", labels)  # fmt: skip
        time.sleep(0.2)  # the audit log is written as the response goes out
        if any(c.get("webhook") == "mutate.runguard.io"
               for c in mutating_calls(cluster, "default", name)):  # fmt: skip
            return
        if time.monotonic() > deadline:
            break
    raise ClusterError(f"the apiserver did not call mutate.runguard.io within {timeout:.0f}s")


def wait_ready_replicas(cluster: Cluster, timeout: float = 180.0) -> list[dict[str, Any]]:
    """Until the Deployment's replicas all run (containers started and Ready, probes
    passing) and are the Service's ready endpoints; returns the Pods."""
    deadline = time.monotonic() + timeout
    while True:
        deployment = cluster.get_json("/apis/apps/v1/namespaces/runguard/deployments/runguard")
        pods = cluster.get_json(
            "/api/v1/namespaces/runguard/pods?labelSelector=app.kubernetes.io%2Fname%3Drunguard"
        )["items"]
        endpoints = cluster.get_json("/api/v1/namespaces/runguard/endpoints/runguard")
        ready_ips = {a["ip"] for s in endpoints.get("subsets", []) for a in s.get("addresses", [])}
        running = [p for p in pods if p.get("metadata", {}).get("deletionTimestamp") is None]
        ok = [
            p for p in running
            if all(c.get("ready") and c.get("started")
                   for c in p.get("status", {}).get("containerStatuses", [{}]))
            and p["status"].get("podIP") in ready_ips
        ]  # fmt: skip
        if len(ok) == len(running) == deployment["spec"]["replicas"]:
            return ok
        if time.monotonic() > deadline:
            raise ClusterError(
                f"runguard not Ready after {timeout:.0f}s: "
                + json.dumps([p.get("status", {}).get("containerStatuses") for p in pods])[:3000]
            )
        time.sleep(0.5)


# --- command line -------------------------------------------------------------------


def _runguard_pid(directory: Path) -> int | None:
    """The pid ``up`` recorded, if that process is still a ``runguard serve``."""
    try:
        state = json.loads((directory / RUNGUARD_STATE).read_text())
        cmdline = Path(f"/proc/{state['pid']}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError):
        return None
    args = [part.decode(errors="replace") for part in cmdline]
    if "serve" in args and any(Path(arg).name == "runguard" for arg in args[:2]):
        return int(state["pid"])
    return None


REAL_NODE_STATE = "realnode.json"


def _up(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    policy = Path(args.policy).resolve()
    if not policy.is_dir():
        print(f"devcluster: no policy directory {policy}", file=sys.stderr)
        return 2
    real_node = args.real_node or args.install
    if real_node and args.admission_only:
        print("devcluster: a real node needs the whole path (no --admission-only)",
              file=sys.stderr)  # fmt: skip
        return 2
    running = (directory / "state.json").exists() and Cluster.attach(directory).pids
    if running or _runguard_pid(directory) or (directory / REAL_NODE_STATE).exists():
        print(
            f"devcluster: a cluster is already running in {directory}; stop it first "
            f"(make cluster-down)",
            file=sys.stderr,
        )
        return 1
    started = time.monotonic()
    bin_dir = build_binaries()
    image = ""
    if real_node:
        ensure_tools()
        image = build_image()
    directory.mkdir(parents=True, exist_ok=True)
    netns = Netns.create(directory) if real_node else None
    cluster = Cluster(
        directory, bin_dir, owned=False, whole_path=not args.admission_only,
        address=netns.address if netns else "127.0.0.1", netns=netns.name if netns else None,
    )  # fmt: skip
    # Two: the shipped Deployment spreads its 2 replicas over two nodes.
    nodes = (
        [RealNode(cluster, directory / f"node-{i}", index=i, owned=False) for i in range(2)]
        if netns
        else []
    )
    objects = directory / "runguard" / "policy-objects"  # the mirror, with --policy-objects
    runguard = Runguard(
        directory / "runguard", objects if args.policy_objects else policy, owned=False,
        host=cluster.address, command_prefix=cluster.command_prefix,
        serve_args=("--policy-objects", str(cluster.kubeconfig)) if args.policy_objects else (),
    )  # fmt: skip
    try:

        def save_real_state() -> None:
            if netns is not None:
                state = {"netns": netns.to_state(), "nodes": [n.to_state() for n in nodes]}
                (directory / REAL_NODE_STATE).write_text(json.dumps(state) + "\n")

        save_real_state()
        cluster.start()
        for node in nodes:
            subprocess.run(["rm", "-rf", str(node.directory)], check=True)
            node.directory.mkdir(parents=True)
            node.start(images=[(image, image.rpartition(":")[0])])
            save_real_state()
        prepare_cluster(cluster)
        if args.install:
            overlay = install_overlay(
                directory / "install", image, REAL_NODES, [REAL_NODE_TOLERATION]
            )
            install(cluster, overlay)
        else:
            # Fresh certificates each time: the CA is the one registered below.
            subprocess.run(["rm", "-rf", str(runguard.certs)], check=True)
            runguard.log.unlink(missing_ok=True)
            if args.policy_objects:
                apply_policy_objects(cluster, policy, objects)
            runguard.start()
            (directory / RUNGUARD_STATE).write_text(
                json.dumps(
                    {"pid": runguard.pid, "url": runguard.url, "policy": str(policy)}, indent=2
                )
                + "\n"
            )
            runguard.register(cluster)
            if args.policy_objects:
                hook = runguard.manifests_with("--policy-objects")
                cluster.kubectl("apply", "-f", "-", input=hook, check=True)
    except BaseException:
        runguard.stop()
        _stop_all(directory, cluster, nodes, netns)
        raise
    nodes = (
        "  no controllers, scheduler or nodes (--admission-only): Pods stay Pending\n"
        if args.admission_only
        else f"  simulated nodes: {', '.join(n['metadata']['name'] for n in SIMULATED_NODES)}\n"
        + (f"  real nodes {', '.join(n.name for n in nodes)} (kubelet, containerd) with "
           f"{image}, tainted {taint_text(REAL_NODE_TAINT)} (only what tolerates it runs "
           f"there); logs in {directory}/node-*\n" if real_node else "")
        + f"  controller-manager, scheduler, kwok logs in {directory}\n"
        + (f"  every process in network namespace {netns.name}, no route out\n"
           if netns else "")
    )  # fmt: skip
    served = (
        f"runguard installed from manifests/ ({directory / 'install' / 'overlay'}), Ready "
        f"on the real nodes, webhooks by Service reference\n"
        if args.install
        else f"runguard {runguard.url} (policy {policy}) in place\n"
        f"  runguard log:   {runguard.log}\n"
        f"  policy edits in {policy} apply within seconds\n"
        if not args.policy_objects
        else f"runguard {runguard.url} serving the RunPolicy and Profile objects (applied "
        f"from {policy}): kubectl get profiles, kubectl edit profile NAME\n"
        f"  runguard log:   {runguard.log}\n"
    )
    print(
        f"kube-apiserver {cluster.server} ready after {time.monotonic() - started:.1f}s\n"
        f"  {served}"
        f"{nodes}"
        f"  audit log:      {cluster.audit_log}\n"
        f"  stop with: make cluster-down",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def apply_policy_objects(cluster: Cluster, policy: Path, mirror: Path) -> None:
    """The policy-objects CRDs installed, ``policy``'s files applied as objects, and an
    empty directory for runguard to mirror them into."""
    subprocess.run(["rm", "-rf", str(mirror)], check=True)
    mirror.mkdir(parents=True)
    component = REPO / "manifests" / "policy-objects"
    for crd in sorted(component.glob("runguard.io_*.yaml")):
        cluster.kubectl("apply", "--server-side", "-f", str(crd), check=True)
    cluster.kubectl(
        "wait", "--for=condition=Established",
        "crd/runpolicies.runguard.io", "crd/profiles.runguard.io",
        "crd/platforms.runguard.io", check=True,
    )  # fmt: skip
    cluster.kubectl("apply", "-f", str(policy), check=True)


def _stop_all(
    directory: Path, cluster: Cluster, nodes: Sequence[RealNode], netns: Netns | None
) -> None:
    """The real nodes, the cluster, then the network namespace (and its links)."""
    for node in nodes:
        node.stop()
    cluster.stop()
    if netns is not None:
        netns.delete()
    (directory / REAL_NODE_STATE).unlink(missing_ok=True)


def _down(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    stopped = []
    pid = _runguard_pid(directory)
    if pid is not None:
        kill_group(pid, 20.0)
        stopped.append("runguard")
    (directory / RUNGUARD_STATE).unlink(missing_ok=True)
    real: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        real = json.loads((directory / REAL_NODE_STATE).read_text())
    if (directory / "state.json").exists() or real:
        cluster = (
            Cluster.attach(directory)
            if (directory / "state.json").exists()
            else Cluster(directory, directory, owned=False, netns=real["netns"]["name"])
        )
        nodes = [RealNode.attach(cluster, state) for state in real.get("nodes", [])]
        netns = Netns.from_state(real["netns"]) if real else None
        _stop_all(directory, cluster, nodes, netns)
        (directory / "state.json").unlink(missing_ok=True)
        stopped.append("the cluster" + (f", its real nodes and {netns.name}" if netns else ""))
    print(
        f"stopped {' and '.join(stopped)} in {directory}"
        if stopped
        else f"no cluster in {directory}",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="devcluster.py",
        description="A local kube-apiserver with runguard registered (make cluster).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start cluster and runguard, register the webhooks")
    up.add_argument("--dir", required=True, help="state folder (certs, logs, kubeconfig, data)")
    up.add_argument("-p", "--policy", default="policies", help="policy directory, served in place")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="the cluster in its own network namespace, with a real node (kubelet, "
        "containerd) running the image `make image` builds",
    )
    up.add_argument(
        "--install",
        action="store_true",
        help="install runguard from manifests/ on the real node (implies --real-node) "
        "instead of serving the policy in place",
    )
    up.add_argument(
        "--policy-objects",
        action="store_true",
        help="the policy as RunPolicy and Profile objects (its CRDs installed, the policy "
        "directory applied with kubectl), served and checked by runguard",
    )
    up.add_argument(
        "--admission-only",
        action="store_true",
        help="no controller-manager, scheduler or simulated nodes (Pods stay Pending)",
    )
    up.set_defaults(func=_up)
    down = sub.add_parser("down", help="stop what up started")
    down.add_argument("--dir", required=True)
    down.set_defaults(func=_down)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ClusterError as error:
        print(f"devcluster: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
