"""The one certificate issuer of the tests, built on ``webhook.install.certs``.

``TestCA`` is a throwaway CA (``webhook.install.certs.create_ca``) that issues serving
certificates for the local server (``webhook.install.certs.issue_serving_cert``) and, for the
mTLS tests, client certificates (``clientAuth``), which ``webhook.install.certs`` never issues.
The e2e cluster's PKI (``tests/e2e/cluster.py``) is the apiserver's own and stays there.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.install import certs

SERVING_HOSTS = ("localhost", "127.0.0.1")


class TestCA:
    """A throwaway CA that issues serving certificates for the local server."""

    __test__ = False  # not a test class

    def __init__(self) -> None:
        self._pair = certs.create_ca(dt.datetime.now(dt.UTC))
        self.cert = x509.load_pem_x509_certificate(self._pair.cert_pem)
        key = serialization.load_pem_private_key(self._pair.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self.key = key

    @property
    def pem(self) -> bytes:
        return self._pair.cert_pem

    def issue(self, *, days: int = 1) -> tuple[bytes, bytes, int]:
        """A serving certificate for 127.0.0.1 and localhost: (cert PEM, key PEM, serial)."""
        leaf = certs.issue_serving_cert(
            self._pair, SERVING_HOSTS, dt.datetime.now(dt.UTC), days=days, common_name="runguard"
        )
        serial = x509.load_pem_x509_certificate(leaf.cert_pem).serial_number
        return leaf.cert_pem, leaf.key_pem, serial

    def issue_client(self, name: str) -> tuple[bytes, bytes]:
        """A client certificate (``clientAuth``) for ``name``: (cert PEM, key PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


def peer_certificate(host: str, port: int, ca_file: Path) -> x509.Certificate:
    """The certificate a new TLS connection is served."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection((host, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)
