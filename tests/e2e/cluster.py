"""A real single-node control plane, etcd + kube-apiserver, for runguard's e2e tests.

Used as a context manager by ``tests/e2e/conftest.py``, and as a command line by
``make cluster``::

    python tests/e2e/cluster.py up --dir DIR [--bin-dir BIN] [--apply FILE ...]
    python tests/e2e/cluster.py down --dir DIR

``up`` builds the binaries if needed (``tests/e2e/build.sh``), leaves both processes
running, writes their pids to ``DIR/state.json`` and prints the ``export KUBECONFIG``
line; ``down`` stops them. Everything else (certificates, kubeconfig, audit policy,
audit log, data, process logs) lives in DIR too.

There is no scheduler, controller-manager or kubelet: Pods stay Pending, no
ServiceAccount is created (the ServiceAccount admission plugin is off), and nothing
reconciles Jobs or Deployments. That is all admission needs.

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
    "Cluster",
    "ClusterError",
    "E2E_DIR",
    "build_binaries",
    "main",
]

E2E_DIR = Path(__file__).resolve().parent
STATE_FILE = "state.json"
CONTEXT = "runguard-e2e"

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


class ClusterError(RuntimeError):
    """The cluster could not be built, started or stopped; the message says why."""


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


def write_pki(directory: Path) -> Pki:
    """A CA, the apiserver serving cert, an admin client cert and the SA signing key."""
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
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
        ],
    )

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _cert(
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "runguard-e2e-admin"),
            ]
        ),
        admin_key,
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())

    pki = Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.serving_cert.write_bytes(serving.public_bytes(pem))
    pki.serving_key.write_bytes(_key_pem(serving_key))
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.sa_key.write_bytes(_key_pem(sa_key))
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for path in (pki.serving_key, pki.admin_key, pki.sa_key):
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


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Cluster:
    """etcd + kube-apiserver on free loopback ports, with everything under ``directory``.

    ``with Cluster(dir, bin_dir) as cluster:`` starts it and waits for ``/readyz``;
    leaving the block stops both process groups, even on an exception. With
    ``owned=False`` (the ``up`` command) the processes outlive this Python process.
    """

    def __init__(
        self,
        directory: Path | str,
        bin_dir: Path | str,
        *,
        kubectl: str | None = None,
        ready_timeout: float = 180.0,
        owned: bool = True,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.bin_dir = Path(bin_dir).resolve()
        self.kubectl_path = kubectl or os.environ.get("RUNGUARD_E2E_KUBECTL", "kubectl")
        self.ready_timeout = ready_timeout
        self.owned = owned
        self.kubeconfig = self.directory / "kubeconfig"
        self.audit_log = self.directory / "audit.log"
        self.audit_policy = self.directory / "audit-policy.yaml"
        self.pki = Pki(
            ca_cert=self.directory / "pki" / "ca.crt",
            serving_cert=self.directory / "pki" / "apiserver.crt",
            serving_key=self.directory / "pki" / "apiserver.key",
            admin_cert=self.directory / "pki" / "admin.crt",
            admin_key=self.directory / "pki" / "admin.key",
            sa_key=self.directory / "pki" / "sa.key",
            sa_pub=self.directory / "pki" / "sa.pub",
        )
        self.port = 0
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- lifecycle --

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

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
        """Write certificates, configs, start etcd and kube-apiserver, wait until ready."""
        for name in ("etcd", "kube-apiserver"):
            if not (self.bin_dir / name).is_file():
                raise ClusterError(f"{self.bin_dir / name} missing: run tests/e2e/build.sh")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pki = write_pki(self.directory / "pki")
        self.audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        # A free port can be taken between probing and binding: retry with fresh ones.
        for attempt in range(3):
            try:
                self._start_processes()
                self._wait_ready()
                return
            except ClusterError as error:
                self.stop()
                if "address already in use" not in str(error) or attempt == 2:
                    raise

    def stop(self, timeout: float = 15.0) -> None:
        """Stop kube-apiserver then etcd (their whole process groups)."""
        for name in ("kube-apiserver", "etcd"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                _kill_group(pid, timeout)
            proc = self._procs.pop(name, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1)

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
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--service-account-issuer=https://127.0.0.1:{self.port}",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                # No controller-manager creates default ServiceAccounts.
                "--disable-admission-plugins=ServiceAccount",
                # Privileged pods must reach runguard, not die in the apiserver's validation.
                "--allow-privileged=true",
                # A loopback address cannot be an Endpoints address: skip the reconciler.
                "--endpoint-reconciler-type=none",
                f"--audit-policy-file={self.audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--profiling=false",
            ],
        )
        self._write_kubeconfig()
        self._write_state()

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.directory / f"{name}.log", "ab")  # the child holds its own copy
        try:
            proc = subprocess.Popen(
                [str(self.bin_dir / name), *args],
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

    def _wait_ready(self) -> None:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
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
            try:
                with urllib.request.urlopen(
                    f"{self.server}/readyz", context=context, timeout=5
                ) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as error:
                last = f"HTTP {error.code}"
            except (OSError, ssl.SSLError) as error:
                last = str(error)
            time.sleep(0.25)
        raise ClusterError(
            f"kube-apiserver not ready after {self.ready_timeout:.0f}s ({last}); last lines "
            f"of its log:\n" + _tail(self.directory / "kube-apiserver.log")
        )

    def _write_kubeconfig(self) -> None:
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
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(self.pki.admin_cert),
                        "client-key": str(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": CONTEXT,
                    "context": {"cluster": CONTEXT, "user": "admin", "namespace": "default"},
                }
            ],
            "current-context": CONTEXT,
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _write_state(self) -> None:
        state = {
            "pids": self.pids,
            "port": self.port,
            "server": self.server,
            "bin_dir": str(self.bin_dir),
            "kubeconfig": str(self.kubeconfig),
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
        cluster = cls(directory, state["bin_dir"], owned=False)
        cluster.port = state["port"]
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

    def env(self) -> dict[str, str]:
        """Environment for a kubectl (or any client) talking to this cluster."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.directory / "kube-cache"),
        }

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # as in subprocess.run
        check: bool = False,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the system kubectl against this cluster; stdout and stderr captured as text."""
        done = subprocess.run(
            [self.kubectl_path, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster, as cluster-admin."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

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
    cluster = Cluster(directory, bin_dir, owned=False)
    started = time.monotonic()
    try:
        cluster.start()
        for manifest in args.apply:
            cluster.kubectl("apply", "-f", manifest, check=True)
    except BaseException:
        cluster.stop()
        raise
    print(
        f"kube-apiserver ready at {cluster.server} after {time.monotonic() - started:.1f}s; "
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
    up.add_argument("--bin-dir", help="folder with kube-apiserver and etcd (default: build)")
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
