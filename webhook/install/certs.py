"""Certificates for the webhook: a CA the kube-apiserver trusts and a serving certificate.

The core is pure: every function takes PEM bytes and a ``now`` and returns PEM bytes,
touching no files and reading no clock. A small file layer at the end
(``read_cert_set``/``write_cert_set``) is what ``runguard certs`` uses.

What happens to a directory once issued (re-issue, rotation, inspection) is
``rotation.py``.

A certificate directory holds four files, named so that ``kubectl create secret tls``
takes them as they are, and a fifth, the Secret the kustomize base in ``manifests/``
applies:

* ``ca.crt``  -- the published CA bundle (what goes into the webhooks' ``caBundle``):
  one CA, or two while a CA rotation is in progress;
* ``ca.key``  -- the key of the newest CA in the bundle (mode 0600, never in the cluster);
* ``tls.crt`` -- the serving certificate; ``tls.key`` its key (mode 0600);
* ``secret.yaml`` -- the Secret ``runguard-tls`` holding ``ca.crt``, ``tls.crt``,
  ``tls.key`` (and ``client-ca.crt`` when the directory has one), each base64 on one
  line as the apiserver returns it (mode 0600). kustomize's ``secretGenerator`` folds
  base64 every 70 characters, so ``kubectl apply`` sent the same bytes every time and
  reported the Secret and the webhooks (whose ``caBundle`` is copied from it)
  ``configured``; this file is read as it is.

Exceptions: ``CertError`` -- a certificate directory or PEM input that cannot be used
(missing file, unparsable PEM, a key that matches no CA, a serving certificate that
does not chain to the bundle when it must). Nothing else is raised on bad input.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "BACKDATE",
    "CA_DAYS",
    "SERVING_DAYS",
    "CertError",
    "CertSet",
    "KeyPair",
    "create_ca",
    "has_ca",
    "issue_serving_cert",
    "load_certificate",
    "load_certificates",
    "load_key",
    "new_cert_set",
    "pem_of_cert",
    "read_cert_set",
    "secret_manifest",
    "service_dns_names",
    "write_cert_set",
    "write_secret",
]

CA_DAYS = 3650
SERVING_DAYS = 365
# Clock skew between this machine, the apiserver and the nodes.
BACKDATE = timedelta(hours=1)

CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE = "ca.crt", "ca.key", "tls.crt", "tls.key"
# The Secret the kustomize base applies (manifests/kustomization.yaml), and the optional
# CA of the apiserver's client certificate (mTLS, docs/operations.md) it carries too.
SECRET_FILE, SECRET_NAME, CLIENT_CA_FILE = "secret.yaml", "runguard-tls", "client-ca.crt"


class CertError(Exception):
    """A certificate directory or PEM input that cannot be used."""


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class CertSet:
    """The contents of a certificate directory (see the module docstring)."""

    ca_bundle: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the kube-apiserver may use to reach a Service."""
    base = f"{service}.{namespace}"
    return [service, base, f"{base}.svc", f"{base}.svc.cluster.local"]


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def pem_of_cert(cert: x509.Certificate) -> bytes:
    """One certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    """A PEM private key, ECDSA only; ``CertError`` otherwise."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"not a PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError("only ECDSA keys are supported")
    return key


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertError(f"not a PEM certificate bundle: {exc}") from None


def load_certificate(pem: bytes) -> x509.Certificate:
    """The one certificate of ``pem``; ``CertError`` for none or several."""
    certs = load_certificates(pem)
    if len(certs) != 1:
        raise CertError(f"expected one certificate, found {len(certs)}")
    return certs[0]


def create_ca(now: datetime, days: int = CA_DAYS) -> KeyPair:
    """A self-signed CA that can sign serving certificates and nothing below them."""
    key = _new_key()
    # A distinct name per CA, as kube-apiserver does (`<name>-ca@<unix time>`), so the
    # two CAs of a rotation can be told apart in `certs check` and in TLS errors.
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"runguard-ca@{int(now.timestamp())}")]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return KeyPair(pem_of_cert(cert), _key_pem(key))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host or any(c.isspace() or c in "/:@" for c in host):
        raise CertError(f"not a DNS name or IP address: {host!r}")
    return x509.DNSName(host.lower().rstrip("."))


def issue_serving_cert(
    ca: KeyPair,
    hosts: Sequence[str],
    now: datetime,
    days: int = SERVING_DAYS,
    common_name: str | None = None,
) -> KeyPair:
    """A serving certificate for ``hosts`` (DNS names or IPs) signed by ``ca``.

    Valid for ``days`` but never past the CA's own expiry.
    """
    if not hosts:
        raise CertError("a serving certificate needs at least one host name")
    names: list[x509.GeneralName] = []
    for host in hosts:
        name = _general_name(host)
        if name not in names:
            names.append(name)
    ca_cert = load_certificate(ca.cert_pem)
    ca_key = load_key(ca.key_pem)
    if ca_cert.public_key() != ca_key.public_key():
        raise CertError("the CA key does not belong to the CA certificate")
    cn = common_name or next((h for h in hosts if h.endswith(".svc")), hosts[0])
    if len(cn) > 64:  # the X.509 limit; clients look at the SANs anyway
        cn = cn[:64]
    key = _new_key()
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(pem_of_cert(cert), _key_pem(key))


def new_cert_set(service: str, namespace: str, hosts: Sequence[str], now: datetime) -> CertSet:
    """A fresh CA and a serving certificate for the Service plus ``hosts``."""
    ca = create_ca(now)
    leaf = issue_serving_cert(ca, [*service_dns_names(service, namespace), *hosts], now)
    return CertSet(ca.cert_pem, ca.key_pem, leaf.cert_pem, leaf.key_pem)


# --- files -------------------------------------------------------------------------


def has_ca(directory: Path) -> bool:
    return (directory / CA_FILE).exists() or (directory / CA_KEY_FILE).exists()


def read_cert_set(directory: Path) -> CertSet:
    """The four files of a certificate directory; ``CertError`` names a missing one."""
    parts = []
    for name in (CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE):
        try:
            parts.append((directory / name).read_bytes())
        except OSError as exc:
            raise CertError(f"{directory / name}: {exc.strerror}") from None
    return CertSet(*parts)


def secret_manifest(cs: CertSet, client_ca: bytes | None = None) -> bytes:
    """The TLS Secret as YAML, without a namespace (kustomize sets it): every value
    base64 on one line, exactly as the apiserver stores and returns it."""
    data = {CA_FILE: cs.ca_bundle, CERT_FILE: cs.cert, KEY_FILE: cs.key}
    if client_ca is not None:
        data[CLIENT_CA_FILE] = client_ca
    labels = {"app.kubernetes.io/name": "runguard", "app.kubernetes.io/part-of": "runguard"}
    lines = [
        "# Written by `runguard certs` from the files beside it; the kustomize base applies it.",
        "apiVersion: v1",
        "kind: Secret",
        "metadata:",
        f"  name: {SECRET_NAME}",
        "  labels:",
        *(f"    {key}: {value}" for key, value in labels.items()),
        "type: kubernetes.io/tls",
        "data:",
        *(f"  {key}: {base64.b64encode(value).decode()}" for key, value in sorted(data.items())),
    ]
    return "\n".join(lines).encode() + b"\n"


def write_cert_set(directory: Path, cs: CertSet) -> None:
    """Write the four files, then ``secret.yaml`` from them; keys (and the Secret) with
    mode 0600, each file replaced atomically."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, data, mode in (
        (CA_KEY_FILE, cs.ca_key, 0o600),
        (KEY_FILE, cs.key, 0o600),
        (CA_FILE, cs.ca_bundle, 0o644),
        (CERT_FILE, cs.cert, 0o644),
    ):
        _write_atomic(directory / name, data, mode)
    write_secret(directory)


def write_secret(directory: Path) -> None:
    """``secret.yaml`` from the files as they are (``client-ca.crt`` included when there
    is one), e.g. after a file was added or edited by hand; ``CertError`` names a
    missing file."""
    cs = read_cert_set(directory)
    client_ca = directory / CLIENT_CA_FILE
    secret = secret_manifest(cs, client_ca.read_bytes() if client_ca.exists() else None)
    _write_atomic(directory / SECRET_FILE, secret, 0o600)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    # mkstemp creates the file 0600, so a key is never readable by others, not even briefly.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
