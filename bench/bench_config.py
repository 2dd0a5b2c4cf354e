"""What the benchmarks share (not a test): where things are, the server configurations
they measure, and the load they drive.

Every bench script imports it first (``python bench/<script>.py`` puts ``bench/`` on the
import path): it puts the repository (``webhook``) and ``tests/`` on the import path, for
the harness (``tests/harness``: the workloads, slow clients, soak and decisions tool
that the tests use too). Nothing in ``tests/`` imports ``bench/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TESTS = REPO / "tests"
for _path in (TESTS, REPO):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import trivial_app  # noqa: E402

POLICY_DIR = REPO / "policies"  # what the servers serve
PLATFORM_POLICY_DIR = TESTS / "cases" / "_policies" / "platform"  # the engine's benchmark
PLATFORM_USER = "system:serviceaccount:digitalhub:core"  # policies/'s platform identity

# The trivial endpoint beside /mutate in the benchmarks' servers (``bench/trivial_app.py``):
# gunicorn loads this application instead of runguard's own.
TRIVIAL_APP = "bench.trivial_app:create_app()"
TRIVIAL_PATH = trivial_app.PATH

# (name, gunicorn worker class, workers, threads); the first RunguardWorker one with the
# default shape is what runguard serve runs (docs/server.md says why)
CONFIGS: tuple[tuple[str, str, int, int], ...] = (
    ("gthread 2x2 (before)", "gthread", 2, 2),
    ("runguard 2x2", "webhook.serving.worker.RunguardWorker", 2, 2),
    ("runguard 2x1", "webhook.serving.worker.RunguardWorker", 2, 1),
    ("runguard 4x1", "webhook.serving.worker.RunguardWorker", 4, 1),
    ("shared listener 2x2", "webhook.serving.worker.SharedListenerWorker", 2, 2),
)
CONNECTIONS = 8  # keep-alive TLS connections of the load generator
# starvation: slow connections held open while reviews on new connections are sent
SLOW_CONNECTIONS, STARVE_REVIEWS, STARVE_TIMEOUT = 64, 10, 5.0


def default_config() -> tuple[str, str, int, int]:
    """The configuration measured as runguard's default: ``runguard serve``'s shape."""
    from webhook.serving.settings import DEFAULT_THREADS, default_workers

    for config in CONFIGS:
        _, worker_class, workers, threads = config
        if worker_class.endswith(".RunguardWorker") and threads == DEFAULT_THREADS:
            if workers == default_workers():
                return config
    return CONFIGS[1]


def wait_bounded(proc: subprocess.Popen[Any], timeout: float) -> tuple[int, Any]:
    """Wait for ``proc`` at most ``timeout`` seconds (then kill it): its exit status and
    its resource usage (``os.wait4``: CPU time, peak resident memory) as the kernel
    counted them for it alone. Its output is the caller's: a pipe must be drained
    elsewhere, or go to a file."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return status, usage
