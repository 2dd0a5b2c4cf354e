"""The e2e cluster's processes: each started in its own process group (killed as one,
and with the test process unless it is to outlive it), on free loopback ports, its
output in ``NAME.log``; ``state.json`` lists them for ``cluster.py down``.

``Processes`` is the part of ``Cluster`` that spawns, watches and stops them; the
functions are shared with ``devcluster.py`` (runguard), ``realnode.py`` (containerd,
the kubelet) and ``kueue.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from .build import ClusterError

__all__ = [
    "STATE_FILE",
    "Processes",
    "die_with_parent",
    "free_port",
    "group_alive",
    "kill_group",
    "probe",
    "retry_on_port_clash",
    "tail",
]

STATE_FILE = "state.json"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def die_with_parent() -> None:
    """Runs in the child: SIGKILL it when the test process dies, however it dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def kill_group(pid: int, timeout: float) -> None:
    """SIGTERM the process group led by pid, SIGKILL it if still there after timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists": reap it, if it is ours.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pgid, os.WNOHANG)[0] == pgid:
            return group_alive(pgid)
    # Someone else's zombie (after `up`, the parent is whoever adopted it) is dead too.
    try:
        stat = Path(f"/proc/{pgid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def probe(url: str, context: ssl.SSLContext) -> str | None:
    """None when ``url`` answers 200, else what it answered."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (OSError, ssl.SSLError) as error:
        return str(error)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def retry_on_port_clash(
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


def stop_one(
    name: str, pids: dict[str, int], procs: dict[str, subprocess.Popen[bytes]], timeout: float
) -> None:
    """Stop the process ``name`` started (its whole group) and forget it: its pid in
    ``pids`` (read back from a state file, or its ``Popen`` in ``procs``, reaped)."""
    pid = pids.pop(name, None)
    if pid is not None:
        kill_group(pid, timeout)
    proc = procs.pop(name, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)


class Processes:
    """The processes of a ``Cluster`` (whose ``__init__`` sets these attributes): where
    they run, what they listen on, and their pids."""

    directory: Path
    bin_dir: Path
    address: str
    netns: str | None
    owned: bool
    whole_path: bool
    kubeconfig: Path
    port: int
    component_ports: dict[str, int]
    pids: dict[str, int]
    _procs: dict[str, subprocess.Popen[bytes]]

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def command_prefix(self) -> list[str]:
        """What runs a command inside the cluster's network namespace (nothing else of the
        host changes: same mounts, so a kubelet's volumes are what containerd sees)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []

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
                preexec_fn=die_with_parent if self.owned else None,
            )
        finally:
            log.close()
        self._procs[name] = proc
        self.pids[name] = proc.pid

    def _stop(self, names: Sequence[str], timeout: float) -> None:
        for name in names:
            stop_one(name, self.pids, self._procs, timeout)

    def _check_binaries(self, names: Sequence[str]) -> None:
        for name in names:
            if not (self.bin_dir / name).is_file():
                raise ClusterError(f"{self.bin_dir / name} missing: run tests/e2e/build.sh")

    def _check_alive(self, names: Sequence[str]) -> None:
        """Raise with the end of its log if one of ``names`` (started here) has exited."""
        for name in names:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode}; last lines of "
                    f"{self.directory / (name + '.log')}:\n" + tail(self.directory / f"{name}.log")
                )

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
