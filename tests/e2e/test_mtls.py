"""mTLS through the real apiserver (issue 13): a runguard started with ``--client-ca`` (the
cluster's CA) answers the apiserver, which presents the client certificate its
AdmissionConfiguration names (``cluster.py``: a webhook kubeconfig with user "*"), and
refuses a client without one; the probes stay open to the kubelet."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .cluster import Cluster
from .devcluster import Runguard, prepare_cluster
from .pki import issue_client_cert
from .runs import Webhook, eventually, run_pod, session_policy

pytestmark = pytest.mark.e2e

NAME = "runguard-mtls"


@pytest.fixture(scope="module")
def mtls(
    cluster: Cluster, webhook: Webhook, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runguard]:
    """A second runguard with --client-ca, registered beside the session's (``webhook``,
    which also sets up the namespaces the session policy names)."""
    base = tmp_path_factory.mktemp("mtls")
    server = Runguard(base, base / "policy", serve_args=("--client-ca", str(cluster.pki.ca_cert)))
    server.policy_dir.mkdir()
    (server.policy_dir / "policy.yaml").write_text(yaml.safe_dump_all(session_policy()))
    prepare_cluster(cluster)
    try:
        server.start()
        configurations = list(yaml.safe_load_all(server.manifests()))
        for configuration in configurations:
            configuration["metadata"]["name"] = NAME
            configuration["metadata"]["labels"]["app.kubernetes.io/name"] = NAME
        listed = {"apiVersion": "v1", "kind": "List", "items": configurations}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=True)
        yield server
    finally:
        cluster.kubectl(
            "delete", f"mutatingwebhookconfiguration/{NAME}",
            f"validatingwebhookconfiguration/{NAME}", "--ignore-not-found",
        )  # fmt: skip
        server.stop()


def status(server: Runguard, path: str, client: tuple[Path, Path] | None = None) -> int:
    context = ssl.create_default_context(cafile=str(server.ca_file))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=b"{}" if path != "/readyz" else None,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_the_apiserver_reaches_a_runguard_that_requires_its_certificate(
    cluster: Cluster, mtls: Runguard, namespace: str
) -> None:
    """A run Pod created through the apiserver is judged by the mTLS runguard: its own
    log records the review, so the apiserver's client certificate was accepted."""
    body = run_pod("mtls-probe")
    created = cluster.kubectl(
        "create", "-n", namespace, "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps(body),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    eventually(
        "the mTLS runguard's log to record the review",
        lambda: '"name":"mtls-probe"' in mtls.log.read_text(errors="replace"),
        30,
    )


def test_a_client_without_the_certificate_is_refused_probes_stay_open(
    cluster: Cluster, mtls: Runguard, tmp_path: Path
) -> None:
    assert status(mtls, "/readyz") == 200  # the kubelet sends no certificate
    assert status(mtls, "/validate") == 403
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    issue_client_cert(cluster.pki, cert, key, "someone")
    assert status(mtls, "/validate", (cert, key)) == 400  # authenticated: a malformed review
