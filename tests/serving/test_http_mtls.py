"""mTLS (``--client-ca`` / ``RUNGUARD_CLIENT_CA``): the apiserver proves who it is, the
kubelet's probes keep working without a certificate (a real gunicorn over TLS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests
from harness import RunguardServer, TestCA, admission_review, run_pod, sample_policy


def client_certificate(ca: TestCA, directory: Path, name: str) -> tuple[str, str]:
    """A client certificate (``clientAuth``) for ``name`` signed by ``ca``: (cert, key) files."""
    cert, key = ca.issue_client(name)
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(cert)
    key_file.write_bytes(key)
    return str(cert_file), str(key_file)


@pytest.fixture(params=["runguard-serve", "gunicorn-conf"])
def mtls_server(
    request: pytest.FixtureRequest, start_runguard: Any, tmp_path: Path
) -> tuple[RunguardServer, TestCA]:
    """A server requiring client certificates from a CA of its own (the apiserver's)."""
    client_ca = TestCA()
    (tmp_path / "client-ca.crt").write_bytes(client_ca.pem)
    server = start_runguard(
        policy=sample_policy(),
        env={"RUNGUARD_CLIENT_CA": str(tmp_path / "client-ca.crt")},
        gunicorn_conf=request.param == "gunicorn-conf",
    )
    return server, client_ca


def test_admission_and_metrics_need_a_client_certificate_from_the_ca(
    mtls_server: tuple[RunguardServer, TestCA], tmp_path: Path
) -> None:
    server, client_ca = mtls_server
    review = admission_review(run_pod())

    # No certificate: the probes answer (the kubelet sends none), the rest is refused.
    anonymous = server.session()
    assert server.get("/healthz", session=anonymous).status_code == 200
    assert server.get("/readyz", session=anonymous).status_code == 200
    for resp in (
        server.post("/mutate", review, session=anonymous),
        server.post("/validate", review, session=anonymous),
        server.get("/metrics", session=anonymous),
    ):
        assert resp.status_code == 403 and resp.headers["Content-Type"] == "application/json"
        assert resp.json()["error"] == "ClientCertificateRequired"

    # A certificate from another CA: the TLS handshake fails.
    stranger = server.session()
    stranger.cert = client_certificate(TestCA(), tmp_path, "stranger")
    with pytest.raises(requests.exceptions.ConnectionError):
        server.post("/mutate", review, session=stranger)

    # The apiserver's certificate: answered.
    apiserver = server.session()
    apiserver.cert = client_certificate(client_ca, tmp_path, "kube-apiserver")
    resp = server.post("/mutate", review, session=apiserver)
    assert resp.status_code == 200
    assert resp.json()["response"]["uid"] == review["request"]["uid"]
    assert server.post("/validate", review, session=apiserver).status_code == 200
    assert server.get("/metrics", session=apiserver).status_code == 200
    assert server.get("/healthz", session=apiserver).status_code == 200


def test_serve_refuses_a_client_ca_that_is_not_a_certificate(tmp_path: Path) -> None:
    client_ca = tmp_path / "client-ca.crt"
    client_ca.write_text("not a certificate\n")
    bad = RunguardServer(
        tmp_path, policy=sample_policy(), env={"RUNGUARD_CLIENT_CA": str(client_ca)}
    )
    try:
        with pytest.raises(RuntimeError, match="exited 2"):
            bad.start()
    finally:
        bad.stop()
    assert "client-ca.crt" in bad.stderr
