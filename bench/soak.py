"""Soak: a long mixed load on one runguard server while it is disturbed (not a test).

``soak()`` of ``tests/harness/soak.py`` (its docstring says what it sends, disturbs,
counts and checks), long and with its figures printed; ``tests/serving/test_soak.py`` runs a
short form. Bounded in count (``--requests``) and time (``--seconds``); exits 1 when any
request was unanswered, answered 5xx or wrong.

    .venv/bin/python bench/soak.py [--requests 200000] [--seconds 900]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import bench_config  # noqa: F401  (the import path: the harness and webhook)
from harness.soak import audit_dropped, print_report, soak, soaked_server

SOAK_OPTIONS = ("requests", "seconds", "keepalive", "fresh", "slow", "reloads", "sample_every")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=900.0, help="bound on the run")
    parser.add_argument("--keepalive", type=int, default=4, help="keep-alive client processes")
    parser.add_argument("--fresh", type=int, default=1, help="new-connection client processes")
    parser.add_argument("--slow", type=int, default=64, help="slow connections held open")
    parser.add_argument("--reloads", type=int, default=4, help="policy swaps")
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(
        f"runguard soak: {args.workers} workers x {args.threads} threads, {args.requests} "
        f"requests at most, {args.seconds:g} s at most, {args.keepalive} keep-alive + "
        f"{args.fresh} new-connection clients, {args.slow} slow connections, "
        f"{args.reloads} policy swaps, {os.cpu_count()} cpus shared with the load; "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="runguard-soak-") as tmp:
        with soaked_server(Path(tmp), workers=args.workers, threads=args.threads) as (server, sink):
            options = {name: getattr(args, name) for name in SOAK_OPTIONS}
            report = soak(server, **options, echo=True)
            dropped = audit_dropped(server)
            ready = server.get("/readyz").json()
            print_report(report, dropped, sink.read_bytes)
            print(f"readyz: {ready['status']}, logging {ready['logging']['status']}")
            tracebacks = server.stderr.count("Traceback")
    figures = report.figures()
    figures.update(audit_dropped=int(dropped), tracebacks=tracebacks)
    figures["load_average"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))
    bad = figures["unanswered"] + figures["errors_5xx"] + figures["wrong"]
    return 1 if bad or report.background_errors or report.clients_lost else 0


if __name__ == "__main__":
    sys.exit(main())
