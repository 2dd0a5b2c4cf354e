"""Fixtures for the e2e tests: one real cluster per session.

The cluster is built (tests/e2e/build.sh, cached) and started unless RUNGUARD_E2E=0;
a failing build or start is a test error, never a skip, so CI cannot go silently green.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .cluster import Cluster, build_binaries


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.environ.get("RUNGUARD_E2E") == "0":
        pytest.skip("RUNGUARD_E2E=0: end-to-end tests disabled")
    bin_dir = build_binaries()
    with Cluster(tmp_path_factory.mktemp("cluster"), bin_dir) as running:
        yield running


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[Any]:
    """The real ``kubernetes`` Python client, as cluster-admin."""
    client = cluster.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """A fresh namespace per test (never deleted: no namespace controller runs here)."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())
    name = name[:50].rstrip("-") + f"-{os.urandom(3).hex()}"
    cluster.kubectl("create", "namespace", name, check=True)
    return name
