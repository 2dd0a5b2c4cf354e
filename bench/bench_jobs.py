"""A run Job through the job-controller: from its create to its first Pod (not a test).

In a ``bench_create.CreateLatency`` cluster, once its rounds are done, the rest of the
path is started (``Cluster.start_whole_path``: kube-controller-manager, the scheduler,
kwok's nodes). Then, the cases alternating Job by Job, the platform (a token, as in the
rounds) creates a run Job (real, not dry run) and the time is taken from sending the
create to a watch on the namespace's Pods seeing the job-controller's first Pod:

* ``job_pod_ms_none``: ``bench-none``, no admission;
* ``job_pod_ms_pair``: ``bench-pair``, runguard's two configurations: the Job through
  its controller webhooks (``/mutate`` writes the profile into the template at CREATE),
  the job-controller's Pod through its Pod webhooks;
* ``job_pod_ms_map_vap``: ``bench-map``, the MutatingAdmissionPolicy + VAP of
  ``bench_peers.MapSide`` (they match Pods only: the Pod gets the profile at its create).

The Job's template is a run as the platform submits it (the run's labels, profile
``1xt4``, one container, no platform object: a VAP cannot tell the job-controller
creating a Pod on the platform's behalf from anyone else). Each Job is deleted
(background propagation) after its Pod is seen. Medians in ms, and the added figures
``job_pod_added_ms_*`` (each case's median minus no admission's, per round).

Coarse: the job-controller's own latency dominates and, in most runs, every case moved
together from ~20-35 ms in the first round to ~70-140 ms in later ones (cause not
found: not the controller-manager's client rate limiter, whose wait stayed at 0);
the cases alternate Job by Job, so each round compares them at the same moment.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import statistics
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import bench_cel
from bench_create import NS, CreateLatency, full_pod
from e2e.cluster import ClusterError

JSON = dict[str, Any]
CASES = {"none": NS["none"], "pair": NS["pair"], "map_vap": bench_cel.MAP_NS}
JOB_LABEL = "batch.kubernetes.io/job-name"
MAX_JOBS = 100  # per case


def run_job(name: str) -> JSON:
    """A run Job as the platform submits it: the template carries the run's labels and
    names the profile; nothing else of the profile is in it."""
    labels = dict(full_pod()["metadata"]["labels"])
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [
                {"name": "main", "image": "python:3.11", "command": ["python", "train.py"]}
            ],  # fmt: skip
            "restartPolicy": "Never",
        },
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": template, "backoffLimit": 0}}  # fmt: skip


class JobPodLatency:
    """``start()`` the controllers beside ``create``'s apiserver, then ``round(jobs)``."""

    def __init__(self, create: CreateLatency, log: Callable[[str], None] = print) -> None:
        self.create = create
        self.log = log
        self.created = 0
        self.rounds_done = 0
        self.cases = dict(CASES)

    def start(self) -> None:
        cluster = self.create.cluster
        if cluster is None:
            raise ClusterError("the e2e apiserver is not running")
        if bench_cel.MAP_NS not in {ns for ns, _ in self.create.cases.values()}:
            del self.cases["map_vap"]  # no MapSide in this cluster
        started = time.monotonic()
        cluster.start_whole_path()
        self.log(f"controller-manager, scheduler and kwok ready in "
                 f"{time.monotonic() - started:.1f}s")  # fmt: skip
        for case in self.cases:  # warm: the job-controller's informers, the webhooks
            self._one(case)

    def round(self, jobs: int = 20) -> dict[str, float]:
        """``jobs`` Jobs per case, the cases alternating Job by Job (their order rotated
        each round); medians in ms, the added figures, the load."""
        times: dict[str, list[float]] = {case: [] for case in self.cases}
        cases = list(self.cases)
        shift = self.rounds_done % len(cases)
        cases = cases[shift:] + cases[:shift]
        self.rounds_done += 1
        load_before = os.getloadavg()[0]
        for _ in range(max(1, min(jobs, MAX_JOBS))):
            for case in cases:
                times[case].append(self._one(case))
        out = {f"job_pod_ms_{case}": statistics.median(v) for case, v in times.items()}
        out["load_1m"] = (load_before + os.getloadavg()[0]) / 2
        for case in self.cases:
            if case != "none":
                out[f"job_pod_added_ms_{case}"] = out[f"job_pod_ms_{case}"] - out["job_pod_ms_none"]
        return out

    def _one(self, case: str, timeout: float = 30.0) -> float:
        """ms from sending the Job's create to the watch seeing its first Pod."""
        assert self.create.client is not None and self.create.cluster is not None
        namespace = self.cases[case]
        self.created += 1
        name = f"run-{case.replace('_', '-')}-{self.created}"
        watch, events = self._watch(namespace, name, timeout)
        try:
            body = json.dumps(run_job(name)).encode()
            started = time.perf_counter()
            status, data, _, _ = self.create.client.post(
                f"/apis/batch/v1/namespaces/{namespace}/jobs", body
            )
            if status != 201:
                raise ClusterError(f"{case}: Job create answered {status}: {data[:300]!r}")
            pod = _first_added(events, f"{namespace}/{name}")
            elapsed = (time.perf_counter() - started) * 1000
        finally:
            watch.close()
        self.create.cluster.kubectl(
            "delete", "job", name, "-n", namespace, "--cascade=background", "--wait=false",
            check=True,
        )  # fmt: skip
        limits = pod["spec"]["containers"][0].get("resources", {}).get("limits")
        if bool(limits) != (case != "none"):  # the profile, given by admission only
            raise ClusterError(f"{case}: the job-controller's Pod has limits {limits}")
        return elapsed

    def _watch(
        self, namespace: str, job: str, timeout: float
    ) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        """A watch of ``job``'s Pods, established (its answer's head read) before the
        Job is created, as cluster-admin on its own connection."""
        cluster = self.create.cluster
        assert cluster is not None
        context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        context.load_cert_chain(str(cluster.pki.admin_cert), str(cluster.pki.admin_key))
        conn = http.client.HTTPSConnection(
            "127.0.0.1", cluster.port, context=context, timeout=timeout
        )
        # resourceVersion 0: from the watch cache as it is, at once (unset, the apiserver
        # may first wait for its cache to catch up with etcd). No Pod of this Job exists
        # yet, so none is missed.
        query = urllib.parse.urlencode({"watch": "true", "labelSelector": f"{JOB_LABEL}={job}",
                                        "resourceVersion": "0",
                                        "timeoutSeconds": str(int(timeout))})  # fmt: skip
        conn.request("GET", f"/api/v1/namespaces/{namespace}/pods?{query}")
        response = conn.getresponse()
        if response.status != 200:
            conn.close()
            raise ClusterError(f"watch of {namespace} pods answered {response.status}")
        return conn, response


def _first_added(events: http.client.HTTPResponse, what: str) -> JSON:
    """Read the watch's events until the first ADDED: its Pod."""
    while True:
        line = events.readline()
        if not line:
            raise ClusterError(f"{what}: the watch ended before the job-controller's Pod")
        event = json.loads(line)
        if event.get("type") == "ADDED":
            pod: JSON = event["object"]
            return pod
        if event.get("type") == "ERROR":
            raise ClusterError(f"{what}: watch error {event.get('object')}")
