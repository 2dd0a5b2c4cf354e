"""A real single-node cluster for runguard's e2e tests: etcd + kube-apiserver, and on
request the rest of the path a Pod takes (kube-controller-manager, kube-scheduler and
kwok's simulated nodes).

Used as a context manager by ``tests/e2e/conftest.py``, and as a command line by
``make cluster``::

    python tests/e2e/cluster.py up --dir DIR [--whole-path] [--bin-dir BIN] [--apply FILE ...]
    python tests/e2e/cluster.py down --dir DIR

``up`` builds the binaries if needed (``tests/e2e/build.sh``), leaves the processes
running, writes their pids to ``DIR/state.json`` and prints the ``export KUBECONFIG``
line; ``down`` stops them. Everything else (certificates, kubeconfigs, audit policy,
audit log, data, process logs) lives in DIR too.

The control plane alone (the e2e session's cluster) has no scheduler, controller-manager
or kubelet: Pods stay Pending, no ServiceAccount is created (the ServiceAccount
admission plugin is off), and nothing reconciles Jobs or Deployments. That is all
admission needs. ``start_whole_path()`` (``up --whole-path``, ``make cluster``) adds
them: the controller-manager with ``--use-service-account-credentials`` (each controller
acts as ``system:serviceaccount:kube-system:<name>-controller``), the scheduler, and
kwok managing the Nodes of ``SIMULATED_NODES`` (on-demand CPU, GPU and spot nodes):
Pods bound to them become Running, a Job's Pods then Succeed (``kwok-stages.yaml``).

Deliberately independent of runguard's own code: it stands for "a cluster". The
webhook configurations are registered by the caller (``runguard manifests ... |
kubectl apply -f -``, or ``up --apply FILE``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import ipaddress
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "AUDIT_POLICY",
    "COMPONENTS",
    "Cluster",
    "ClusterError",
    "E2E_DIR",
    "Identity",
    "SIMULATED_NODES",
    "build_binaries",
    "kubernetes_modfile",
    "kubernetes_version",
    "main",
    "simulated_node",
]

E2E_DIR = Path(__file__).resolve().parent
STATE_FILE = "state.json"
CONTEXT = "runguard-e2e"
KWOK_STAGES = E2E_DIR / "kwok-stages.yaml"
# Started after the apiserver by start_whole_path(), stopped before it, in this order.
COMPONENTS = ("kube-controller-manager", "kube-scheduler", "kwok")
CONTROL_PLANE = ("etcd", "kube-apiserver")

# Admission of Pods and pod controllers at level Request, so the apiserver also logs
# the webhook patches; the rest at Metadata or not at all, to keep the log small.
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Request",
            "resources": [
                {"group": "", "resources": ["pods", "pods/ephemeralcontainers"]},
                {"group": "batch", "resources": ["jobs", "cronjobs"]},
                {
                    "group": "apps",
                    "resources": ["deployments", "statefulsets", "replicasets", "daemonsets"],
                },
            ],
        },
        {
            "level": "Metadata",
            "resources": [
                {"group": "", "resources": ["namespaces"]},
                {"group": "admissionregistration.k8s.io"},
            ],
        },
        {"level": "None"},
    ],
}


# --- simulated nodes ----------------------------------------------------------------

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages the Nodes carrying it
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
A100_PRODUCT = "NVIDIA-A100-SXM4-80GB"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
# Spot nodes as policies/examples/mlrun/runpolicy.yaml's preemption section names them,
# and as the e2e platform policy (tests/cases/_policies/platform) does.
MLRUN_SPOT_LABELS = {"app.iguazio.com/lifecycle": "preemptible"}
PLATFORM_SPOT_LABELS = {"node-lifecycle": "spot"}


def simulated_node(
    name: str,
    *,
    cpu: str,
    memory: str,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    taints: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """A Node for kwok to run: capacity and allocatable as given, Ready once kwok sees it."""
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def _spot(labels: dict[str, str]) -> dict[str, Any]:
    """A spot node's labels, and a NoSchedule taint for each."""
    taints = [{"key": k, "value": v, "effect": "NoSchedule"} for k, v in labels.items()]
    return {"labels": labels, "taints": taints}


# The nodes start_whole_path() creates: what runguard's profiles and preemption modes
# steer runs to. The profiles name these labels (policies/profiles.yaml).
CPU_LARGE = {"labels": {"node.kubernetes.io/instance-type": "cpu-large"}}
SIMULATED_NODES: list[dict[str, Any]] = [
    simulated_node(name, cpu=cpu, memory=memory, **extra)
    for name, cpu, memory, extra in (
        ("kwok-cpu-0", "32", "128Gi", CPU_LARGE),
        ("kwok-cpu-1", "32", "128Gi", CPU_LARGE),
        ("kwok-gpu-a100-0", "64", "512Gi", {"gpus": 8, "taints": [GPU_TAINT],
                                            "labels": {GPU_PRODUCT_LABEL: A100_PRODUCT}}),
        ("kwok-gpu-t4-0", "32", "128Gi", {"gpus": 4, "taints": [GPU_TAINT],
                                          "labels": {GPU_PRODUCT_LABEL: "Tesla-T4"}}),
        ("kwok-spot-0", "32", "128Gi", _spot(MLRUN_SPOT_LABELS)),
        ("kwok-spot-1", "32", "128Gi", _spot(PLATFORM_SPOT_LABELS)),
    )
]  # fmt: skip


class ClusterError(RuntimeError):
    """The cluster could not be built, started or stopped; the message says why."""


def kubernetes_modfile() -> Path:
    """The go.mod build.sh builds the cluster from: go.mod (1.33), or
    go.kubernetes-<release>.mod for ``RUNGUARD_E2E_KUBERNETES=<release>``."""
    release = os.environ.get("RUNGUARD_E2E_KUBERNETES")
    return E2E_DIR / (f"go.kubernetes-{release}.mod" if release else "go.mod")


def kubernetes_version() -> tuple[int, int, int]:
    """The Kubernetes release the cluster runs, from its go.mod's ``k8s.io/kubernetes``
    pin: (1, 33, 13), (1, 37, 2), ... Tests whose expectation is a release's own
    behaviour (a scheduler message, a subresource it lacks) compare against it."""
    pinned = re.search(r"^\s*k8s\.io/kubernetes v(\d+)\.(\d+)\.(\d+)\s*$",
                       kubernetes_modfile().read_text(), re.MULTILINE)  # fmt: skip
    if pinned is None:
        raise ClusterError(f"{kubernetes_modfile()}: no k8s.io/kubernetes version")
    major, minor, patch = (int(part) for part in pinned.groups())
    return major, minor, patch


def build_binaries() -> Path:
    """Run build.sh (a no-op when cached) and return the folder holding the binaries."""
    done = subprocess.run(
        ["bash", str(E2E_DIR / "build.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise ClusterError(f"tests/e2e/build.sh failed with exit code {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


# --- certificates -----------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files the control plane and its clients use."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    sans: Sequence[x509.GeneralName] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # tolerate clock skew
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def pki_paths(directory: Path) -> Pki:
    """Where write_pki puts each file."""
    return Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )


def _client_name(user: str, groups: Sequence[str]) -> x509.Name:
    """CN is the user name, each O a group: what the apiserver's x509 authenticator reads."""
    return x509.Name(
        [
            *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups),
            x509.NameAttribute(NameOID.COMMON_NAME, user),
        ]
    )


def issue_client_cert(
    pki: Pki, cert: Path, key: Path, user: str, groups: Sequence[str] = ()
) -> None:
    """A client certificate for ``user`` in ``groups``, signed by the cluster's CA."""
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    client_key = ec.generate_private_key(ec.SECP256R1())
    signed = _cert(
        _client_name(user, groups),
        client_key,
        ca.subject,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    cert.write_bytes(signed.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(_key_pem(client_key))
    key.chmod(0o600)


def write_pki(directory: Path, address: str = "127.0.0.1") -> Pki:
    """A CA, the apiserver serving cert (for ``address`` and loopback), an admin client
    cert and the SA signing key."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runguard-e2e-ca")])
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        serving_key,
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            *(
                x509.IPAddress(ipaddress.ip_address(a))
                for a in dict.fromkeys(["127.0.0.1", address])
            ),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
        ],
    )

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _cert(
        _client_name("runguard-e2e-admin", ["system:masters"]),
        admin_key,
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())

    pki = pki_paths(directory)
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_cert.write_bytes(serving.public_bytes(pem))
    pki.serving_key.write_bytes(_key_pem(serving_key))
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.sa_key.write_bytes(_key_pem(sa_key))
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for path in (pki.ca_key, pki.serving_key, pki.admin_key, pki.sa_key):
        path.chmod(0o600)
    return pki


# --- processes ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Runs in the child: SIGKILL it when the test process dies, however it dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _kill_group(pid: int, timeout: float) -> None:
    """SIGTERM the process group led by pid, SIGKILL it if still there after timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _group_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists": reap it, if it is ours.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pgid, os.WNOHANG)[0] == pgid:
            return _group_alive(pgid)
    # Someone else's zombie (after `up`, the parent is whoever adopted it) is dead too.
    try:
        stat = Path(f"/proc/{pgid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _probe(url: str, context: ssl.SSLContext) -> str | None:
    """None when ``url`` answers 200, else what it answered."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ssl.SSLError) as error:
        return str(error)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Cluster:
    """etcd + kube-apiserver on free loopback ports, with everything under ``directory``.

    ``with Cluster(dir, bin_dir) as cluster:`` starts it and waits for ``/readyz``;
    leaving the block stops every process group, even on an exception. With
    ``whole_path=True`` (or a later ``start_whole_path()``) the controller-manager, the
    scheduler and kwok with its nodes run too. With ``owned=False`` (the ``up``
    command) the processes outlive this Python process.

    With ``netns`` (the name of a network namespace, ``realnode.Netns``) every process
    runs inside it and listens on ``address``, that namespace's end of its link to the
    host: what the cluster dials (webhook Services, Pods) then stays inside it. The
    apiserver resolves webhook Services to their endpoints (``--enable-aggregator-
    routing``): there is no kube-proxy to make ClusterIPs work.
    """

    def __init__(
        self,
        directory: Path | str,
        bin_dir: Path | str,
        *,
        kubectl: str | None = None,
        ready_timeout: float = 180.0,
        owned: bool = True,
        whole_path: bool = False,
        address: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.bin_dir = Path(bin_dir).resolve()
        self.address = address
        self.netns = netns
        # The release's own kubectl when build.sh built one (another release than go.mod's).
        built = self.bin_dir / "kubectl"
        self.kubectl_path = (
            kubectl
            or os.environ.get("RUNGUARD_E2E_KUBECTL")
            or (str(built) if built.is_file() else "kubectl")
        )
        self.ready_timeout = ready_timeout
        self.owned = owned
        self.whole_path = whole_path
        self.kubeconfig = self.directory / "kubeconfig"
        self.audit_log = self.directory / "audit.log"
        self.audit_policy = self.directory / "audit-policy.yaml"
        self.pki = pki_paths(self.directory / "pki")
        self.port = 0
        self.component_ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- lifecycle --

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def command_prefix(self) -> list[str]:
        """What runs a command inside the cluster's network namespace (nothing else of the
        host changes: same mounts, so a kubelet's volumes are what containerd sees)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write certificates, configs, start etcd and kube-apiserver, wait until ready;
        then the rest of the path if ``whole_path``."""
        self._check_binaries(CONTROL_PLANE + (COMPONENTS if self.whole_path else ()))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pki = write_pki(self.directory / "pki", self.address)
        self.audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        _retry_on_port_clash(self._start_processes, self._wait_ready, self.stop)
        if self.whole_path:
            try:
                self.start_whole_path()
            except BaseException:
                self.stop()
                raise

    def stop(self, timeout: float = 15.0) -> None:
        """Stop kwok, the scheduler, the controller-manager, kube-apiserver then etcd
        (their whole process groups)."""
        self._stop((*reversed(COMPONENTS), *reversed(CONTROL_PLANE)), timeout)

    def _stop(self, names: Sequence[str], timeout: float) -> None:
        for name in names:
            pid = self.pids.pop(name, None)
            if pid is not None:
                _kill_group(pid, timeout)
            proc = self._procs.pop(name, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1)

    def _check_binaries(self, names: Sequence[str]) -> None:
        for name in names:
            if not (self.bin_dir / name).is_file():
                raise ClusterError(f"{self.bin_dir / name} missing: run tests/e2e/build.sh")

    # -- the whole path: controllers, scheduler, simulated nodes --

    def start_whole_path(
        self, nodes: Sequence[dict[str, Any]] = SIMULATED_NODES, timeout: float = 120.0
    ) -> None:
        """Start kube-controller-manager, kube-scheduler and kwok beside the running
        apiserver, create ``nodes`` and wait until every one is Ready and schedulable
        (the controller-manager has lifted the not-ready taint)."""
        self._check_binaries(COMPONENTS)
        for name, user in (
            ("kube-controller-manager", "system:kube-controller-manager"),
            ("kube-scheduler", "system:kube-scheduler"),
        ):
            self._client_kubeconfig(self._component_kubeconfig(name), name, user)
        # kwok stands in for every kubelet: Node and Pod status, leases, deletions.
        self._client_kubeconfig(
            self._component_kubeconfig("kwok"), "kwok", "kwok-controller", ["system:masters"]
        )
        self.whole_path = True

        def stop() -> None:
            self._stop(tuple(reversed(COMPONENTS)), 15.0)

        try:
            _retry_on_port_clash(
                self._start_components, lambda: self._wait_components(timeout), stop
            )
            self.create_nodes(nodes)
            self.wait_for_nodes([node["metadata"]["name"] for node in nodes], timeout)
        except BaseException:
            stop()
            raise
        self._write_state()

    def stop_whole_path(self, *, delete_nodes: bool = True, timeout: float = 15.0) -> None:
        """Stop kwok, the scheduler and the controller-manager; delete the simulated
        Nodes (the Pods bound to them stay, as nothing collects them any more)."""
        self._stop(tuple(reversed(COMPONENTS)), timeout)
        self.whole_path = False
        if delete_nodes:
            self.kubectl("delete", "nodes", "-l", "type=kwok", "--wait=false", check=True)
        self._write_state()

    def create_nodes(self, nodes: Sequence[dict[str, Any]]) -> None:
        """Create (or update) Nodes, status included: kwok makes them Ready."""
        if not nodes:
            return
        listed = {"apiVersion": "v1", "kind": "List", "items": list(nodes)}
        self.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)

    def wait_for_nodes(self, names: Sequence[str], timeout: float = 120.0) -> None:
        """Until each Node is Ready without the not-ready taint (schedulable)."""
        deadline = time.monotonic() + timeout
        while True:
            listed = self.get_json("/api/v1/nodes")
            ready = {
                node["metadata"]["name"] for node in listed["items"] if _node_schedulable(node)
            }
            waiting = sorted(set(names) - ready)
            if not waiting:
                return
            self._check_alive(COMPONENTS)
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"nodes not Ready and schedulable after {timeout:.0f}s: {waiting}; last "
                    f"lines of {self.directory / 'kwok.log'}:\n"
                    + _tail(self.directory / "kwok.log")
                )
            time.sleep(0.25)

    def _component_kubeconfig(self, name: str) -> Path:
        return self.directory / f"{name}.kubeconfig"

    def _start_components(self) -> None:
        kcm_port, scheduler_port = _free_port(), _free_port()
        self.component_ports = {
            "kube-controller-manager": kcm_port,
            "kube-scheduler": scheduler_port,
        }
        kcm = self._component_kubeconfig("kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                # The apiserver has no request-header CA: do not look for one.
                "--authentication-skip-lookup=true",
                f"--bind-address={self.address}",
                f"--secure-port={kcm_port}",
                "--leader-elect=false",
                # Each controller acts as system:serviceaccount:kube-system:<name>-controller,
                # with a token the apiserver issues (signed with pki/sa.key).
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--cluster-signing-cert-file={self.pki.ca_cert}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                "--controllers=*",
                # Not /usr/libexec/kubernetes/...: the cluster writes only in its folder.
                f"--flex-volume-plugin-dir={self.directory / 'flexvolume'}",
                "--profiling=false",
            ],
        )
        scheduler = self._component_kubeconfig("kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={scheduler}",
                f"--authentication-kubeconfig={scheduler}",
                f"--authorization-kubeconfig={scheduler}",
                "--authentication-skip-lookup=true",
                f"--bind-address={self.address}",
                f"--secure-port={scheduler_port}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        # No --node-port / --server-address: kwok then listens on no port at all.
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={self._component_kubeconfig('kwok')}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.240.0.1",
            ],
            # kwok also reads ~/.kwok/kwok.yaml when it exists: keep it in the cluster dir.
            env={**os.environ, "KWOK_WORKDIR": str(self.directory / "kwok")},
        )
        self._write_state()

    def _wait_components(self, timeout: float) -> None:
        """Until the controller-manager and the scheduler answer ``/healthz``."""
        # Their serving certificates are self-signed in memory: nothing to verify against.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        for name, port in self.component_ports.items():
            last = "no answer yet"
            while True:
                self._check_alive(COMPONENTS)
                problem = _probe(f"https://{self.address}:{port}/healthz", context)
                if problem is None:
                    break
                last = problem
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{name} not healthy after {timeout:.0f}s ({last}); last lines of its "
                        f"log:\n" + _tail(self.directory / f"{name}.log")
                    )
                time.sleep(0.25)

    def _check_alive(self, names: Sequence[str]) -> None:
        """Raise with the end of its log if one of ``names`` (started here) has exited."""
        for name in names:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode}; last lines of "
                    f"{self.directory / (name + '.log')}:\n" + _tail(self.directory / f"{name}.log")
                )

    def _start_processes(self) -> None:
        etcd_port, peer_port, self.port = _free_port(), _free_port(), _free_port()
        data = self.directory / "etcd-data"
        if data.exists():
            subprocess.run(["rm", "-rf", str(data)], check=True)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                "--name=e2e",
                f"--data-dir={data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                "--unsafe-no-fsync",  # throwaway data: durability only costs time
                "--log-level=warn",
            ],
        )
        admission_config = self._write_webhook_client()
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.port}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--service-account-issuer=https://{self.address}:{self.port}",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                # No controller-manager creates default ServiceAccounts.
                "--disable-admission-plugins=ServiceAccount",
                # Privileged pods must reach runguard, not die in the apiserver's validation.
                "--allow-privileged=true",
                # A loopback address cannot be an Endpoints address: skip the reconciler.
                "--endpoint-reconciler-type=none",
                # The apiserver presents a client certificate to webhooks (mTLS, issue 13);
                # a runguard without --client-ca never asks for it.
                f"--admission-control-config-file={admission_config}",
                f"--audit-policy-file={self.audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--profiling=false",
                # Dynamic resource allocation, GA and on from 1.34, is beta and off before:
                # on, a Pod's resourceClaims reach admission as on the releases serving it.
                *(
                    ["--feature-gates=DynamicResourceAllocation=true"]
                    if (1, 32) <= kubernetes_version()[:2] < (1, 34)
                    else []
                ),
                *(
                    # Webhook Services resolve to a ready endpoint's Pod IP (no kube-proxy),
                    # and the real node's kubelet is reached at its InternalIP.
                    [
                        "--enable-aggregator-routing=true",
                        "--kubelet-preferred-address-types=InternalIP",
                    ]
                    if self.netns
                    else []
                ),
            ],
        )
        self._write_kubeconfig()
        self._write_state()

    @property
    def webhook_client_user(self) -> str:
        """The user name of the certificate the apiserver presents to webhooks."""
        return "kube-apiserver-webhook-client"

    def _write_webhook_client(self) -> Path:
        """An AdmissionConfiguration whose webhook kubeconfig gives every webhook ("*")
        a client certificate signed by the cluster's CA, as docs/dev/server.md shows."""
        cert, key = self.directory / "webhook-client.crt", self.directory / "webhook-client.key"
        issue_client_cert(self.pki, cert, key, self.webhook_client_user)
        kubeconfig = self.directory / "webhook-client.kubeconfig"
        user = {"client-certificate": str(cert), "client-key": str(key)}
        kubeconfig.write_text(
            json.dumps(
                {"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]}
            )
        )
        webhooks = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        config = self.directory / "admission-config.json"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": [
                        {"name": "ValidatingAdmissionWebhook", "configuration": webhooks},
                        {"name": "MutatingAdmissionWebhook", "configuration": webhooks},
                    ],
                }
            )
        )
        return config

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.directory / f"{name}.log", "ab")  # the child holds its own copy
        try:
            proc = subprocess.Popen(
                [*self.command_prefix, str(self.bin_dir / name), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,  # its own process group, killed as one
                preexec_fn=_die_with_parent if self.owned else None,
            )
        finally:
            log.close()
        self._procs[name] = proc
        self.pids[name] = proc.pid

    def _admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        """``GET path`` from the apiserver as cluster-admin, decoded (no kubectl: fast
        enough to poll)."""
        with urllib.request.urlopen(
            f"{self.server}{path}", context=self._admin_context(), timeout=timeout
        ) as response:
            return json.loads(response.read())

    def _wait_ready(self) -> None:
        context = self._admin_context()
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with code {proc.returncode} before the apiserver was "
                        f"ready; last lines of {self.directory / (name + '.log')}:\n"
                        + _tail(self.directory / f"{name}.log")
                    )
            problem = _probe(f"{self.server}/readyz", context)
            if problem is None:
                return
            last = problem
            time.sleep(0.25)
        raise ClusterError(
            f"kube-apiserver not ready after {self.ready_timeout:.0f}s ({last}); last lines "
            f"of its log:\n" + _tail(self.directory / "kube-apiserver.log")
        )

    def _write_kubeconfig(self) -> None:
        self._user_kubeconfig(
            self.kubeconfig,
            "admin",
            {"client-certificate": str(self.pki.admin_cert),
             "client-key": str(self.pki.admin_key)},
        )  # fmt: skip

    def _user_kubeconfig(
        self, path: Path, user: str, credentials: dict[str, str], namespace: str = "default"
    ) -> None:
        """A kubeconfig for this cluster whose one user presents ``credentials``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CONTEXT,
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [
                {
                    "name": CONTEXT,
                    "context": {"cluster": CONTEXT, "user": user, "namespace": namespace},
                }
            ],
            "current-context": CONTEXT,
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _client_kubeconfig(
        self, path: Path, stem: str, user: str, groups: Sequence[str] = ()
    ) -> None:
        """A client certificate for ``user`` in ``groups`` (in ``pki/``) and a kubeconfig
        presenting it."""
        cert, key = self.pki.ca_cert.parent / f"{stem}.crt", self.pki.ca_cert.parent / f"{stem}.key"
        issue_client_cert(self.pki, cert, key, user, groups)
        self._user_kubeconfig(path, stem, {"client-certificate": str(cert), "client-key": str(key)})

    def _write_state(self) -> None:
        state = {
            "pids": self.pids,
            "port": self.port,
            "server": self.server,
            "bin_dir": str(self.bin_dir),
            "kubeconfig": str(self.kubeconfig),
            "whole_path": self.whole_path,
            "component_ports": self.component_ports,
            "address": self.address,
            "netns": self.netns,
        }
        (self.directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def attach(cls, directory: Path | str) -> Cluster:
        """The cluster that ``up`` left running in directory (for ``down`` or reuse)."""
        directory = Path(directory).resolve()
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError) as error:
            raise ClusterError(f"no cluster state in {directory}: {error}") from error
        cluster = cls(
            directory,
            state["bin_dir"],
            owned=False,
            address=state.get("address", "127.0.0.1"),
            netns=state.get("netns"),
        )
        cluster.port = state["port"]
        cluster.whole_path = state.get("whole_path", False)
        cluster.component_ports = state.get("component_ports", {})
        # Only pids still running our binaries: a recycled pid must not be killed.
        for name, pid in state["pids"].items():
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if argv0 == str(cluster.bin_dir / name):
                cluster.pids[name] = pid
        return cluster

    # -- clients --

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for a kubectl (or any client) talking to this cluster, as
        cluster-admin or as the user of ``kubeconfig``."""
        return {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "KUBECACHEDIR": str(self.directory / "kube-cache"),
        }

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # as in subprocess.run
        check: bool = False,
        timeout: float = 120.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the system kubectl against this cluster (as cluster-admin unless
        ``kubeconfig`` says otherwise); stdout and stderr captured as text."""
        done = subprocess.run(
            [self.kubectl_path, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(kubeconfig),
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster, as cluster-admin unless
        ``kubeconfig`` says otherwise."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))  # type: ignore[no-untyped-call]

    # -- identities: who the apiserver (and so runguard) sees as the requester --

    def service_account(
        self,
        namespace: str,
        name: str,
        *,
        cluster_role: str | None = "edit",
        duration: str = "24h",
    ) -> Identity:
        """``system:serviceaccount:NAMESPACE:NAME``, as a platform running in the cluster
        is seen: the namespace and ServiceAccount are created if missing, ``cluster_role``
        is bound to it cluster-wide, and its kubeconfig carries a token from the
        TokenRequest API (``kubectl create token``)."""
        account = {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": name, "namespace": namespace}}  # fmt: skip
        space = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        listed = {"apiVersion": "v1", "kind": "List", "items": [space, account]}
        self.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        username = f"system:serviceaccount:{namespace}:{name}"
        if cluster_role is not None:
            subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
            self._bind(cluster_role, username, subject)
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}", check=True
        ).stdout.strip()
        path = self._identity_dir() / f"{_slug(username)}.kubeconfig"
        self._user_kubeconfig(path, _slug(username), {"token": token}, namespace)
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                  "system:authenticated")  # fmt: skip
        return Identity(self, username, groups, path)

    def user(
        self, name: str, groups: Sequence[str] = (), *, cluster_role: str | None = "edit"
    ) -> Identity:
        """User ``name`` in ``groups``, with a client certificate signed by the cluster's
        CA (CN=name, O=each group); ``cluster_role`` is bound to it cluster-wide."""
        if cluster_role is not None:
            self._bind(cluster_role, name, {"kind": "User", "name": name})
        path = self._identity_dir() / f"{_slug(name)}.kubeconfig"
        issue_client_cert(
            self.pki, path.with_suffix(".crt"), path.with_suffix(".key"), name, groups
        )
        self._user_kubeconfig(
            path,
            _slug(name),
            {"client-certificate": str(path.with_suffix(".crt")),
             "client-key": str(path.with_suffix(".key"))},
        )  # fmt: skip
        return Identity(self, name, (*groups, "system:authenticated"), path)

    def _identity_dir(self) -> Path:
        directory = self.directory / "identities"
        directory.mkdir(exist_ok=True)
        return directory

    def _bind(self, cluster_role: str, username: str, subject: dict[str, str]) -> None:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"runguard-e2e:{cluster_role}:{_slug(username)}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": cluster_role},
            "subjects": [subject if subject["kind"] == "ServiceAccount"
                         else {**subject, "apiGroup": "rbac.authorization.k8s.io"}],
        }  # fmt: skip
        self.kubectl("apply", "-f", "-", input=json.dumps(binding), check=True)

    # -- audit --

    def audit_events(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        stage: str | None = "ResponseComplete",
    ) -> list[dict[str, Any]]:
        """Audit events in the apiserver's log, oldest first, filtered by what is given."""
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        events = []
        for line in text.splitlines():
            if not line.strip():
                continue
            event: dict[str, Any] = json.loads(line)
            ref = event.get("objectRef", {})
            if (
                (verb is None or event.get("verb") == verb)
                and (stage is None or event.get("stage") == stage)
                and (resource is None or ref.get("resource") == resource)
                and (namespace is None or ref.get("namespace") == namespace)
                and (name is None or ref.get("name") == name)
            ):
                events.append(event)
        return events

    def wait_for_audit_event(
        self,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        *,
        timeout: float = 30.0,
        **match: str,
    ) -> dict[str, Any]:
        """The first audit event matching ``match`` and ``predicate``, polling the log."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.audit_events(**match):
                if predicate is None or predicate(event):
                    return event
            if time.monotonic() > deadline:
                raise ClusterError(f"no audit event matching {match} within {timeout:.0f}s")
            time.sleep(0.1)


@dataclass(frozen=True)
class Identity:
    """Someone the apiserver authenticates (``Cluster.service_account`` or
    ``Cluster.user``): the user name and groups it sees, and a kubeconfig to act as them.
    """

    cluster: Cluster
    username: str
    groups: tuple[str, ...]
    kubeconfig: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as this identity."""
        return self.cluster.kubectl(
            *args, input=input, check=check, timeout=timeout, kubeconfig=self.kubeconfig
        )

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` acting as this identity (close it after use)."""
        return self.cluster.api_client(self.kubeconfig)


def _slug(name: str) -> str:
    """A user name as a file or object name: ``system:serviceaccount:a:b`` -> ``...-a-b``."""
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")


def _node_schedulable(node: dict[str, Any]) -> bool:
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )
    taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
    return ready and not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def _retry_on_port_clash(
    start: Callable[[], None], wait: Callable[[], None], stop: Callable[[], None]
) -> None:
    """start() then wait(); a free port can be taken between probing and binding, so on
    "address already in use" stop() and try again with fresh ports (three tries)."""
    for attempt in range(3):
        try:
            start()
            wait()
            return
        except ClusterError as error:
            stop()
            if "address already in use" not in str(error) or attempt == 2:
                raise


# --- command line -------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    if (directory / STATE_FILE).exists() and Cluster.attach(directory).pids:
        print(
            f"a cluster is already running in {directory}; "
            f"run: {sys.argv[0]} down --dir {directory}",
            file=sys.stderr,
        )
        return 1
    bin_dir = Path(args.bin_dir) if args.bin_dir else build_binaries()
    cluster = Cluster(directory, bin_dir, owned=False, whole_path=args.whole_path)
    started = time.monotonic()
    try:
        cluster.start()
        for manifest in args.apply:
            cluster.kubectl("apply", "-f", manifest, check=True)
    except BaseException:
        cluster.stop()
        raise
    what = "kube-apiserver" if not args.whole_path else "kube-apiserver, controllers, nodes"
    print(
        f"{what} ready at {cluster.server} after {time.monotonic() - started:.1f}s; "
        f"logs and audit log in {directory}",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    if not (directory / STATE_FILE).exists():
        print(f"no cluster in {directory}", file=sys.stderr)
        return 0
    Cluster.attach(directory).stop()
    (directory / STATE_FILE).unlink()
    print(f"cluster in {directory} stopped", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cluster.py", description="A local etcd + kube-apiserver for runguard's e2e tests."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster and leave it running")
    up.add_argument("--dir", required=True, help="folder for certs, kubeconfig, logs, data")
    up.add_argument("--bin-dir", help="folder with the built binaries (default: build)")
    up.add_argument(
        "--whole-path",
        action="store_true",
        help="also kube-controller-manager, kube-scheduler and kwok's simulated nodes",
    )
    up.add_argument(
        "--apply",
        action="append",
        default=[],
        metavar="FILE",
        help="kubectl apply -f FILE once ready (repeatable), e.g. webhook configs",
    )
    up.set_defaults(func=_up)
    down = sub.add_parser("down", help="stop the cluster that up started")
    down.add_argument("--dir", required=True)
    down.set_defaults(func=_down)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ClusterError as error:
        print(f"cluster.py: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
