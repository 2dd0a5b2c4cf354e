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

The harness, one module per job; ``Cluster`` is this module's control plane with the
parts the others add:

- ``build.py``: the binaries (``build.sh``), the Kubernetes release, ``ClusterError``;
- ``pki.py``: the CA, certificates and kubeconfigs;
- ``processes.py``: spawning, watching and stopping the processes, ``state.json``;
- ``clients.py``: kubectl, the API client, the audit log;
- ``identities.py``: ServiceAccounts and users to act as (``Identity``);
- ``wholepath.py`` and ``nodes.py``: the controllers, the scheduler, kwok and its nodes.

Deliberately independent of runguard's own code: it stands for "a cluster". The
webhook configurations are registered by the caller (``runguard manifests ... |
kubectl apply -f -``, or ``up --apply FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

if not __package__:  # run as a script: the harness is the package tests.e2e all the same
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.e2e"

import yaml

from .build import ClusterError, build_binaries, kubernetes_version
from .identities import Identities
from .pki import pki_paths, write_pki, write_webhook_client
from .processes import STATE_FILE, free_port, probe, retry_on_port_clash, tail
from .wholepath import COMPONENTS, WholePath

# ClusterError and build_binaries stay importable from here for bench/.
__all__ = ["AUDIT_POLICY", "Cluster", "ClusterError", "build_binaries", "main"]

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


class Cluster(WholePath, Identities):
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
        static_policies: Path | None = None,
    ) -> None:
        # The static ValidatingAdmissionPolicies' directory (manifest-based admission,
        # Kubernetes 1.37; its feature gate on): a module's own cluster, never the session's.
        self.static_policies = static_policies
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
        retry_on_port_clash(self._start_processes, self._wait_ready, self.stop)
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

    def _start_processes(self) -> None:
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
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
        admission_config = write_webhook_client(
            self.directory, self.pki, self.webhook_client_user, self.static_policies
        )
        gates = [
            # Dynamic resource allocation, GA and on from 1.34, is beta and off before:
            # on, a Pod's resourceClaims reach admission as on the releases serving it.
            *(
                ["DynamicResourceAllocation=true"]
                if (1, 32) <= kubernetes_version()[:2] < (1, 34)
                else []
            ),
            *(["ManifestBasedAdmissionControlConfig=true"] if self.static_policies else []),
        ]
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
                *([f"--feature-gates={','.join(gates)}"] if gates else []),
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
                        + tail(self.directory / f"{name}.log")
                    )
            problem = probe(f"{self.server}/readyz", context)
            if problem is None:
                return
            last = problem
            time.sleep(0.25)
        raise ClusterError(
            f"kube-apiserver not ready after {self.ready_timeout:.0f}s ({last}); last lines "
            f"of its log:\n" + tail(self.directory / "kube-apiserver.log")
        )

    def _write_kubeconfig(self) -> None:
        self._user_kubeconfig(
            self.kubeconfig,
            "admin",
            {"client-certificate": str(self.pki.admin_cert),
             "client-key": str(self.pki.admin_key)},
        )  # fmt: skip

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
