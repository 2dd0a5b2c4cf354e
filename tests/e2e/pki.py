"""The e2e cluster's TLS material and the files that present it: a CA, the apiserver's
serving certificate, client certificates (CN the user, O each group: what the
apiserver's x509 authenticator reads), the service-account signing key, kubeconfigs,
and the AdmissionConfiguration giving every webhook the apiserver's client certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CONTEXT",
    "Pki",
    "issue_client_cert",
    "pki_paths",
    "write_kubeconfig",
    "write_pki",
    "write_webhook_client",
]

CONTEXT = "runguard-e2e"  # the one cluster and context of every kubeconfig written here


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files the control plane and its clients use."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    sans: Sequence[x509.GeneralName] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # tolerate clock skew
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
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
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def pki_paths(directory: Path) -> Pki:
    """Where write_pki puts each file."""
    return Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )


def _client_name(user: str, groups: Sequence[str]) -> x509.Name:
    """CN is the user name, each O a group: what the apiserver's x509 authenticator reads."""
    return x509.Name(
        [
            *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups),
            x509.NameAttribute(NameOID.COMMON_NAME, user),
        ]
    )


def issue_client_cert(
    pki: Pki, cert: Path, key: Path, user: str, groups: Sequence[str] = ()
) -> None:
    """A client certificate for ``user`` in ``groups``, signed by the cluster's CA."""
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    client_key = ec.generate_private_key(ec.SECP256R1())
    signed = _cert(
        _client_name(user, groups),
        client_key,
        ca.subject,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    cert.write_bytes(signed.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(_key_pem(client_key))
    key.chmod(0o600)


def write_pki(directory: Path, address: str = "127.0.0.1") -> Pki:
    """A CA, the apiserver serving cert (for ``address`` and loopback), an admin client
    cert and the SA signing key."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runguard-e2e-ca")])
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        serving_key,
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            *(
                x509.IPAddress(ipaddress.ip_address(a))
                for a in dict.fromkeys(["127.0.0.1", address])
            ),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
        ],
    )

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _cert(
        _client_name("runguard-e2e-admin", ["system:masters"]),
        admin_key,
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())

    pki = pki_paths(directory)
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_cert.write_bytes(serving.public_bytes(pem))
    pki.serving_key.write_bytes(_key_pem(serving_key))
    pki.admin_cert.write_bytes(admin.public_bytes(pem))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.sa_key.write_bytes(_key_pem(sa_key))
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for path in (pki.ca_key, pki.serving_key, pki.admin_key, pki.sa_key):
        path.chmod(0o600)
    return pki


# --- processes ----------------------------------------------------------------------


def write_kubeconfig(
    path: Path,
    server: str,
    ca_cert: Path,
    user: str,
    credentials: dict[str, str],
    namespace: str = "default",
) -> None:
    """A kubeconfig for the cluster at ``server`` whose one user presents ``credentials``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CONTEXT,
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca_cert),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": user, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def write_webhook_client(
    directory: Path, pki: Pki, user: str, static_policies: Path | None = None
) -> Path:
    """An AdmissionConfiguration whose webhook kubeconfig gives every webhook ("*")
    a client certificate for ``user`` signed by the cluster's CA, as docs/dev/server.md
    shows; the files go in ``directory``. ``static_policies``: the directory of static
    ValidatingAdmissionPolicies (manifest-based admission, 1.37) the apiserver loads."""
    cert, key = directory / "webhook-client.crt", directory / "webhook-client.key"
    issue_client_cert(pki, cert, key, user)
    kubeconfig = directory / "webhook-client.kubeconfig"
    credentials = {"client-certificate": str(cert), "client-key": str(key)}
    kubeconfig.write_text(
        json.dumps(
            {"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": credentials}]}
        )
    )
    webhooks = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    config = directory / "admission-config.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": "ValidatingAdmissionWebhook", "configuration": webhooks},
                    {"name": "MutatingAdmissionWebhook", "configuration": webhooks},
                    *(
                        [
                            {
                                "name": "ValidatingAdmissionPolicy",
                                "configuration": {
                                    "apiVersion": "apiserver.config.k8s.io/v1",
                                    "kind": "ValidatingAdmissionPolicyConfiguration",
                                    "staticManifestsDir": str(static_policies),
                                },
                            }
                        ]
                        if static_policies is not None
                        else []
                    ),
                ],
            }
        )
    )
    return config
