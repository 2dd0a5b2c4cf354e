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
KUBECONFIG=...`` line on stdout; ``down`` stops everything.

runguard is driven only through its command line, as an admin would drive it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__:
    from .cluster import (
        SIMULATED_NODES,
        Cluster,
        ClusterError,
        _die_with_parent,
        _free_port,
        _kill_group,
        _tail,
        build_binaries,
    )
else:  # run as a script: python tests/e2e/devcluster.py
    from cluster import (  # type: ignore[no-redef]
        SIMULATED_NODES,
        Cluster,
        ClusterError,
        _die_with_parent,
        _free_port,
        _kill_group,
        _tail,
        build_binaries,
    )

__all__ = ["CLUSTER_OBJECTS", "PRIORITIES", "Runguard", "prepare_cluster", "main"]

RUNGUARD_STATE = "runguard.json"

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
    ) -> None:
        self.directory = Path(directory).resolve()
        self.policy_dir = Path(policy_dir).resolve()
        self.certs = self.directory / "certs"
        self.log = self.directory / "runguard.log"
        self.port = port or _free_port()
        self.workers = workers
        self.owned = owned
        self.serve_args = tuple(serve_args)  # more `runguard serve` options (--client-ca)
        self.pid: int | None = None
        self.registered = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.certs / "ca.crt"

    # -- lifecycle --

    def write_certs(self) -> None:
        """``runguard certs --host 127.0.0.1``: the apiserver calls it by IP."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._run(
            "certs", "--service", "runguard", "--namespace", "runguard",
            "--out", str(self.certs), "--host", "127.0.0.1",
        )  # fmt: skip

    def start(self, timeout: float = 60.0) -> None:
        """Start ``runguard serve`` (certificates first if there are none); wait until ready."""
        if not (self.certs / "tls.crt").is_file():
            self.write_certs()
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                [
                    runguard_command(),
                    "serve",
                    "-p",
                    str(self.policy_dir),
                    "--cert",
                    str(self.certs / "tls.crt"),
                    "--key",
                    str(self.certs / "tls.key"),
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    str(self.workers),
                    *self.serve_args,
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.owned else None,
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
            _kill_group(self.pid, timeout)
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
                    f"{self.log}:\n{_tail(self.log)}"
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
        raise ClusterError(f"runguard not ready after {timeout:.0f}s ({last}):\n{_tail(self.log)}")

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
        return self._run(
            "manifests", "-p", str(self.policy_dir), "--url", self.url,
            "--ca-bundle", str(self.ca_file), "-o", output,
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


def _up(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    policy = Path(args.policy).resolve()
    if not policy.is_dir():
        print(f"devcluster: no policy directory {policy}", file=sys.stderr)
        return 2
    running = (directory / "state.json").exists() and Cluster.attach(directory).pids
    if running or _runguard_pid(directory):
        print(
            f"devcluster: a cluster is already running in {directory}; stop it first "
            f"(make cluster-down)",
            file=sys.stderr,
        )
        return 1
    started = time.monotonic()
    cluster = Cluster(directory, build_binaries(), owned=False, whole_path=not args.admission_only)
    runguard = Runguard(directory / "runguard", policy, owned=False)
    try:
        cluster.start()
        # Fresh certificates each time: the CA is the one registered below.
        subprocess.run(["rm", "-rf", str(runguard.certs)], check=True)
        runguard.log.unlink(missing_ok=True)
        runguard.start()
        (directory / RUNGUARD_STATE).write_text(
            json.dumps({"pid": runguard.pid, "url": runguard.url, "policy": str(policy)}, indent=2)
            + "\n"
        )
        prepare_cluster(cluster)
        runguard.register(cluster)
    except BaseException:
        runguard.stop()
        cluster.stop()
        raise
    nodes = (
        "  no controllers, scheduler or nodes (--admission-only): Pods stay Pending\n"
        if args.admission_only
        else f"  simulated nodes: {', '.join(n['metadata']['name'] for n in SIMULATED_NODES)}\n"
        f"  controller-manager, scheduler, kwok logs in {directory}\n"
    )
    print(
        f"kube-apiserver {cluster.server} and runguard {runguard.url} (policy {policy}) "
        f"ready after {time.monotonic() - started:.1f}s\n"
        f"{nodes}"
        f"  runguard log:   {runguard.log}\n"
        f"  audit log:      {cluster.audit_log}\n"
        f"  policy edits in {policy} apply within seconds; stop with: make cluster-down",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    stopped = []
    pid = _runguard_pid(directory)
    if pid is not None:
        _kill_group(pid, 20.0)
        stopped.append("runguard")
    (directory / RUNGUARD_STATE).unlink(missing_ok=True)
    if (directory / "state.json").exists():
        Cluster.attach(directory).stop()
        (directory / "state.json").unlink()
        stopped.append("the cluster")
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
