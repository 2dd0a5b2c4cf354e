"""The e2e cluster's binaries: which Kubernetes release they are, and ``build.sh`` run to
build them once (a no-op when cached). ``ClusterError`` is the harness's one error.

The build's cache key is the content of go.mod (or ``go.kubernetes-<release>.mod``), its
go.sum, ``cmd/*/*.go`` and ``build.sh``: nothing in these Python modules.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

__all__ = [
    "E2E_DIR",
    "ClusterError",
    "build_binaries",
    "kubernetes_modfile",
    "kubernetes_version",
]

E2E_DIR = Path(__file__).resolve().parent


class ClusterError(RuntimeError):
    """The cluster could not be built, started or stopped; the message says why."""


def kubernetes_modfile() -> Path:
    """The go.mod build.sh builds the cluster from: go.mod (1.33), or
    go.kubernetes-<release>.mod for ``RUNGUARD_E2E_KUBERNETES=<release>``."""
    release = os.environ.get("RUNGUARD_E2E_KUBERNETES")
    return E2E_DIR / (f"go.kubernetes-{release}.mod" if release else "go.mod")


def kubernetes_version() -> tuple[int, int, int]:
    """The Kubernetes release the cluster runs, from its go.mod's ``k8s.io/kubernetes``
    pin: (1, 33, 13), (1, 37, 2), ... Tests whose expectation is a release's own
    behaviour (a scheduler message, a subresource it lacks) compare against it."""
    pinned = re.search(r"^\s*k8s\.io/kubernetes v(\d+)\.(\d+)\.(\d+)\s*$",
                       kubernetes_modfile().read_text(), re.MULTILINE)  # fmt: skip
    if pinned is None:
        raise ClusterError(f"{kubernetes_modfile()}: no k8s.io/kubernetes version")
    major, minor, patch = (int(part) for part in pinned.groups())
    return major, minor, patch


def build_binaries() -> Path:
    """Run build.sh (a no-op when cached) and return the folder holding the binaries."""
    done = subprocess.run(
        ["bash", str(E2E_DIR / "build.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise ClusterError(f"tests/e2e/build.sh failed with exit code {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])
