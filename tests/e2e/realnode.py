"""A real node for the e2e cluster, and the network namespace the whole cluster runs in.

kwok's nodes only pretend: a Pod bound to one is "Running" without any image. The real
node runs Pods: upstream's kubelet (built by ``build.sh`` from the same module as the
apiserver), Debian's containerd and runc, a sandbox ("pause") image built here from
``cmd/pause``, and the images it is given (``RealNode.load_image``: the runguard image
``make image`` builds). Nothing is pulled.

**No packet leaves the machine.** ``Netns`` is a network namespace with loopback and
one veth link to the host (a /30 of 198.18.0.0/15, the benchmarking range), and no
default route. The apiserver, etcd, the controllers, kwok, containerd and the kubelet
all run inside it (``nsenter --net``: only the network namespace changes, so the
kubelet's volume mounts are the ones containerd sees); Pods sit on a bridge inside it
(198.18.0.0/24, no default route either). Host-side clients (kubectl, these tests)
reach the apiserver at the namespace's end of the link. Deleting the namespace
deletes every link in it.

Linux only, as root (``ip netns``, containerd, the kubelet); ``scripts/image-tools.sh``
installs what is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .build import ClusterError
from .cluster import Cluster
from .nodes import node_schedulable
from .pki import issue_client_cert
from .processes import die_with_parent, stop_one, tail

__all__ = [
    "REAL_NODE",
    "REAL_NODE_TAINT",
    "REAL_NODE_TOLERATION",
    "Netns",
    "RealNode",
    "ensure_tools",
    "pod_subnet",
    "taint_text",
]

REPO = Path(__file__).resolve().parents[2]
REAL_NODE = "real-0"  # the first; RealNode(index=i) is real-<i>

# The real nodes run only what must really run (runguard's replicas, a test's probe):
# nothing is pulled there, so any other Pod the scheduler put on one would sit in
# ImagePullBackOff. The kubelet registers the Node with this taint; what belongs there
# tolerates it. The key is runguard's own domain: no taint of a real cluster, and no
# toleration a profile or the platform gives a run, names it.
REAL_NODE_TAINT = {"key": "runguard.io/real-node", "value": "true", "effect": "NoSchedule"}
REAL_NODE_TOLERATION = {**REAL_NODE_TAINT, "operator": "Equal"}


def taint_text(taint: dict[str, str]) -> str:
    """``key=value:Effect``, as ``kubectl taint`` and ``--register-with-taints`` write it."""
    return f"{taint['key']}={taint['value']}:{taint['effect']}"


def pod_subnet(index: int) -> str:
    """Node ``index``'s Pod addresses (a /24 of 198.18.0.0/17; the links use 198.18.100+)."""
    return f"198.18.{index}.0/24"


LINK_RANGE = range(100, 200)  # 198.18.<n>.0/30 links to the host, one per namespace
PAUSE_IMAGE = "localhost/pause:3.10"
CNI_BIN_DIR = Path("/usr/lib/cni")
NETNS_RECORDS = Path("/run/runguard-e2e/netns")  # name -> the cluster's folder


def _run(*args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def ensure_tools() -> None:
    """podman, containerd, runc, the CNI plugins: apt-get installed when missing."""
    _run("bash", str(REPO / "scripts" / "image-tools.sh"), timeout=900)


# --- the network namespace ------------------------------------------------------------


class Netns:
    """``ip netns add rg-<n>``: loopback up, a veth to the host, 198.18.<n>.1 on the
    host's end and 198.18.<n>.2 inside, and no other route. ``create()`` picks a free
    ``n`` (the name is the lock: ``ip netns add`` fails when it exists), and records
    the cluster's folder in ``NETNS_RECORDS``, so that a namespace whose test was
    killed can be found and removed later (``sweep_abandoned``)."""

    def __init__(self, name: str, slot: int) -> None:
        self.name = name
        self.slot = slot

    @property
    def host_address(self) -> str:
        return f"198.18.{self.slot}.1"

    @property
    def address(self) -> str:
        """The namespace's end of the link: where the host reaches the cluster."""
        return f"198.18.{self.slot}.2"

    @property
    def host_link(self) -> str:
        return f"rg{self.slot}h"

    @classmethod
    def create(cls, directory: Path) -> Netns:
        cls.sweep_abandoned()
        used = _run("ip", "-o", "-4", "addr", "show").stdout
        existing = set(_run("ip", "netns", "list").stdout.split())
        for slot in LINK_RANGE:
            name = f"rg-{slot}"
            if name in existing or f"198.18.{slot}." in used:
                continue
            if _run("ip", "netns", "add", name, check=False).returncode != 0:
                continue  # taken meanwhile
            netns = cls(name, slot)
            try:
                NETNS_RECORDS.mkdir(parents=True, exist_ok=True)
                (NETNS_RECORDS / name).write_text(str(Path(directory).resolve()))
                netns._wire()
            except BaseException:
                netns.delete()
                raise
            return netns
        raise ClusterError("no free 198.18.<n>.0/30 for a cluster network namespace")

    def _wire(self) -> None:
        inside = f"rg{self.slot}n"
        # IPv4 only: no IPv6 link-local addresses, router solicitations or MLD reports.
        _run(
            "ip",
            "netns",
            "exec",
            self.name,
            "sysctl",
            "-q",
            "-w",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        )
        _run("ip", "-n", self.name, "link", "set", "lo", "up")
        _run("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", inside,
             "netns", self.name)  # fmt: skip
        _run("sysctl", "-q", "-w", f"net.ipv6.conf.{self.host_link}.disable_ipv6=1")
        _run("ip", "addr", "add", f"{self.host_address}/30", "dev", self.host_link)
        _run("ip", "link", "set", self.host_link, "up")
        _run("ip", "-n", self.name, "addr", "add", f"{self.address}/30", "dev", inside)
        _run("ip", "-n", self.name, "link", "set", inside, "up")

    def routes(self) -> list[str]:
        """``ip route`` inside: the link's /30 and, once Pods run, the Pod bridge's."""
        return _run("ip", "-n", self.name, "-4", "route", "show").stdout.splitlines()

    def delete(self) -> None:
        """Deletes the namespace and so every link in it (the host's veth end too)."""
        _run("ip", "netns", "delete", self.name, check=False)
        _run("ip", "link", "delete", self.host_link, check=False)
        (NETNS_RECORDS / self.name).unlink(missing_ok=True)

    @classmethod
    def sweep_abandoned(cls, min_age: float = 900.0) -> list[str]:
        """Remove the namespaces of clusters whose process was killed: recorded here
        more than ``min_age`` seconds ago, and no control plane, containerd or kubelet
        left in them (containers' shims outlive a killed containerd: they are killed).
        Their nodes' mounts go too. Returns the names removed."""
        removed = []
        for record in sorted(NETNS_RECORDS.glob("rg-*")) if NETNS_RECORDS.is_dir() else []:
            if time.time() - record.stat().st_mtime < min_age:
                continue
            pids = _run("ip", "netns", "pids", record.name, check=False).stdout.split()
            names = set()
            for pid in pids:
                with contextlib.suppress(OSError):
                    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    names.add(Path(argv0.decode(errors="replace")).name)
            if names & {"etcd", "kube-apiserver", "kubelet", "containerd"}:
                continue  # alive (a make cluster left running)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            directory = Path(record.read_text().strip())
            kill_containers_under(directory)
            unmount_under(directory)
            ids = [s.name for s in directory.glob("**/containerd/runc/k8s.io/*")]
            for path in CNI_RESULTS.glob("*"):
                if path.name.startswith(f"runguard-e2e-{record.name}-") or any(
                    i in path.name for i in ids
                ):
                    path.unlink(missing_ok=True)
            for link in Path("/var/log/containers").glob("*.log"):
                with contextlib.suppress(OSError):
                    if os.readlink(link).startswith(f"{directory}/"):
                        link.unlink()
            slot = int(record.name.removeprefix("rg-"))
            cls(record.name, slot).delete()
            removed.append(record.name)
        if removed:
            restore_kernel_tunables()
        return removed

    def to_state(self) -> dict[str, Any]:
        return {"name": self.name, "slot": self.slot}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Netns:
        return cls(state["name"], state["slot"])


# --- images -------------------------------------------------------------------------


def build_image() -> str:
    """``make image`` (cached): the runguard image's name in podman's storage."""
    done = _run("bash", str(REPO / "scripts" / "build-image.sh"), timeout=1800)
    return done.stdout.strip().splitlines()[-1]


def _podman_env() -> dict[str, str]:
    cache = os.environ.get("RUNGUARD_IMAGE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "runguard" / "image"
    )
    return {**os.environ, "CONTAINERS_CONF": str(Path(cache) / "containers.conf")}


def save_image(image: str, archive: Path) -> None:
    """``podman save`` as an OCI archive (what ``ctr images import`` reads)."""
    archive.unlink(missing_ok=True)
    done = subprocess.run(
        ["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(archive), image],
        capture_output=True, text=True, timeout=300, env=_podman_env(), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"podman save {image}: {done.stderr.strip()}")


def build_pause_image(bin_dir: Path, directory: Path) -> Path:
    """The sandbox image: ``bin_dir/pause`` alone, from scratch; as an OCI archive."""
    context = directory / "pause-image"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    shutil.copy2(bin_dir / "pause", context / "pause")
    (context / "Containerfile").write_text(
        'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'
    )
    done = subprocess.run(
        ["podman", "build", "--quiet", "--pull=never", "--isolation", "chroot",
         "-t", PAUSE_IMAGE, str(context)],
        capture_output=True, text=True, timeout=300, env=_podman_env(), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"podman build of the pause image: {done.stderr.strip()}")
    archive = directory / "pause.tar"
    save_image(PAUSE_IMAGE, archive)
    return archive


# --- the node -----------------------------------------------------------------------


def containerd_config(directory: Path) -> str:
    """Debian's containerd defaults, with every path under ``directory``, the local
    pause image, runc with cgroupfs, and CNI from ``directory/cni``."""
    text = _run("containerd", "config", "default").stdout
    root, state = directory / "root", directory / "state"
    replacements = {
        r'^root = ".*"$': f'root = "{root}"',
        r'^state = ".*"$': f'state = "{state}"',
        r'^(\s*)address = "/run/containerd/containerd.sock"$':
            rf'\1address = "{directory / "containerd.sock"}"',
        r'^(\s*)sandbox_image = ".*"$': rf'\1sandbox_image = "{PAUSE_IMAGE}"',
        # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this kind of VM lacks.
        r"^(\s*)restrict_oom_score_adj = false$": r"\1restrict_oom_score_adj = true",
        # The Pods' network namespaces under state/, not /run/netns: ours alone to remove.
        r"^(\s*)netns_mounts_under_state_dir = false$": r"\1netns_mounts_under_state_dir = true",
        r'^(\s*)bin_dir = "/opt/cni/bin"$': rf'\1bin_dir = "{CNI_BIN_DIR}"',
        r'^(\s*)conf_dir = "/etc/cni/net.d"$': rf'\1conf_dir = "{directory / "cni"}"',
        r'^(\s*)path = "/opt/containerd"$': rf'\1path = "{directory / "opt"}"',
        # runc's state too (else /run/containerd/runc/k8s.io).
        r'^(\s*)Root = ""$': rf'\1Root = "{directory / "runc"}"',
    }  # fmt: skip
    for pattern, value in replacements.items():
        text, count = re.subn(pattern, value, text, flags=re.MULTILINE)
        if count != 1:
            raise ClusterError(f"containerd's default config changed: {pattern!r} ({count})")
    return text


CNI_RESULTS = Path("/var/lib/cni/results")  # libcni's cache, not configurable in containerd 1.6


def cni_config(directory: Path, network: str, index: int) -> dict[str, Any]:
    """A bridge for node ``index``'s Pods, leases kept under ``directory``."""
    return {
        "cniVersion": "0.4.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": f"rgpods{index}",
                # The bridge gets the subnet's first address (the kubelet's probes reach
                # the Pods through it), but Pods get no default route: nowhere else to go.
                "isGateway": True,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_subnet(index)}]],
                    "dataDir": str(directory / "ipam"),
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(
    directory: Path, containerd_socket: Path, address: str, index: int = 0
) -> dict[str, Any]:
    """What this VM needs (docs/dev/e2e.md, "The real node"): cgroupfs on cgroup v1, no QoS
    cgroups or node allocatable enforcement, no swap check, no eviction on filesystem
    stats (imagefs has none here), every path under ``directory``."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": 10250 + 10 * index,  # nodes share the namespace's address
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248 + 10 * index,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "imageServiceEndpoint": f"unix://{containerd_socket}",
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%",
                         "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "makeIPTablesUtilChains": False,
        "resolvConf": "",  # no DNS for Pods: nothing to resolve, nowhere to ask
        "maxPods": 30,
        "podLogsDir": str(directory / "pod-logs"),
        "volumePluginDir": str(directory / "volume-plugins"),
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }  # fmt: skip


# The kubelet changes the machine in a few places its flags do not reach: the kernel
# settings its container manager wants at start (overcommit 1, panic 10 s after an
# oops...), its device plugin socket and a folder of log links at fixed paths. What was
# there before the first of our kubelets is recorded and put back when the last stops.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")  # fmt: skip
KUBELET_FIXED_PATHS = (Path("/var/lib/kubelet"), Path("/var/lib/kubelet/device-plugins"),
                       Path("/var/log/containers"))  # fmt: skip
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
TUNABLES_RECORD = Path("/run/runguard-e2e/kernel-tunables-before-kubelet.json")


def record_kernel_tunables() -> None:
    """Before a kubelet starts: the machine's values, unless an earlier record holds them."""
    TUNABLES_RECORD.parent.mkdir(parents=True, exist_ok=True)
    values = {k: (Path("/proc/sys") / k).read_text().strip() for k in KERNEL_TUNABLES}
    created = [str(path) for path in KUBELET_FIXED_PATHS if not path.exists()]
    try:
        with open(TUNABLES_RECORD, "x") as record:
            json.dump({"sysctl": values, "created": created}, record)
    except FileExistsError:
        pass  # another of our kubelets runs (or one died): the record is from before it


def restore_kernel_tunables() -> None:
    """After a kubelet stopped: the recorded values back, once no kubelet runs."""
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
            if argv0.endswith(b"/kubelet"):
                return
    try:
        record = json.loads(TUNABLES_RECORD.read_text())
    except (OSError, ValueError):
        return
    for key, value in record["sysctl"].items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(value + "\n")
    DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
    for path in sorted(record["created"], key=len, reverse=True):
        with contextlib.suppress(OSError):
            Path(path).rmdir()  # only if empty
    TUNABLES_RECORD.unlink(missing_ok=True)


class RealNode:
    """containerd + kubelet inside the cluster's network namespace, registered as Node
    ``real-<index>`` (``REAL_NODE`` for 0), labelled ``type: real`` and tainted with
    ``REAL_NODE_TAINT``; state, logs and every mount under ``directory``. Several share
    the namespace: each its own containerd, Pod bridge and subnet (``pod_subnet``),
    kubelet ports."""

    def __init__(
        self, cluster: Cluster, directory: Path, *, index: int = 0, owned: bool = True
    ) -> None:
        if not cluster.netns:
            raise ClusterError("a real node needs the cluster in its own network namespace")
        self.cluster = cluster
        self.directory = Path(directory).resolve()
        self.owned = owned
        self.containerd_dir = self.directory / "containerd"
        self.kubelet_dir = self.directory / "kubelet"
        self.socket = self.containerd_dir / "containerd.sock"
        # One CNI network name per cluster namespace: libcni's cache files carry it.
        self.index = index
        self.name = f"real-{index}"
        self.network = f"runguard-e2e-{cluster.netns}-{index}"
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- lifecycle --

    def start(self, images: Sequence[tuple[str, str]] = (), timeout: float = 120.0) -> None:
        """containerd, the pause image and ``images`` ((name in podman, base name)),
        then the kubelet; until the Node is Ready and schedulable."""
        self.containerd_dir.mkdir(parents=True, exist_ok=True)
        (self.containerd_dir / "cni").mkdir(exist_ok=True)
        (self.containerd_dir / "cni" / "10-runguard-e2e.conflist").write_text(
            json.dumps(cni_config(self.containerd_dir, self.network, self.index), indent=2)
        )
        config = self.containerd_dir / "config.toml"
        config.write_text(containerd_config(self.containerd_dir))
        self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait_for(lambda: self._ctr("version", check=False).returncode == 0,
                       "containerd answering", 60.0)  # fmt: skip
        self.load_archive(
            build_pause_image(self.cluster.bin_dir, self.directory), "localhost/pause"
        )
        for image, base_name in images:
            self.load_image(image, base_name)
        self._start_kubelet()
        self._wait_for(self._node_ready, f"node {self.name} Ready and schedulable", timeout)

    def load_image(self, image: str, base_name: str) -> None:
        archive = self.directory / (hashlib.sha256(image.encode()).hexdigest()[:12] + ".tar")
        save_image(image, archive)
        self.load_archive(archive, base_name)
        archive.unlink()

    def load_archive(self, archive: Path, base_name: str) -> None:
        self._ctr("images", "import", "--base-name", base_name, str(archive), timeout=300)

    def _start_kubelet(self) -> None:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        record_kernel_tunables()
        config = self.directory / "kubelet-config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(self.directory, self.socket, self.cluster.address, self.index)
            )
        )
        kubeconfig = self.directory / "kubelet.kubeconfig"
        pki = self.cluster.pki
        cert = pki.ca_cert.parent / f"kubelet-{self.name}.crt"
        key = pki.ca_cert.parent / f"kubelet-{self.name}.key"
        # The node's own identity; system:masters because the Node authorizer is not on.
        issue_client_cert(pki, cert, key, f"system:node:{self.name}",
                          ["system:nodes", "system:masters"])  # fmt: skip
        self.cluster._user_kubeconfig(
            kubeconfig, "kubelet", {"client-certificate": str(cert), "client-key": str(key)}
        )
        self._spawn(
            "kubelet",
            [
                str(self.cluster.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.cluster.address}",
                f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={self.directory / 'kubelet-pki'}",
                "--node-labels=type=real",
                f"--register-with-taints={taint_text(REAL_NODE_TAINT)}",
                "--v=2",
            ],
        )

    def stop(self, timeout: float = 20.0) -> None:
        """The kubelet, every container, containerd; then every mount left under the
        node's folder (Secret volumes, rootfs, the Pods' network namespaces)."""
        self._stop("kubelet", timeout)
        for link in Path("/var/log/containers").glob("*.log"):  # the kubelet's links
            with contextlib.suppress(OSError):
                if os.readlink(link).startswith(f"{self.directory}/"):
                    link.unlink()
        restore_kernel_tunables()
        containers: list[str] = []
        if self.pids.get("containerd") or self._ctr("version", check=False).returncode == 0:
            containers = self._ctr("containers", "ls", "-q", check=False).stdout.split()
            for task in self._ctr("tasks", "ls", "-q", check=False).stdout.split():
                self._ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                tasks = self._ctr("tasks", "ls", "-q", check=False).stdout.split()
                for task in tasks:
                    self._ctr("tasks", "delete", task, check=False)
                if not tasks:
                    break
                time.sleep(0.2)
            for container in self._ctr("containers", "ls", "-q", check=False).stdout.split():
                self._ctr("containers", "delete", container, check=False)
        self._stop("containerd", timeout)
        kill_containers_under(self.directory)  # if containerd was gone already
        unmount_under(self.directory)
        # What libcni cached for our sandboxes (the Pods were killed, not torn down).
        for path in CNI_RESULTS.glob("*"):
            if path.name.startswith(f"{self.network}-") or any(c in path.name for c in containers):
                path.unlink(missing_ok=True)

    def _stop(self, name: str, timeout: float) -> None:
        stop_one(name, self.pids, self._procs, timeout)

    def to_state(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "index": self.index, "pids": self.pids}

    @classmethod
    def attach(cls, cluster: Cluster, state: dict[str, Any]) -> RealNode:
        node = cls(cluster, Path(state["directory"]), index=state.get("index", 0), owned=False)
        for name, pid in state["pids"].items():
            with contextlib.suppress(OSError):
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                if Path(argv0).name == name:
                    node.pids[name] = pid
        return node

    # -- helpers --

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.directory / f"{name}.log", "ab")  # the child holds its own copy
        try:
            proc = subprocess.Popen(
                [*self.cluster.command_prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
                preexec_fn=die_with_parent if self.owned else None,
            )
        finally:
            log.close()
        self._procs[name] = proc
        self.pids[name] = proc.pid

    def _ctr(
        self, *args: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args,
                    timeout=timeout, check=check)  # fmt: skip

    def _node_ready(self) -> bool:
        try:
            node = self.cluster.get_json(f"/api/v1/nodes/{self.name}")
        except OSError:
            return False
        return node_schedulable(node)

    def _wait_for(self, ready: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with code {proc.returncode} before {what}; last lines "
                        f"of its log:\n" + tail(self.directory / f"{name}.log")
                    )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"no {what} after {timeout:.0f}s; last lines of the kubelet's log:\n"
                    + tail(self.directory / "kubelet.log")
                )
            time.sleep(0.5)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's log as the kubelet wrote it (``kubectl logs`` needs the node's
        name in DNS)."""
        found = sorted((self.directory / "pod-logs").glob(f"{namespace}_{pod}_*/{container}/*.log"))
        return "".join(p.read_text(errors="replace") for p in found)


def kill_containers_under(directory: Path) -> None:
    """SIGKILL every container runc started with its state under ``directory`` (what a
    killed containerd leaves running: its shims die, their containers do not)."""
    for state in directory.glob("**/containerd/runc/k8s.io/*/state.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError):
            pid = int(json.loads(state.read_text())["init_process_pid"])
            # Still that container's init: its cgroup path names the container's id.
            if state.parent.name in Path(f"/proc/{pid}/cgroup").read_text():
                os.kill(pid, signal.SIGKILL)


def unmount_under(directory: Path) -> None:
    """Lazily unmount every mount point under ``directory``, deepest first."""
    prefix = str(directory.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
