"""The rest of the path a Pod takes, beside the e2e cluster's apiserver:
kube-controller-manager (``--use-service-account-credentials``: each controller acts as
``system:serviceaccount:kube-system:<name>-controller``), kube-scheduler, and kwok
standing in for every kubelet on the simulated nodes of ``nodes.py``.

``WholePath`` is the part of ``Cluster`` that starts and stops them
(``start_whole_path()``, ``up --whole-path``, ``make cluster``).
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .build import E2E_DIR, ClusterError
from .clients import Clients
from .nodes import KWOK_NODE_ANNOTATION, SIMULATED_NODES, node_schedulable
from .processes import free_port, probe, retry_on_port_clash, tail

__all__ = ["COMPONENTS", "WholePath"]

KWOK_STAGES = E2E_DIR / "kwok-stages.yaml"
# Started after the apiserver by start_whole_path(), stopped before it, in this order.
COMPONENTS = ("kube-controller-manager", "kube-scheduler", "kwok")
# What makes Pods: cleared with the Pods before the path starts (owners first).
WORKLOADS = "cronjobs,jobs,deployments,statefulsets,daemonsets,replicasets"


class WholePath(Clients):
    """The controller-manager, the scheduler and kwok of a ``Cluster``."""

    def start_whole_path(
        self, nodes: Sequence[dict[str, Any]] = SIMULATED_NODES, timeout: float = 120.0
    ) -> None:
        """Start kube-controller-manager, kube-scheduler and kwok beside the running
        apiserver, create ``nodes`` and wait until every one is Ready and schedulable
        (the controller-manager has lifted the not-ready taint). What earlier modules
        left is cleared first (``clear_runs``): the scheduler would place it."""
        self._check_binaries(COMPONENTS)
        self.clear_runs()
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
            retry_on_port_clash(
                self._start_components, lambda: self._wait_components(timeout), stop
            )
            self.create_nodes(nodes)
            self.wait_for_nodes([node["metadata"]["name"] for node in nodes], timeout)
        except BaseException:
            stop()
            raise
        self._write_state()

    def clear_runs(self) -> None:
        """Delete every workload and Pod outside ``kube-system``, Pods' finalizers
        included. Pods left Pending by the admission-only modules, or bound to the
        simulated nodes of an earlier start (kwok keeps bare Pods Running for ever),
        would otherwise be scheduled first and hold the nodes' GPUs; a stopped Kueue or
        job-controller no longer lifts its finalizer from a Pod."""
        outside = ("-A", "--field-selector", "metadata.namespace!=kube-system")
        for kind in (WORKLOADS, "pods"):
            listed = self.kubectl("get", kind, *outside, "-o", "json", check=True).stdout
            for item in json.loads(listed)["items"]:
                meta = item["metadata"]
                if meta.get("finalizers"):
                    where = (item["kind"].lower(), meta["name"], "-n", meta["namespace"])
                    release = '{"metadata":{"finalizers":null}}'
                    self.kubectl("patch", *where, "--type=merge", "-p", release)
            self.kubectl("delete", kind, *outside, "--wait=false", "--ignore-not-found",
                         "--grace-period=0", "--force", check=True)  # fmt: skip

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
            ready = {node["metadata"]["name"] for node in listed["items"] if node_schedulable(node)}
            waiting = sorted(set(names) - ready)
            if not waiting:
                return
            self._check_alive(COMPONENTS)
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"nodes not Ready and schedulable after {timeout:.0f}s: {waiting}; last "
                    f"lines of {self.directory / 'kwok.log'}:\n" + tail(self.directory / "kwok.log")
                )
            time.sleep(0.25)

    def _component_kubeconfig(self, name: str) -> Path:
        return self.directory / f"{name}.kubeconfig"

    def _start_components(self) -> None:
        kcm_port, scheduler_port = free_port(), free_port()
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
                problem = probe(f"https://{self.address}:{port}/healthz", context)
                if problem is None:
                    break
                last = problem
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{name} not healthy after {timeout:.0f}s ({last}); last lines of its "
                        f"log:\n" + tail(self.directory / f"{name}.log")
                    )
                time.sleep(0.25)
