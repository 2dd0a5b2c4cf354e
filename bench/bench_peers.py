"""runguard beside the peers an admin picks in 2026, on the same 1.37 apiserver (not a test).

One ``bench_create.CreateLatency`` cluster (the e2e build of ``RUNGUARD_E2E_KUBERNETES``,
1.37 unless set: MutatingAdmissionPolicy is GA and on by default from 1.36, no flag),
and in it, each in its own namespace, the same valid run Pod created by dry run as the
platform, the namespaces alternating create by create (``CreateLatency.round``):

* ``bench-pair``: runguard's two webhooks (``create_added_ms_pair``);
* ``bench-kyverno``: Kyverno's ClusterPolicy pair, ``bench/kyverno/policy.yaml``
  (``create_added_ms_kyverno_pair``);
* ``bench-kyverno-cel``: Kyverno's CEL pair, a MutatingPolicy + ValidatingPolicy,
  ``bench/kyverno/cel-policy.yaml`` (``create_added_ms_kyverno_cel_pair``), in the same
  Kyverno process (``bench_kyverno.KyvernoSide(cel=True)``);
* ``bench-map``: a MutatingAdmissionPolicy + ValidatingAdmissionPolicy in the apiserver,
  ``bench/map/policy.yaml`` (``create_added_ms_map_vap``), by ``MapSide``; and
  ``bench-map-subset``: the same with only the subset asked of them at least
  (``bench/map/subset.yaml``, ``create_added_ms_map_vap_subset``);
* ``bench-trivial-pair``: the trivial pair (``create_added_ms_trivial_pair``), runguard's
  two configurations copied and renamed, every webhook calling ``POST /bench/echo`` of
  the same runguard process (``bench/trivial_app.py``: decodes the review, answers
  allowed with its uid, no patch), by ``TrivialPairSide``: the floor of any webhook pair
  this server stack serves; and runguard's pair over it
  (``create_added_ms_pair_over_trivial_pair``: what its engine and patch add);
* and ``bench_create``'s own (no admission, runguard's validating webhook alone, the VAP).

After the rounds, ``--jobs`` run Jobs per case and round through the job-controller
(``bench_jobs.py``, the controller-manager started then): from the Job's create to its
first Pod, with no admission, runguard's pair and MAP+VAP (``job_pod_ms_*``).

Each figure is the case's median minus no admission's, per round, and the p99 of each
create minus no admission's create of the same iteration (runguard's pair over the
trivial pair: the same, against the trivial pair). CPU per create, each namespace alone
for a batch (``--creates``): Kyverno's process for each of its pairs, runguard's process
tree for each of its pairs, and the apiserver's own CPU in ``bench-map``, ``bench-pair``,
``bench-trivial-pair`` and ``bench-none`` (what MAP+VAP and the webhook calls cost it:
the delta over no admission). Decision agreement: the same Pods through runguard's pair
and through each peer. Prints a table and, last, one JSON object.

    .venv/bin/python bench/bench_peers.py [--rounds 3] [--creates 100] [--no-kyverno]
        [--jobs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import bench_cel
import bench_create
import bench_jobs
import bench_kyverno
import trivial_app
from bench_create import NS, WEBHOOK_NAMESPACES, CreateLatency, noncompliant_pods
from e2e.cluster import ClusterError

JSON = dict[str, Any]
KUBERNETES = "1.37"  # the release MAP is measured on (GA from 1.36)
MAP_CASE, MAP_SUBSET_CASE = "map_vap", "map_vap_subset"
TRIVIAL_CASE, TRIVIAL_NS = "trivial_pair", "bench-trivial-pair"
TRIVIAL_PREFIX = "trivial-"  # of the trivial pair's configurations and webhooks
PEERS = (  # figure -> what it is, in the table
    ("create_added_ms_pair", "runguard (both webhooks)"),
    ("create_added_ms_trivial_pair", "trivial pair (/bench/echo)"),
    ("create_added_ms_pair_over_trivial_pair", "runguard pair over the trivial"),
    ("create_added_ms_kyverno_pair", "Kyverno ClusterPolicy pair"),
    ("create_added_ms_kyverno_cel_pair", "Kyverno CEL pair"),
    ("create_added_ms_map_vap", "MAP + VAP (in the apiserver)"),
    ("create_added_ms_map_vap_subset", "MAP + VAP, the subset"),
    ("create_added_ms_vap", "VAP alone (validation only)"),
)
CPU_KEYS = (
    "runguard_cpu_us_pair",
    "runguard_cpu_us_trivial_pair",
    "kyverno_cpu_us_pair",
    "kyverno_cel_cpu_us_pair",
    "apiserver_cpu_us_pair",
    "apiserver_cpu_us_trivial_pair",
    "apiserver_cpu_us_map_vap",
    "apiserver_cpu_us_map_vap_subset",
)


def use_kubernetes(release: str = KUBERNETES) -> str:
    """The e2e build ``CreateLatency`` starts: ``release`` unless
    ``RUNGUARD_E2E_KUBERNETES`` says otherwise (set before the cluster starts)."""
    return os.environ.setdefault("RUNGUARD_E2E_KUBERNETES", release)


class TrivialPairSide:
    """The trivial pair in ``create``'s cluster, one more case of its rounds: runguard's
    MutatingWebhookConfiguration and ValidatingWebhookConfiguration as ``CreateLatency``
    registers them (failurePolicy, timeouts, sideEffects, reinvocation, selectors,
    matchConditions), renamed, each webhook's URL ``/bench/echo`` of the same runguard
    process (``CreateLatency(echo=True)``), bound to ``bench-trivial-pair``."""

    def __init__(self, create: CreateLatency, log: Callable[[str], None] = print) -> None:
        self.create = create
        self.log = log

    def documents(self) -> list[JSON]:
        assert self.create.runguard is not None
        configurations = json.loads(self.create.runguard.manifests("json"))
        documents = []
        for item in configurations.get("items", configurations):
            if item["kind"] not in WEBHOOK_NAMESPACES:
                continue
            item = bench_create._with_namespaces(item, [TRIVIAL_NS])
            item["metadata"]["name"] = TRIVIAL_PREFIX + item["metadata"]["name"]
            for hook in item["webhooks"]:
                hook["name"] = TRIVIAL_PREFIX + hook["name"]
                url = hook["clientConfig"]["url"]
                hook["clientConfig"]["url"] = url.rsplit("/", 1)[0] + trivial_app.ECHO_PATH
            documents.append(item)
        return documents

    def start(self, timeout: float = 60.0) -> None:
        """Register the pair; wait until a create in its namespace calls the same webhooks,
        renamed, as one in ``bench-pair`` calls of runguard's (the apiserver's histograms)."""
        cluster = self.create.cluster
        if cluster is None or self.create.runguard is None:
            raise ClusterError("the e2e apiserver and runguard are not running")
        if not self.create.echo:
            raise ClusterError("runguard serves no /bench/echo: CreateLatency(echo=True)")
        cluster.kubectl("create", "namespace", TRIVIAL_NS, check=True)
        listed = {"apiVersion": "v1", "kind": "List", "items": self.documents()}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        wanted = {TRIVIAL_PREFIX + name for name in self.calls(NS["pair"])}
        if not wanted:
            raise ClusterError(f"a create in {NS['pair']} calls none of runguard's webhooks")
        deadline = time.monotonic() + timeout
        while (called := self.calls(TRIVIAL_NS)) != wanted:  # seen through informers
            if time.monotonic() > deadline:
                raise ClusterError(f"the trivial pair: {sorted(called)} called, not "
                                   f"{sorted(wanted)}")  # fmt: skip
            time.sleep(0.5)
        self.create.cases[TRIVIAL_CASE] = (TRIVIAL_NS, "valid")
        self.create.added[f"create_added_ms_{TRIVIAL_CASE}"] = (TRIVIAL_CASE, "none")
        self.create.added["create_added_ms_pair_over_trivial_pair"] = ("pair", TRIVIAL_CASE)
        self.log(f"trivial pair ready: {', '.join(sorted(wanted))}")

    def calls(self, namespace: str) -> set[str]:
        """The webhooks the apiserver calls for one create of the valid Pod in ``namespace``."""
        before = self.create._scrape()
        status, answer, _ = self.create.create(namespace, self.create._bodies["valid"])
        if status != 201:
            raise ClusterError(f"{namespace}: {status} {bench_create._reason(answer)}")
        parts = bench_create.breakdown(before, self.create._scrape(), 1)
        return {part.removeprefix("webhook call ") for part in parts
                if part.startswith("webhook call ")}  # fmt: skip


class MapSide:
    """The MutatingAdmissionPolicy + ValidatingAdmissionPolicy of ``bench_cel`` bound to
    ``bench-map`` in ``create``'s apiserver, one more case of its rounds."""

    def __init__(self, create: CreateLatency, log: Callable[[str], None] = print) -> None:
        self.create = create
        self.log = log

    def start(self, timeout: float = 60.0) -> None:
        cluster = self.create.cluster
        if cluster is None:
            raise ClusterError("the e2e apiserver is not running")
        served = cluster.kubectl("api-resources", "--api-group=admissionregistration.k8s.io")
        if "MutatingAdmissionPolicy" not in served.stdout:
            raise ClusterError("this apiserver serves no MutatingAdmissionPolicy (before 1.36?)")
        items = [*bench_cel.map_vap_documents(self.create.policy),
                 *bench_cel.map_vap_documents(self.create.policy, subset=True)]  # fmt: skip
        for namespace in (bench_cel.MAP_NS, bench_cel.MAP_SUBSET_NS):
            cluster.kubectl("create", "namespace", namespace, check=True)
        listed = {"apiVersion": "v1", "kind": "List", "items": items}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        for case, namespace in ((MAP_CASE, bench_cel.MAP_NS),
                                (MAP_SUBSET_CASE, bench_cel.MAP_SUBSET_NS)):  # fmt: skip
            self.create.cases[case] = (namespace, "valid")
            self.create.added[f"create_added_ms_{case}"] = (case, "none")
        self.create.stamped_namespaces.add(bench_cel.MAP_NS)  # the subset does not stamp
        bad = json.dumps(noncompliant_pods(self.create.pods["stamped"])["hostNetwork"]).encode()
        deadline = time.monotonic() + timeout
        for namespace in (bench_cel.MAP_NS, bench_cel.MAP_SUBSET_NS):
            while True:  # the policies and bindings are seen through informers
                denied = self.create.create(namespace, bad)[0] != 201
                status, answer, _ = self.create.create(namespace, self.create._bodies["valid"])
                stamped = namespace != bench_cel.MAP_NS or self.create._stamped(answer)
                if denied and status == 201 and stamped:
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"MAP+VAP not active in {namespace}: hostNetwork denied "
                                       f"{denied}, valid pod {status} "
                                       f"{bench_create._reason(answer)}")  # fmt: skip
                time.sleep(0.5)
        self.log("MAP + VAP ready (the whole pair, and the subset)")

    def agreement(self, namespace: str = bench_cel.MAP_NS) -> dict[str, Any]:
        return bench_kyverno.agreement(self.create, namespace, bench_create._reason)

    def cpu_round(self, creates: int = 100) -> dict[str, float]:
        """The apiserver's own CPU per create (us), each namespace alone for a batch:
        no admission (before and after, averaged), MAP+VAP, runguard's pair, the trivial
        pair if registered (``TrivialPairSide``); and runguard's process tree's in the
        batch of each of its pairs."""
        assert self.create.cluster is not None and self.create.runguard is not None
        apiserver = self.create.cluster.pids["kube-apiserver"]
        runguard = self.create.runguard.pid
        assert runguard is not None
        body = self.create._bodies["valid"]

        def batch(namespace: str) -> tuple[float, float]:
            trees = [bench_kyverno.process_tree(pid) for pid in (apiserver, runguard)]
            before = [bench_kyverno._cpu_seconds(pids) for pids in trees]
            for _ in range(creates):
                status, answer, _ = self.create.create(namespace, body)
                if status != 201:
                    raise ClusterError(f"{namespace}: {status} {bench_create._reason(answer)}")
            after = [bench_kyverno._cpu_seconds(pids) for pids in trees]
            return ((after[0] - before[0]) / creates * 1e6,
                    (after[1] - before[1]) / creates * 1e6)  # fmt: skip

        first = batch(NS["none"])[0]
        map_vap = batch(bench_cel.MAP_NS)[0]
        subset = batch(bench_cel.MAP_SUBSET_NS)[0]
        pair, runguard_pair = batch(NS["pair"])
        trivial = batch(TRIVIAL_NS) if TRIVIAL_CASE in self.create.cases else None
        none = (first + batch(NS["none"])[0]) / 2
        out = {
            "apiserver_cpu_us_none": none,
            "apiserver_cpu_us_map_vap": map_vap - none,
            "apiserver_cpu_us_map_vap_subset": subset - none,
            "apiserver_cpu_us_pair": pair - none,
            "runguard_cpu_us_pair": runguard_pair,
        }
        if trivial is not None:
            out["apiserver_cpu_us_trivial_pair"] = trivial[0] - none
            out["runguard_cpu_us_trivial_pair"] = trivial[1]
        return out


def table(medians: dict[str, float], ranges: dict[str, list[float]]) -> str:
    lines = [f"  {'ms added per create':<34} {'p50':>8} {'[min - max]':>16} {'p99':>8}"]
    for key, title in PEERS:
        if key not in medians:
            continue
        low, high = ranges[key]
        p99 = medians.get(f"{key}_p99", float("nan"))
        lines.append(f"  {title:<34} {medians[key]:8.2f} {f'[{low:.2f} - {high:.2f}]':>16} "
                     f"{p99:8.2f}")  # fmt: skip
    lines.append("  CPU per create, us (apiserver: over no admission)")
    for key in CPU_KEYS:
        if key in medians:
            low, high = ranges[key]
            lines.append(f"  {key:<34} {medians[key]:8.0f} {f'[{low:.0f} - {high:.0f}]':>16}")
    return "\n".join(lines)


def verdicts(figures: dict[str, float]) -> dict[str, float]:
    """runguard's pair against the peers: the ratios the targets name; and the trivial
    pair's against MAP+VAP's subset."""
    out = {}
    pair = figures["create_added_ms_pair"]
    for peer, key in (("kyverno_cel", "create_added_ms_kyverno_cel_pair"),
                      ("map_vap", "create_added_ms_map_vap"),
                      ("map_vap_subset", "create_added_ms_map_vap_subset")):  # fmt: skip
        if figures.get(key):
            out[f"create_added_pair_vs_{peer}"] = round(pair / figures[key], 3)
    trivial, subset = (figures.get(f"create_added_ms_{case}")
                       for case in (TRIVIAL_CASE, MAP_SUBSET_CASE))  # fmt: skip
    if trivial is not None and subset:
        # the floor of a webhook pair on this stack against the in-process subset
        out["create_added_trivial_pair_vs_map_vap_subset"] = round(trivial / subset, 3)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=100)
    parser.add_argument("--no-kyverno", dest="kyverno", action="store_false")
    parser.add_argument("--jobs", type=int, default=10,
                        help="run Jobs per case per round through the job-controller, after "
                             "the create rounds (bench_jobs.py); 0: none")  # fmt: skip
    args = parser.parse_args(argv)
    release = use_kubernetes()
    load = os.getloadavg()
    print(f"Kubernetes {release}; load average before: {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} ({os.cpu_count()} cores)", flush=True)  # fmt: skip
    rounds: list[dict[str, float]] = []
    job_rounds: list[dict[str, float]] = []
    agreements: dict[str, dict[str, Any]] = {}
    with CreateLatency(log=lambda line: print(line, flush=True), echo=True) as create:
        TrivialPairSide(create).start()
        peers = MapSide(create)
        peers.start()
        kyverno = bench_kyverno.KyvernoSide(create, cel=True) if args.kyverno else None
        try:
            if kyverno is not None:
                kyverno.start()
                agreements["kyverno"] = kyverno.agreement()
                agreements["kyverno_cel"] = kyverno.agreement(bench_cel.KYVERNO_CEL_NS)
            agreements["map_vap"] = peers.agreement()
            agreements["map_vap_subset"] = peers.agreement(bench_cel.MAP_SUBSET_NS)
            for name, agreement in agreements.items():
                bench_kyverno.print_agreement(agreement, peer=name)
            for i in range(max(1, args.rounds)):
                result = create.round(args.creates, 90.0)
                result.update(peers.cpu_round(args.creates))
                if kyverno is not None:
                    result.update(kyverno.cpu_round(args.creates))
                rounds.append(result)
                print(f"round {i + 1}: " + ", ".join(
                    f"{key.removeprefix('create_added_ms_')} +{result[key]:.2f}"
                    for key, _ in PEERS if key in result) + f" ms (load {result['load_1m']:.2f})",
                    flush=True)  # fmt: skip
            if args.jobs > 0:
                jobs = bench_jobs.JobPodLatency(create, log=lambda line: print(line, flush=True))
                jobs.start()
                for i in range(max(1, args.rounds)):
                    job_rounds.append(jobs.round(args.jobs))
                    print(f"jobs round {i + 1}: " + ", ".join(
                        f"{key.removeprefix('job_pod_ms_')} {value:.1f}"
                        for key, value in job_rounds[-1].items() if key.startswith("job_pod_ms_"))
                        + f" ms (load {job_rounds[-1]['load_1m']:.2f})", flush=True)  # fmt: skip
        finally:
            if kyverno is not None:
                kyverno.stop()
    load_after = os.getloadavg()
    medians, ranges = bench_create.summarize(rounds)
    print(f"\nPod create (dry run) through the {release} apiserver, median over "
          f"{len(rounds)} interleaved rounds:")  # fmt: skip
    print(table(medians, ranges))
    where = bench_create.breakdown_table(medians)
    print("where the time goes, ms per create, each case alone (the apiserver's histograms):")
    for case in ("none", "pair", TRIVIAL_CASE, "kyverno", "kyverno_cel", MAP_CASE,
                 MAP_SUBSET_CASE):  # fmt: skip
        parts = where.get(case, {})
        print(f"  {case}: " + ", ".join(f"{part} {ms:.2f}" for part, ms in sorted(parts.items())))
    keys = [key for key, _ in PEERS] + [f"{key}_p99" for key, _ in PEERS] + list(CPU_KEYS)
    figures = {key: medians[key] for key in keys if key in medians}
    figures.update(verdicts(figures))
    for name, agreement in agreements.items():
        figures[f"{name}_agreement"] = round(agreement["share"], 3)
        alike = [not parts for parts in agreement["differs"].values()]
        figures[f"{name}_same_objects"] = round(sum(alike) / max(1, len(alike)), 3)
    if job_rounds:
        job_medians, job_ranges = bench_create.summarize(job_rounds)
        print(f"run Job create to its first Pod (the job-controller's), {args.jobs} Jobs per "
              f"case per round, median [min - max] over {len(job_rounds)} rounds:")  # fmt: skip
        for key, value in job_medians.items():
            if key.startswith("job_pod_"):
                figures[key] = value
                ranges[key] = job_ranges[key]
                low, high = job_ranges[key]
                print(f"  {key:<34} {value:8.2f} {f'[{low:.2f} - {high:.2f}]':>16}")
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    summary = {
        **figures,
        "kubernetes": release,
        "ranges": {key: ranges[key] for key in figures if key in ranges},
        "breakdown_ms": where,
        "rounds": len(rounds),
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
