"""Fixtures for the e2e tests: one real cluster and one real runguard per session.

The cluster is built (tests/e2e/build.sh, cached) and started unless RUNGUARD_E2E=0;
a failing build or start is a test error, never a skip, so CI cannot go silently green.

``runguard`` is ``runguard serve`` (real gunicorn, certificates from ``runguard
certs --host 127.0.0.1``) registered with ``runguard manifests --url``, serving the
test policy ``runs.session_policy()``. Tests that stop it, edit its policy or
unregister it put it back themselves; the fixture checks after every test and
restores what was left broken, so one failure does not cascade.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .build import build_binaries
from .cluster import Cluster
from .devcluster import prepare_cluster
from .runs import EXCLUDED_NAMESPACE, Webhook, session_policy, wait_for_admission


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


@pytest.fixture(scope="session")
def webhook(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    base = tmp_path_factory.mktemp("runguard")
    server = Webhook(base, base / "policy")
    server.policy_dir.mkdir()
    server.policy_file = server.policy_dir / "policy.yaml"
    server.write_policy(session_policy())
    server.policy_text = server.policy_file.read_text()
    server.start()
    try:
        server.digest = server.readyz()[1]["policy"]["digest"]
        prepare_cluster(cluster)
        cluster.kubectl("create", "namespace", EXCLUDED_NAMESPACE, check=True)
        server.register(cluster)
        wait_for_admission(cluster, active=True)
        yield server
    finally:
        server.stop()


@pytest.fixture
def runguard(webhook: Webhook, cluster: Cluster) -> Iterator[Webhook]:
    """The session's runguard, running, registered and serving the session policy."""
    yield webhook
    if not webhook.running:
        webhook.start()
    if webhook.policy_file.read_text() != webhook.policy_text:
        webhook.restore_policy()
    if not webhook.registered:
        webhook.register(cluster)
        wait_for_admission(cluster, active=True)
