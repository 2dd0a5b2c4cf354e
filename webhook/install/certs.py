"""Certificates for the webhook: a CA the kube-apiserver trusts and a serving certificate.

The core is pure: every function takes PEM bytes and a ``now`` and returns PEM bytes,
touching no files and reading no clock. A small file layer at the end
(``read_cert_set``/``write_cert_set``) is what ``runguard certs`` uses.

One job, hence some 600 lines: a certificate directory's life (issue, the three-step
rotation, inspection, its files), whose one guarantee (the apiserver never sees a
serving certificate it does not trust) is only checked by reading the steps together.

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

Rotation never lets the kube-apiserver see a serving certificate it does not trust
(kyverno/kyverno#2642: CA and serving certificate replaced at once, ``caBundle`` not
yet updated, every admission call failing). A new CA goes through three ``rotate``
runs, each applied to the cluster before the next: it is first only *added* to the
bundle (the serving certificate stays signed by the old CA), then it signs the serving
certificate, and only then is the old CA dropped. A grace period between steps covers
the time the kubelet takes to refresh mounted Secrets.

Exceptions: ``CertError`` -- a certificate directory or PEM input that cannot be used
(missing file, unparsable PEM, a key that matches no CA, a serving certificate that
does not chain to the bundle when it must). Nothing else is raised on bad input.
"""

from __future__ import annotations

import base64
import ipaddress
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

__all__ = [
    "BACKDATE",
    "CA_DAYS",
    "CA_RENEW_DAYS",
    "ROTATION_GRACE",
    "SERVING_DAYS",
    "CertError",
    "CertSet",
    "CertStatus",
    "KeyPair",
    "Rotation",
    "create_ca",
    "has_ca",
    "inspect",
    "issue_serving_cert",
    "load_certificates",
    "new_cert_set",
    "read_cert_set",
    "reissue_serving_cert",
    "rotate",
    "secret_manifest",
    "service_dns_names",
    "verify_serving_cert",
    "write_cert_set",
    "write_secret",
]

CA_DAYS = 3650
SERVING_DAYS = 365
# A CA with less than a serving certificate's lifetime left cannot sign a full one.
CA_RENEW_DAYS = SERVING_DAYS
# Clock skew between this machine, the apiserver and the nodes.
BACKDATE = timedelta(hours=1)
# Time for `kubectl apply` to land and the kubelet to refresh a mounted Secret.
ROTATION_GRACE = timedelta(hours=24)

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


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
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


def _load_one(pem: bytes) -> x509.Certificate:
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
    return KeyPair(_cert_pem(cert), _key_pem(key))


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
    ca_cert = _load_one(ca.cert_pem)
    ca_key = _load_key(ca.key_pem)
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
    return KeyPair(_cert_pem(cert), _key_pem(key))


def new_cert_set(service: str, namespace: str, hosts: Sequence[str], now: datetime) -> CertSet:
    """A fresh CA and a serving certificate for the Service plus ``hosts``."""
    ca = create_ca(now)
    leaf = issue_serving_cert(ca, [*service_dns_names(service, namespace), *hosts], now)
    return CertSet(ca.cert_pem, ca.key_pem, leaf.cert_pem, leaf.key_pem)


def _signer_index(cas: Sequence[x509.Certificate], cert: x509.Certificate) -> int | None:
    """Which CA of the bundle signed ``cert``, by signature (names alone can collide)."""
    for i, ca in enumerate(cas):
        if ca.subject != cert.issuer:
            continue
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return i
    return None


def _newest_ca(cs: CertSet) -> tuple[list[x509.Certificate], KeyPair]:
    """The bundle with the newest CA last, and that CA with its key.

    The newest CA is the one ``ca.key`` belongs to (``rotate`` appends it to the bundle
    and replaces ``ca.key`` in the same step), so no clock or name comparison is needed.
    """
    cas = load_certificates(cs.ca_bundle)
    if not cas:
        raise CertError(f"{CA_FILE} holds no certificate")
    key = _load_key(cs.ca_key).public_key()
    mine = [c for c in cas if c.public_key() == key]
    if not mine:
        raise CertError(f"{CA_KEY_FILE} is the key of no CA in {CA_FILE}")
    others = [c for c in cas if c.public_key() != key]
    return [*others, mine[0]], KeyPair(_cert_pem(mine[0]), cs.ca_key)


def _bundle(cas: Sequence[x509.Certificate]) -> bytes:
    return b"".join(_cert_pem(c) for c in cas)


def _hosts_of(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertError(f"{CERT_FILE} has no subjectAltName") from None
    return [
        *san.get_values_for_type(x509.DNSName),
        *map(str, san.get_values_for_type(x509.IPAddress)),
    ]


def _common_name(cert: x509.Certificate) -> str | None:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else None


def reissue_serving_cert(
    cs: CertSet, service: str, namespace: str, hosts: Sequence[str], now: datetime
) -> CertSet:
    """A new serving certificate for new names, signed by the existing CA (kept as is)."""
    cas, newest = _newest_ca(cs)
    if len(cas) > 1:
        raise CertError(
            f"a CA rotation is in progress ({len(cas)} CAs in {CA_FILE}); "
            "finish it with `runguard certs rotate` first"
        )
    leaf = issue_serving_cert(newest, [*service_dns_names(service, namespace), *hosts], now)
    return CertSet(cs.ca_bundle, cs.ca_key, leaf.cert_pem, leaf.key_pem)


RotationStep = Literal["renewed", "staged-ca", "switched-ca", "retired-ca", "waiting"]


@dataclass(frozen=True)
class Rotation:
    """What one ``rotate`` did: the new contents and a step name with an explanation."""

    certs: CertSet
    step: RotationStep
    message: str


def rotate(
    cs: CertSet,
    now: datetime,
    *,
    ca_renew_days: int = CA_RENEW_DAYS,
    grace: timedelta = ROTATION_GRACE,
    new_ca: bool = False,
) -> Rotation:
    """Advance the certificates by one safe step (see the module docstring).

    * one CA, not near expiry: a new serving certificate from it (``renewed``);
    * one CA near expiry (or ``new_ca``): a new CA added to the bundle, the serving
      certificate re-issued by the *old* CA (``staged-ca``);
    * two CAs, serving certificate from the old one, new CA published for ``grace``:
      the serving certificate issued by the new CA (``switched-ca``);
    * two CAs, serving certificate from the new one for ``grace``: the old CA dropped
      from the bundle, a new serving certificate (``retired-ca``);
    * otherwise nothing changes yet (``waiting``).

    The serving certificate keeps its names. A serving certificate that chains to no
    CA of the bundle (the cluster is already failing) is replaced by one from the
    newest CA at once.
    """
    cas, newest = _newest_ca(cs)
    leaf = _load_one(cs.cert)
    hosts, cn = _hosts_of(leaf), _common_name(leaf)
    signer = _signer_index(cas, leaf)

    def issue(ca: KeyPair) -> KeyPair:
        return issue_serving_cert(ca, hosts, now, common_name=cn)

    if signer is None:
        fresh = issue(newest)
        return Rotation(
            CertSet(cs.ca_bundle, cs.ca_key, fresh.cert_pem, fresh.key_pem),
            "renewed",
            f"{CERT_FILE} was signed by no CA in {CA_FILE}; issued a new one from the newest CA",
        )

    if len(cas) == 1:
        ca = cas[0]
        days_left = (ca.not_valid_after_utc - now).total_seconds() / 86400
        if not new_ca and days_left >= ca_renew_days:
            fresh = issue(newest)
            return Rotation(
                CertSet(cs.ca_bundle, cs.ca_key, fresh.cert_pem, fresh.key_pem),
                "renewed",
                "issued a new serving certificate from the current CA",
            )
        staged = create_ca(now)
        # The old CA keeps signing until the new one is surely in the apiserver's bundle;
        # an expired old CA protects nothing, so then the new CA signs at once.
        fresh = issue(newest if days_left > 0 else staged)
        why = "on request" if new_ca else f"the CA expires in {int(days_left)} days"
        return Rotation(
            CertSet(
                _bundle([ca, _load_one(staged.cert_pem)]),
                staged.key_pem,
                fresh.cert_pem,
                fresh.key_pem,
            ),
            "staged-ca",
            f"new CA added to {CA_FILE} ({why}); apply it to the cluster, then run "
            f"rotate again after {_hours(grace)} to switch the serving certificate to it",
        )

    newest_cert = cas[-1]
    if signer != len(cas) - 1:
        published = now - (newest_cert.not_valid_before_utc + BACKDATE)
        if published < grace:
            return Rotation(cs, "waiting", _wait(grace - published, "switch to the new CA"))
        fresh = issue(newest)
        return Rotation(
            CertSet(cs.ca_bundle, cs.ca_key, fresh.cert_pem, fresh.key_pem),
            "switched-ca",
            f"serving certificate now signed by the new CA; the old CA stays in {CA_FILE}. "
            f"Apply it, then run rotate again after {_hours(grace)} to drop the old CA",
        )

    in_use = now - (leaf.not_valid_before_utc + BACKDATE)
    if in_use < grace:
        return Rotation(cs, "waiting", _wait(grace - in_use, "drop the old CA"))
    fresh = issue(newest)
    return Rotation(
        CertSet(_bundle([newest_cert]), cs.ca_key, fresh.cert_pem, fresh.key_pem),
        "retired-ca",
        f"old CA dropped from {CA_FILE}; the rotation is complete once this is applied",
    )


def _hours(delta: timedelta) -> str:
    return f"{math.ceil(delta.total_seconds() / 3600)}h"


def _wait(left: timedelta, what: str) -> str:
    return f"nothing changed: {_hours(left)} left before it is safe to {what} (--grace)"


@dataclass(frozen=True)
class CertStatus:
    """One certificate of a directory, as ``runguard certs check`` reports it."""

    file: str
    subject: str
    not_after: datetime
    days_left: float
    note: str = ""


def inspect(cs: CertSet, now: datetime) -> tuple[list[CertStatus], list[str]]:
    """Every certificate with its days left, and the problems that make it unusable.

    A problem is a serving certificate that does not verify against the bundle as the
    kube-apiserver would verify it (chain, validity, server-auth usage, the host name).
    """
    cas = load_certificates(cs.ca_bundle)
    leaf = _load_one(cs.cert)
    signer = _signer_index(cas, leaf)
    statuses = []
    for i, ca in enumerate(cas):
        note = "signs tls.crt" if i == signer else "kept for rotation" if len(cas) > 1 else ""
        statuses.append(_status(f"{CA_FILE}[{i}]", ca, now, note))
    statuses.append(_status(CERT_FILE, leaf, now, ", ".join(_hosts_of(leaf))))

    problems = []
    if signer is None:
        problems.append(f"{CERT_FILE} is not signed by any CA in {CA_FILE}")
    else:
        hosts = _hosts_of(leaf)
        try:
            verify_serving_cert(cs.ca_bundle, cs.cert, hosts[0], now)
        except CertError as exc:
            problems.append(str(exc))
    if _load_key(cs.key).public_key() != leaf.public_key():
        problems.append(f"{KEY_FILE} is not the key of {CERT_FILE}")
    return statuses, problems


def _status(file: str, cert: x509.Certificate, now: datetime, note: str) -> CertStatus:
    days = (cert.not_valid_after_utc - now).total_seconds() / 86400
    return CertStatus(file, cert.subject.rfc4514_string(), cert.not_valid_after_utc, days, note)


def verify_serving_cert(ca_bundle: bytes, cert_pem: bytes, host: str, now: datetime) -> None:
    """Verify ``cert_pem`` for ``host`` against ``ca_bundle`` the way a TLS client does."""
    builder = PolicyBuilder().store(Store(load_certificates(ca_bundle))).time(now)
    try:
        name: x509.verification.Subject = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        name = x509.DNSName(host)
    try:
        builder.build_server_verifier(name).verify(_load_one(cert_pem), [])
    except VerificationError as exc:
        raise CertError(f"{CERT_FILE} does not verify for {host}: {exc}") from None


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
