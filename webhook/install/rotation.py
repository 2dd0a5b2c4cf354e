"""A certificate directory after it was issued (``certs.py``): the three-step rotation
(``rotate``, ``runguard certs rotate``), a new serving certificate for new names from the
same CA (``reissue_serving_cert``) and what ``runguard certs check`` reports
(``inspect``). Pure as ``certs.py`` is: PEM bytes and a ``now`` in, PEM bytes out.

Rotation never lets the kube-apiserver see a serving certificate it does not trust
(kyverno/kyverno#2642: CA and serving certificate replaced at once, ``caBundle`` not
yet updated, every admission call failing). A new CA goes through three ``rotate``
runs, each applied to the cluster before the next: it is first only *added* to the
bundle (the serving certificate stays signed by the old CA), then it signs the serving
certificate, and only then is the old CA dropped. A grace period between steps covers
the time the kubelet takes to refresh mounted Secrets.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from webhook.install.certs import (
    BACKDATE,
    CA_FILE,
    CA_KEY_FILE,
    CERT_FILE,
    KEY_FILE,
    SERVING_DAYS,
    CertError,
    CertSet,
    KeyPair,
    create_ca,
    issue_serving_cert,
    load_certificate,
    load_certificates,
    load_key,
    pem_of_cert,
    service_dns_names,
)

__all__ = [
    "CA_RENEW_DAYS",
    "ROTATION_GRACE",
    "CertStatus",
    "Rotation",
    "inspect",
    "reissue_serving_cert",
    "rotate",
    "verify_serving_cert",
]

# A CA with less than a serving certificate's lifetime left cannot sign a full one.
CA_RENEW_DAYS = SERVING_DAYS
# Time for `kubectl apply` to land and the kubelet to refresh a mounted Secret.
ROTATION_GRACE = timedelta(hours=24)


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
    key = load_key(cs.ca_key).public_key()
    mine = [c for c in cas if c.public_key() == key]
    if not mine:
        raise CertError(f"{CA_KEY_FILE} is the key of no CA in {CA_FILE}")
    others = [c for c in cas if c.public_key() != key]
    return [*others, mine[0]], KeyPair(pem_of_cert(mine[0]), cs.ca_key)


def _bundle(cas: Sequence[x509.Certificate]) -> bytes:
    return b"".join(pem_of_cert(c) for c in cas)


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
    leaf = load_certificate(cs.cert)
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
                _bundle([ca, load_certificate(staged.cert_pem)]),
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
    leaf = load_certificate(cs.cert)
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
    if load_key(cs.key).public_key() != leaf.public_key():
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
        builder.build_server_verifier(name).verify(load_certificate(cert_pem), [])
    except VerificationError as exc:
        raise CertError(f"{CERT_FILE} does not verify for {host}: {exc}") from None
