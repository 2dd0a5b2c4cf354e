"""``make bench``: the engine and the server, several worker models side by side (not a test).

Starts one server per configuration (``CONFIGS``: stock ``gthread`` as it was, and
``RunguardWorker`` in several shapes), all with the repository's ``policies/``, fresh
certificates and the same load generator (``bench_http.drive``: keep-alive TLS
connections, one process each). Rounds are interleaved: each round measures every
configuration once, the engine once, so a busy moment of this shared machine hits all
of them. Per round and configuration:

* ``POST /bench/allowed`` (a trivial endpoint of the same server) and ``POST /mutate``
  (a run Pod most mutation steps change): requests/s, p99, server CPU per request
  (the workers' user + system time over the requests answered);
* starvation: 64 connections that send nothing, half a ClientHello, half a head or
  half a body held open (``slow_clients.py``) while 10 real ``/validate`` reviews on
  new connections are sent at once, each given 5 s: how many failed.

And per round, beside them:

* OPA (``bench_opa.OpaSide``, built at a pinned version by ``bench/opa/build.sh``) against
  the default configuration's ``/validate`` on the same rules (``bench/opa/runguard.rego``),
  after their decision agreement on a shared set of reviews is printed;
* Pod create latency through the e2e kube-apiserver (``bench_create.CreateLatency``, the
  1.37 build unless ``RUNGUARD_E2E_KUBERNETES`` names another): runguard's validating
  webhook only, both webhooks, a ValidatingAdmissionPolicy with the same rules
  (``bench/vap/policy.yaml``), and the peers (``bench_peers.py``): Kyverno's ClusterPolicy
  pair and its CEL pair (one Kyverno process), MutatingAdmissionPolicy + VAP, and the
  trivial pair (runguard's registration calling ``POST /bench/echo`` of the same server);
  each minus no admission (p50 and p99), CPU per create, and each peer's decision
  agreement with runguard.

Prints a table (median [min-max] over rounds), the load average before and after, and
as its last line one JSON object: the default configuration's figures (medians), their
``[min, max]`` in ``ranges``, and every configuration's medians in ``configs``. Bounded:
``--rounds`` (<= 5) x ``--seconds`` (<= 20) per endpoint and ``--creates`` per case,
about 9 minutes by default (plus OPA's and the cluster's builds the first time).

    .venv/bin/python bench/bench_all.py [--rounds 3] [--seconds 5] [--creates 100] [--no-create]
        [--no-opa]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_create
import bench_engine
import bench_http
import bench_kyverno
import bench_opa
import bench_peers
from bench_config import (
    CONFIGS,
    CONNECTIONS,
    PLATFORM_POLICY_DIR,
    SLOW_CONNECTIONS,
    STARVE_REVIEWS,
    STARVE_TIMEOUT,
    TRIVIAL_PATH,
    default_config,
)
from harness import slow_clients
from harness.workloads import memory_mb

OPA_KEYS = (
    "runguard_validate_rps",
    "opa_validate_rps",
    "runguard_validate_cpu_us",
    "opa_validate_cpu_us",
    "runguard_validate_p99_ms",
    "opa_validate_p99_ms",
)
CREATE_KEYS = (
    "create_ms_none",
    "create_added_ms_validate",
    "create_added_ms_pair",
    "create_added_ms_vap",
    "create_added_ms_floor",  # the floor's VAPs beside the pair (bench-pair-floor - bench-pair)
)


def engine_round(policy: Any, seconds: float) -> dict[str, float]:
    """Median wall time of one typical-pod review (mutate + validate as the server makes
    them), of each half (``validate`` of the mutated pod finding ``mutate``'s receipt:
    its checks), and of ``validate`` running the backstop's second mutation (a Pod that
    bypassed ``/mutate``), in us."""
    receipts = bench_engine.RECEIPTS
    next_pod = bench_engine.runs(1)  # another run's Pod each time (bench_engine.runs)
    # a hundred runs' results, each with its receipt (a thousand would overwrite a few
    # in the table's 8192 slots, and the backstop would run for them)
    results = [bench_engine.mutate(next_pod(), policy).object for _ in range(100)]
    next_result = itertools.cycle(results).__next__

    def review() -> None:
        bench_engine.server_review(next_pod(), policy)  # /validate finds /mutate's receipt

    def mutate() -> None:
        bench_engine.mutate(next_pod(), policy, receipts=receipts)

    def validate() -> None:
        bench_engine.validate(next_result(), policy, receipts=receipts)

    def backstop() -> None:
        bench_engine.validate(next_result(), policy)

    quarter = seconds / 4
    figures = {}
    for name, fn in (
        ("review", review),
        ("mutate", mutate),
        ("validate", validate),
        ("backstop", backstop),
    ):
        if name == "validate":  # their receipts, as /mutate left them (not overwritten yet)
            for result in results:
                bench_engine.mutate(result, policy, receipts=receipts)
        figures[name] = bench_engine.summary(bench_engine.measure(fn, 20000, quarter))[0]
    return figures


def server_round(proc: Any, port: int, ca_file: str, seconds: float) -> dict[str, float]:
    body = bench_http.review_bytes()
    figures: dict[str, float] = {}
    for name, path in (("trivial", TRIVIAL_PATH), ("mutate", "/mutate")):
        workers = bench_http.workers_of(proc.pid)
        before = bench_http.cpu_seconds(workers)
        result = bench_http.drive(port, ca_file, path, body, CONNECTIONS, seconds)
        used = bench_http.cpu_seconds(workers) - before
        figures[f"{name}_rps"] = result["rps"]
        figures[f"{name}_p99_ms"] = result["p99_ms"]
        figures[f"{name}_cpu_us"] = 1e6 * used / max(1, result["requests"])
        figures[f"{name}_failed"] = result["failures"]
    starve = slow_clients.starved(port, ca_file, SLOW_CONNECTIONS, STARVE_REVIEWS, STARVE_TIMEOUT)
    figures["starved_requests"] = starve["failed"]
    return figures


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per endpoint and round")
    parser.add_argument("--creates", type=int, default=100, help="Pod creates per case and round")
    parser.add_argument(
        "--no-create", dest="create", action="store_false", help="skip the e2e apiserver"
    )
    parser.add_argument(
        "--no-opa", dest="opa", action="store_false", help="skip OPA (and its build)"
    )
    parser.add_argument(
        "--no-whatif", dest="whatif", action="store_false", help="skip runguard whatif at 10k"
    )
    args = parser.parse_args()
    rounds = max(1, min(args.rounds, 5))
    seconds = max(1.0, min(args.seconds, 20.0))

    from webhook.policy.loader import load_policy

    policy = load_policy(str(PLATFORM_POLICY_DIR))
    default = default_config()[0]
    load_before = load_average()
    engine: list[dict[str, float]] = []
    opa_rounds: list[dict[str, float]] = []
    create_rounds: list[dict[str, float]] = []
    agreement: dict[str, Any] = {}
    opa: bench_opa.OpaSide | None = None
    create: bench_create.CreateLatency | None = None
    kyverno: bench_kyverno.KyvernoSide | None = None
    kyverno_agreement: dict[str, Any] = {}
    kyverno_cpu: list[dict[str, float]] = []
    map_side: bench_peers.MapSide | None = None
    peer_cpu: list[dict[str, float]] = []  # per round: Kyverno's, runguard's, the apiserver's
    peer_agreements: dict[str, dict[str, Any]] = {}
    results: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in CONFIGS}
    memory: dict[str, list[float]] = {}
    servers: dict[str, tuple[Any, int, str]] = {}
    with tempfile.TemporaryDirectory(prefix="runguard-bench-") as tmp:
        try:
            for index, (name, worker_class, workers, threads) in enumerate(CONFIGS):
                workdir = Path(tmp) / str(index)
                workdir.mkdir()
                proc, port = bench_http.start_server(
                    workdir, "gthread", workers, threads, worker_class
                )
                servers[name] = (proc, port, str(workdir / "certs" / "ca.crt"))
            proc, port, ca_file = servers[default]
            if args.opa:
                opa = bench_opa.OpaSide(server=(proc, port, str(Path(ca_file).parent)))
                try:
                    opa.start()
                    agreement = opa.agreement()
                    bench_opa.print_agreement(agreement)
                except bench_opa.OpaUnavailable as exc:
                    print(f"OPA side skipped: {exc}")
                    opa = None
            create = None
            if args.create:
                bench_peers.use_kubernetes()  # 1.37 unless RUNGUARD_E2E_KUBERNETES says
                create = bench_create.CreateLatency(
                    log=lambda line: print(f"create: {line}"), echo=True
                )
                create.start()
                try:
                    bench_peers.TrivialPairSide(
                        create, log=lambda line: print(f"trivial: {line}")
                    ).start()
                except bench_create.ClusterError as exc:
                    print(f"trivial pair skipped: {exc}")
                map_side = bench_peers.MapSide(create, log=lambda line: print(f"map: {line}"))
                try:
                    map_side.start()
                    peer_agreements["map_vap"] = map_side.agreement()
                    peer_agreements["map_vap_subset"] = map_side.agreement(
                        bench_peers.bench_cel.MAP_SUBSET_NS
                    )
                except bench_create.ClusterError as exc:
                    print(f"MAP + VAP side skipped: {exc}")
                    map_side = None
                kyverno = bench_kyverno.KyvernoSide(
                    create, log=lambda line: print(f"kyverno: {line}"), cel=True
                )
                try:
                    kyverno.start()
                    kyverno_agreement = kyverno.agreement()
                    bench_kyverno.print_agreement(kyverno_agreement)
                    peer_agreements["kyverno_cel"] = kyverno.agreement(
                        bench_peers.bench_cel.KYVERNO_CEL_NS
                    )
                except (bench_kyverno.KyvernoUnavailable, bench_create.ClusterError) as exc:
                    print(f"Kyverno side skipped: {exc}")
                    kyverno.stop()
                    kyverno = None
                for peer, said in peer_agreements.items():
                    bench_kyverno.print_agreement(said, peer=peer)
            for number in range(rounds):
                engine.append(engine_round(policy, min(seconds, 3.0)))
                order = list(servers.items())
                if number % 2:
                    order.reverse()  # no configuration always right after the engine
                for name, (proc, port, ca_file) in order:
                    results[name].append(server_round(proc, port, ca_file, seconds))
                if opa is not None:
                    opa_rounds.append(opa.round(seconds))
                if create is not None:
                    create_rounds.append(create.round(args.creates, 6 * seconds))
                cpu: dict[str, float] = {}
                if kyverno is not None:
                    kyverno_cpu.append(kyverno.cpu_round(args.creates))
                    cpu.update(kyverno_cpu[-1])
                if map_side is not None:
                    cpu.update(map_side.cpu_round(args.creates))
                if cpu:
                    peer_cpu.append(cpu)
            for name, (proc, _, _) in servers.items():
                workers = bench_http.workers_of(proc.pid)
                memory[name] = [memory_mb(pid)[0] for pid in workers]
        finally:
            if opa is not None:
                opa.stop()
            if kyverno is not None:
                kyverno.stop()
            if create is not None:
                create.stop()
            for proc, _, _ in servers.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _, _ in servers.values():
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
    load_after = load_average()

    print(
        f"runguard bench: {os.cpu_count()} cpus shared by servers and load generator, "
        f"{rounds} interleaved rounds, {seconds:g} s per endpoint, {CONNECTIONS} keep-alive "
        f"TLS connections; starvation: {SLOW_CONNECTIONS} slow connections held, "
        f"{STARVE_REVIEWS} reviews given {STARVE_TIMEOUT:g} s each"
    )
    print(f"load average before: {load_before}; after: {load_after}")
    for part, title in (
        ("review", "typical pod review (mutate + validate)"),
        ("mutate", "  of which mutate"),
        ("validate", "  of which validate (checks; mutate's receipt found)"),
        ("backstop", "validate running the backstop (a Pod that bypassed /mutate)"),
    ):
        print(f"engine, {title}: {_fmt(spread([e[part] for e in engine]), '.0f')} us")
    columns = (
        ("trivial_rps", "trivial req/s", ".0f"),
        ("mutate_rps", "mutate req/s", ".0f"),
        ("trivial_cpu_us", "trivial CPU us", ".0f"),
        ("mutate_cpu_us", "mutate CPU us", ".0f"),
        ("mutate_p99_ms", "mutate p99 ms", ".1f"),
        ("starved_requests", "starved /10", ".0f"),
    )
    print(f"{'configuration':<22}" + "".join(f"{title:>22}" for _, title, _ in columns))
    table: dict[str, dict[str, tuple[float, float, float]]] = {}
    for name, runs in results.items():
        table[name] = {key: spread([run[key] for run in runs]) for key, *_ in columns}
        failed = sum(run["trivial_failed"] + run["mutate_failed"] for run in runs)
        row = "".join(f"{_fmt(table[name][key], fmt):>22}" for key, _, fmt in columns)
        mark = " (default)" if name == default else ""
        print(
            f"{name + mark:<22}{row}  rss {statistics.median(memory[name]):.0f} MB/worker"
            f"{f', {failed:.0f} failed under load' if failed else ''}"
        )

    chosen = table[default]
    figures: dict[str, Any] = {}
    ranges: dict[str, list[float]] = {}
    for key, part in (
        ("engine_us_p50", "review"),
        ("engine_mutate_us_p50", "mutate"),
        ("engine_validate_us_p50", "validate"),
        ("engine_backstop_us_p50", "backstop"),
    ):
        median, low, high = spread([e[part] for e in engine])
        figures[key], ranges[key] = round(median, 1), [round(low, 1), round(high, 1)]
    for key, *_ in columns:
        figures[key] = round(chosen[key][0], 2)
        ranges[key] = [round(chosen[key][1], 2), round(chosen[key][2], 2)]
    # the targets' ratios, per round: every round counts, not only the median one
    rps_ratios = [run["mutate_rps"] / run["trivial_rps"] for run in results[default]]
    cpu_ratios = [run["mutate_cpu_us"] / run["trivial_cpu_us"] for run in results[default]]
    figures["mutate_rps_ratio_min"] = round(min(rps_ratios), 3)
    figures["mutate_cpu_ratio"] = round(statistics.median(cpu_ratios), 3)
    ranges["mutate_cpu_ratio"] = [round(min(cpu_ratios), 3), round(max(cpu_ratios), 3)]
    print(
        f"{default}: mutate/trivial req/s per round "
        + ", ".join(f"{r:.2f}" for r in rps_ratios)
        + "; mutate/trivial CPU per round "
        + ", ".join(f"{r:.2f}" for r in cpu_ratios)
    )
    figures["rss_mb_per_worker"] = round(statistics.median(memory[default]), 1)
    ranges["rss_mb_per_worker"] = [round(min(memory[default]), 1), round(max(memory[default]), 1)]
    if opa_rounds:
        print("side by side with OPA on the same validation rules (bench/bench_opa.py):")
        for key in OPA_KEYS:
            median, low, high = spread([r[key] for r in opa_rounds])
            figures[key], ranges[key] = round(median, 2), [round(low, 2), round(high, 2)]
            print(f"  {key:<36} {_fmt((median, low, high), '.2f')}")
        ratio = figures["runguard_validate_cpu_us"] / figures["opa_validate_cpu_us"]
        figures["validate_cpu_ratio_vs_opa"] = round(ratio, 3)
        print(f"  runguard/OPA CPU per request: {ratio:.2f} (target <= 0.6)")
        figures["agreement"] = {k: agreement[k] for k in ("agree", "total", "same_rules")}
    if create_rounds:
        medians, spans = bench_create.summarize(create_rounds)
        print("Pod create latency through the e2e apiserver (bench/bench_create.py):")
        print(bench_create.table(medians, spans))
        for key in CREATE_KEYS:
            figures[key], ranges[key] = medians[key], spans[key]
    if kyverno_cpu and create_rounds:
        print("side by side with Kyverno, the same valid run Pod (bench/bench_kyverno.py):")
        for key in ("create_added_ms_pair", "create_added_ms_kyverno_pair"):
            figures[key], ranges[key] = medians[key], spans[key]
        cpu, cpu_spans = bench_create.summarize(kyverno_cpu)
        for key in ("runguard_cpu_us_pair", "kyverno_cpu_us_pair"):
            figures[key], ranges[key] = round(cpu[key], 1), cpu_spans[key]
        for key in (
            "create_added_ms_pair",
            "create_added_ms_kyverno_pair",
            "runguard_cpu_us_pair",
            "kyverno_cpu_us_pair",
        ):
            low, high = ranges[key]
            print(f"  {key:<36} {figures[key]:10.2f}  [{low:.2f} - {high:.2f}]")
        ratio = figures["create_added_ms_pair"] / figures["create_added_ms_kyverno_pair"]
        figures["create_added_pair_vs_kyverno"] = round(ratio, 3)
        verdict = "met" if ratio <= 0.5 else "MISSED"
        print(f"  target create_added_ms_pair <= 0.5 x kyverno's: {ratio:.2f} x  {verdict}")
    if kyverno_agreement:
        figures["kyverno_agreement"] = round(kyverno_agreement["share"], 3)
    if create_rounds:
        figures.update(peer_figures(medians, spans, peer_cpu, peer_agreements))
        ranges.update(figures.pop("ranges"))
    if args.whatif:
        figures.update(whatif_figures())
    summary = {
        **figures,
        "config": default,
        "rounds": rounds,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "ranges": ranges,
        "configs": {
            name: {key: round(value[0], 2) for key, value in rows.items()}
            for name, rows in table.items()
        },
    }
    print(json.dumps(summary, separators=(",", ":")))
    return 0


def peer_figures(
    medians: dict[str, float],
    spans: dict[str, list[float]],
    cpu_rounds: list[dict[str, float]],
    agreements: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The peers of 2026 on the same apiserver (bench/bench_peers.py): ms added per create
    (p50, p99) by Kyverno's CEL pair, MAP+VAP and the trivial pair beside runguard's pair,
    CPU per create,
    agreements; a ``ranges`` entry of their [min, max]."""
    keys = [key for key, _ in bench_peers.PEERS]
    figures: dict[str, Any] = {}
    ranges: dict[str, list[float]] = {}
    for key in [*keys, *(f"{key}_p99" for key in keys)]:
        if key in medians:
            figures[key], ranges[key] = medians[key], spans[key]
    if cpu_rounds:
        cpu_medians, cpu_spans = bench_create.summarize(cpu_rounds)
        for key in bench_peers.CPU_KEYS:
            if key in cpu_medians:
                figures[key], ranges[key] = round(cpu_medians[key], 1), cpu_spans[key]
    figures.update(bench_peers.verdicts(figures))
    for name, said in agreements.items():
        figures[f"{name}_agreement"] = round(said["share"], 3)
        alike = [not parts for parts in said["differs"].values()]
        figures[f"{name}_same_objects"] = round(sum(alike) / max(1, len(alike)), 3)
    print("beside the peers of 2026, the same valid run Pod (bench/bench_peers.py):")
    print(bench_peers.table({**medians, **figures}, {**spans, **ranges}))
    return {**figures, "ranges": ranges}


def whatif_figures(count: int = 10_000) -> dict[str, float]:
    """``runguard whatif`` over ``count`` synthetic runs (``bench_whatif.py``, its own
    process): wall seconds and peak memory; none when it fails (said on stderr)."""
    argv = [
        sys.executable,
        str(Path(__file__).with_name("bench_whatif.py")),
        "--counts",
        str(count),
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        result = json.loads(done.stdout.strip().splitlines()[-1])["results"][str(count)]
    except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError) as exc:
        print(f"whatif: not measured ({type(exc).__name__})", file=sys.stderr)
        return {}
    print(f"\nrunguard whatif, {count:,} runs: {result['seconds']} s, "
          f"peak {result['peak_rss_mb']} MB")  # fmt: skip
    return {"whatif_10k_seconds": result["seconds"], "whatif_10k_peak_mb": result["peak_rss_mb"]}


def _fmt(values: tuple[float, float, float], fmt: str) -> str:
    median, low, high = values
    return f"{median:{fmt}} [{low:{fmt}}-{high:{fmt}}]"


if __name__ == "__main__":
    sys.exit(main())
