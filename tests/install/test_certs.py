"""Certificates are checked by loading them back, the way the kube-apiserver will.

Chains are verified with cryptography's X.509 verifier (chain, validity at a given
time, subjectAltName, serverAuth) and once over a real TLS handshake. Rotation is
checked against the one property that matters: whatever order the cluster applies
the new ``caBundle`` and the new serving certificate in, the apiserver trusts the
certificate it is served.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import ssl
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from webhook.cli import main
from webhook.install import certs, rotation

T0 = datetime(2026, 1, 15, 12, 0, 0, tzinfo=UTC)
SERVICE_NAMES = [
    "runguard",
    "runguard.runguard",
    "runguard.runguard.svc",
    "runguard.runguard.svc.cluster.local",
]


def leaf_of(cs: certs.CertSet) -> x509.Certificate:
    return x509.load_pem_x509_certificate(cs.cert)


def cas_of(cs: certs.CertSet) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(cs.ca_bundle)


def trusted(
    bundle: bytes, cert: bytes, when: datetime, host: str = "runguard.runguard.svc"
) -> bool:
    try:
        rotation.verify_serving_cert(bundle, cert, host, when)
    except certs.CertError:
        return False
    return True


def cert_set_with_ca_days(ca_days: int, now: datetime = T0) -> certs.CertSet:
    ca = certs.create_ca(now, days=ca_days)
    leaf = certs.issue_serving_cert(ca, SERVICE_NAMES, now)
    return certs.CertSet(ca.cert_pem, ca.key_pem, leaf.cert_pem, leaf.key_pem)


# --- the certificates themselves ---------------------------------------------------


def test_service_dns_names_are_every_name_the_apiserver_may_use() -> None:
    assert certs.service_dns_names("rg", "ops") == [
        "rg",
        "rg.ops",
        "rg.ops.svc",
        "rg.ops.svc.cluster.local",
    ]


def test_serving_cert_verifies_for_every_service_name_and_extra_host() -> None:
    cs = certs.new_cert_set("runguard", "runguard", ["localhost", "127.0.0.1"], T0)
    for host in [*SERVICE_NAMES, "localhost", "127.0.0.1"]:
        assert trusted(cs.ca_bundle, cs.cert, T0, host), host
    assert not trusted(cs.ca_bundle, cs.cert, T0, "runguard.other.svc")
    assert not trusted(cs.ca_bundle, cs.cert, T0, "127.0.0.2")


def test_serving_cert_fields() -> None:
    cs = certs.new_cert_set("runguard", "runguard", ["10.1.2.3", "webhook.local"], T0)
    leaf = leaf_of(cs)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [*SERVICE_NAMES, "webhook.local"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    basic = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca is False
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    # Backdated for clock skew; one year of validity.
    assert leaf.not_valid_before_utc == T0 - timedelta(hours=1)
    assert leaf.not_valid_after_utc == T0 + timedelta(days=365)
    assert leaf.issuer == cas_of(cs)[0].subject


def test_ca_fields() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    (ca,) = cas_of(cs)
    basic = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca is True and basic.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert ca.subject == ca.issuer
    assert ca.not_valid_before_utc == T0 - timedelta(hours=1)
    assert ca.not_valid_after_utc == T0 + timedelta(days=3650)


def test_serving_cert_never_outlives_its_ca() -> None:
    cs = cert_set_with_ca_days(30)
    assert leaf_of(cs).not_valid_after_utc == cas_of(cs)[0].not_valid_after_utc


def test_serving_cert_is_not_valid_before_backdating_nor_after_expiry() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    assert trusted(cs.ca_bundle, cs.cert, T0 - timedelta(minutes=30))
    assert not trusted(cs.ca_bundle, cs.cert, T0 - timedelta(hours=2))
    assert not trusted(cs.ca_bundle, cs.cert, T0 + timedelta(days=366))


def test_bad_host_is_refused() -> None:
    with pytest.raises(certs.CertError, match="not a DNS name"):
        certs.new_cert_set("runguard", "runguard", ["https://x"], T0)


def test_real_tls_handshake_with_the_ca_bundle(tmp_path: Path) -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], datetime.now(UTC))
    certs.write_cert_set(tmp_path, cs)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve_twice() -> None:
            for _ in range(2):
                conn, _addr = listener.accept()
                try:
                    with server_ctx.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    pass

        thread = threading.Thread(target=serve_twice, daemon=True)
        thread.start()
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with client_ctx.wrap_socket(raw, server_hostname="runguard.runguard.svc") as tls:
                assert tls.recv(2) == b"ok"
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                client_ctx.wrap_socket(raw, server_hostname="runguard.elsewhere.svc")
        thread.join()


# --- rotation ----------------------------------------------------------------------


def test_rotate_with_a_healthy_ca_renews_only_the_serving_cert() -> None:
    cs = certs.new_cert_set("runguard", "runguard", ["127.0.0.1"], T0)
    later = T0 + timedelta(days=300)
    result = rotation.rotate(cs, later)
    assert result.step == "renewed"
    assert result.certs.ca_bundle == cs.ca_bundle and result.certs.ca_key == cs.ca_key
    old, new = leaf_of(cs), leaf_of(result.certs)
    assert new.serial_number != old.serial_number
    assert new.subject == old.subject
    assert new.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ) == old.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert new.not_valid_after_utc == later + timedelta(days=365)
    assert trusted(result.certs.ca_bundle, result.certs.cert, later, "127.0.0.1")


def test_ca_rotation_keeps_both_cas_then_drops_the_old_one() -> None:
    """Each step's serving cert is trusted by the bundle before *and* after that step.

    The apiserver may get the new caBundle before or after the webhook pods load the
    new serving certificate; both orders must work at every step.
    """
    cs = cert_set_with_ca_days(200)  # under the 365-day renewal threshold
    old_ca = cas_of(cs)[0]
    steps = []
    t = T0 + timedelta(days=1)
    for hours in (0, 1, 25, 26, 50, 51):
        now = t + timedelta(hours=hours)
        result = rotation.rotate(cs, now)
        steps.append(result.step)
        assert trusted(cs.ca_bundle, result.certs.cert, now), result.step
        assert trusted(result.certs.ca_bundle, cs.cert, now), result.step
        assert trusted(result.certs.ca_bundle, result.certs.cert, now), result.step
        if result.step == "staged-ca":
            staged = result.certs
        cs = result.certs
    assert steps == ["staged-ca", "waiting", "switched-ca", "waiting", "retired-ca", "renewed"]

    (new_ca,) = cas_of(cs)
    assert new_ca.public_key() != old_ca.public_key()
    assert leaf_of(cs).issuer == new_ca.subject
    # The staged bundle held both; the serving cert was still the old CA's.
    assert [c.public_key() for c in cas_of(staged)] == [old_ca.public_key(), new_ca.public_key()]
    assert leaf_of(staged).issuer == old_ca.subject
    # Why staging matters: the final certificate is untrusted by the original bundle.
    assert not trusted(old_ca.public_bytes(Encoding.PEM), cs.cert, t + timedelta(hours=51))


def test_rotate_new_ca_on_request_and_zero_grace() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    steps = []
    for _ in range(4):
        result = rotation.rotate(cs, T0, new_ca=not steps, grace=timedelta(0))
        steps.append(result.step)
        cs = result.certs
    assert steps == ["staged-ca", "switched-ca", "retired-ca", "renewed"]
    assert len(cas_of(cs)) == 1


def test_rotate_with_an_expired_ca_signs_with_the_new_ca_at_once() -> None:
    cs = cert_set_with_ca_days(10)
    now = T0 + timedelta(days=11)
    result = rotation.rotate(cs, now)
    assert result.step == "staged-ca"
    assert len(cas_of(result.certs)) == 2
    assert trusted(result.certs.ca_bundle, result.certs.cert, now)
    assert leaf_of(result.certs).issuer == cas_of(result.certs)[1].subject


def test_rotate_repairs_a_serving_cert_from_a_foreign_ca() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    other = certs.new_cert_set("runguard", "runguard", [], T0)
    broken = certs.CertSet(cs.ca_bundle, cs.ca_key, other.cert, other.key)
    assert not trusted(broken.ca_bundle, broken.cert, T0)
    result = rotation.rotate(broken, T0)
    assert result.step == "renewed"
    assert trusted(result.certs.ca_bundle, result.certs.cert, T0)


def test_rotate_refuses_a_key_of_no_ca_in_the_bundle() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    other = certs.new_cert_set("runguard", "runguard", [], T0)
    with pytest.raises(certs.CertError, match="ca.key"):
        rotation.rotate(certs.CertSet(cs.ca_bundle, other.ca_key, cs.cert, cs.key), T0)


def test_reissue_keeps_the_ca_and_refuses_during_a_rotation() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    again = rotation.reissue_serving_cert(cs, "runguard", "runguard", ["127.0.0.1"], T0)
    assert (again.ca_bundle, again.ca_key) == (cs.ca_bundle, cs.ca_key)
    assert trusted(again.ca_bundle, again.cert, T0, "127.0.0.1")
    staged = rotation.rotate(cs, T0, new_ca=True).certs
    with pytest.raises(certs.CertError, match="rotation is in progress"):
        rotation.reissue_serving_cert(staged, "runguard", "runguard", [], T0)


def test_inspect_reports_days_left_and_an_untrusted_serving_cert() -> None:
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    statuses, problems = rotation.inspect(cs, T0 + timedelta(days=100))
    assert problems == []
    assert [s.file for s in statuses] == ["ca.crt[0]", "tls.crt"]
    assert statuses[1].days_left == pytest.approx(265)
    other = certs.new_cert_set("runguard", "runguard", [], T0)
    _, problems = rotation.inspect(certs.CertSet(cs.ca_bundle, cs.ca_key, other.cert, cs.key), T0)
    assert any("not signed by any CA" in p for p in problems)
    assert any("tls.key is not the key" in p for p in problems)


# --- files and the command line ----------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_cert_set_modes_and_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    cs = certs.new_cert_set("runguard", "runguard", [], T0)
    certs.write_cert_set(out, cs)
    assert mode(out) == 0o700
    assert mode(out / "ca.key") == 0o600 and mode(out / "tls.key") == 0o600
    assert mode(out / "ca.crt") == 0o644 and mode(out / "tls.crt") == 0o644
    assert mode(out / "secret.yaml") == 0o600  # it holds tls.key
    assert certs.read_cert_set(out) == cs
    assert sorted(p.name for p in out.iterdir()) == [
        "ca.crt", "ca.key", "secret.yaml", "tls.crt", "tls.key",
    ]  # fmt: skip


def secret_data(directory: Path) -> dict[str, str]:
    secret = yaml.safe_load((directory / "secret.yaml").read_text())
    assert secret["apiVersion"] == "v1" and secret["kind"] == "Secret"
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "runguard-tls" and "namespace" not in secret["metadata"]
    data: dict[str, str] = secret["data"]
    return data


def test_secret_yaml_holds_the_files_base64_on_one_line(tmp_path: Path) -> None:
    """What the kustomize base applies: each value exactly as the apiserver returns it
    (base64, no line breaks), so a second `kubectl apply` has nothing to send."""
    out = tmp_path / "certs"
    certs.write_cert_set(out, certs.new_cert_set("runguard", "runguard", [], T0))
    data = secret_data(out)
    assert sorted(data) == ["ca.crt", "tls.crt", "tls.key"]  # ca.key stays out
    for key, value in data.items():
        assert value == base64.b64encode((out / key).read_bytes()).decode()
    assert "\n" not in "".join(data.values())

    # The apiserver's client CA (mTLS) put beside them, or a CA appended to ca.crt by hand
    # (docs/operations.md): `certs secret` writes the Secret from the files as they are.
    client_ca = certs.new_cert_set("other", "other", [], T0).ca_bundle
    (out / "client-ca.crt").write_bytes(client_ca)
    with (out / "ca.crt").open("ab") as bundle:
        bundle.write(client_ca)
    before = certs.read_cert_set(out)
    assert main(["certs", "secret", str(out)]) == 0
    assert certs.read_cert_set(out) == before
    data = secret_data(out)
    assert sorted(data) == ["ca.crt", "client-ca.crt", "tls.crt", "tls.key"]
    for key, value in data.items():
        assert value == base64.b64encode((out / key).read_bytes()).decode()
    # ... and every later write keeps client-ca.crt in.
    assert main(["certs", "rotate", "--out", str(out)]) == 0
    assert "client-ca.crt" in secret_data(out)


def test_cli_secret_names_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "secret", str(tmp_path)]) == 2
    assert "ca.crt" in capsys.readouterr().err
    assert not (tmp_path / "secret.yaml").exists()


def read_sans(path: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [
        *san.get_values_for_type(x509.DNSName),
        *map(str, san.get_values_for_type(x509.IPAddress)),
    ]


def test_cli_creates_then_keeps_the_ca_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert (
        main(
            [
                "certs",
                "--service",
                "rg",
                "--namespace",
                "ops",
                "--out",
                str(out),
                "--host",
                "127.0.0.1",
                "--host",
                "rg.example",
            ]
        )
        == 0
    )
    assert read_sans(out / "tls.crt") == [
        "rg",
        "rg.ops",
        "rg.ops.svc",
        "rg.ops.svc.cluster.local",
        "rg.example",
        "127.0.0.1",
    ]
    assert mode(out / "ca.key") == 0o600 and mode(out / "tls.key") == 0o600
    ca, ca_key, leaf = (
        (out / "ca.crt").read_bytes(),
        (out / "ca.key").read_bytes(),
        (out / "tls.crt").read_bytes(),
    )

    assert main(["certs", "--service", "rg", "--namespace", "ops", "--out", str(out)]) == 0
    assert (out / "ca.crt").read_bytes() == ca and (out / "ca.key").read_bytes() == ca_key
    assert (out / "tls.crt").read_bytes() != leaf
    assert read_sans(out / "tls.crt") == ["rg", "rg.ops", "rg.ops.svc", "rg.ops.svc.cluster.local"]
    assert trusted(ca, (out / "tls.crt").read_bytes(), datetime.now(UTC), "rg.ops.svc")

    assert (
        main(["certs", "--service", "rg", "--namespace", "ops", "--out", str(out), "--force"]) == 0
    )
    assert (out / "ca.crt").read_bytes() != ca and (out / "ca.key").read_bytes() != ca_key
    assert mode(out / "ca.key") == 0o600
    assert trusted(
        (out / "ca.crt").read_bytes(),
        (out / "tls.crt").read_bytes(),
        datetime.now(UTC),
        "rg.ops.svc",
    )


def test_cli_refuses_a_ca_without_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ca.crt").write_bytes(certs.new_cert_set("a", "b", [], T0).ca_bundle)
    assert main(["certs", "--out", str(tmp_path)]) == 2
    assert "ca.key" in capsys.readouterr().err
    assert not (tmp_path / "tls.crt").exists()


def test_cli_create_needs_out() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["certs", "--service", "rg"])
    assert exc.value.code == 2


def test_cli_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out)]) == 0
    assert main(["certs", "check", str(out)]) == 0
    assert "tls.crt" in capsys.readouterr().out
    assert main(["certs", "check", str(out), "--days", "400"]) == 1
    assert "FAIL: tls.crt expires in 364 days" in capsys.readouterr().out

    # A serving cert from another CA: what the apiserver would reject.
    other = certs.new_cert_set("runguard", "runguard", [], datetime.now(UTC))
    (out / "tls.crt").write_bytes(other.cert)
    (out / "tls.key").write_bytes(other.key)
    assert main(["certs", "check", str(out)]) == 1
    assert "not signed by any CA" in capsys.readouterr().out

    assert main(["certs", "check", str(tmp_path / "missing")]) == 2


def test_cli_check_fails_for_a_soon_expiring_serving_cert(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    ca = certs.create_ca(now)
    leaf = certs.issue_serving_cert(ca, SERVICE_NAMES, now, days=10)
    certs.write_cert_set(
        tmp_path, certs.CertSet(ca.cert_pem, ca.key_pem, leaf.cert_pem, leaf.key_pem)
    )
    assert main(["certs", "check", str(tmp_path)]) == 1
    assert main(["certs", "check", str(tmp_path), "--days", "5"]) == 0


def test_cli_rotate_walks_a_ca_rotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out)]) == 0
    original_ca = (out / "ca.crt").read_bytes()
    capsys.readouterr()

    assert main(["certs", "rotate", "--out", str(out), "--new-ca"]) == 0
    assert capsys.readouterr().out.startswith("staged-ca:")
    assert len(x509.load_pem_x509_certificates((out / "ca.crt").read_bytes())) == 2
    # The default grace period holds the switch back.
    before = certs.read_cert_set(out)
    assert main(["certs", "rotate", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("waiting:")
    assert certs.read_cert_set(out) == before

    assert main(["certs", "rotate", "--out", str(out), "--grace-hours", "0"]) == 0
    assert capsys.readouterr().out.startswith("switched-ca:")
    assert len(x509.load_pem_x509_certificates((out / "ca.crt").read_bytes())) == 2
    assert main(["certs", "check", str(out)]) == 0
    capsys.readouterr()

    assert main(["certs", "rotate", "--out", str(out), "--grace-hours", "0"]) == 0
    assert capsys.readouterr().out.startswith("retired-ca:")
    bundle = (out / "ca.crt").read_bytes()
    assert len(x509.load_pem_x509_certificates(bundle)) == 1 and bundle != original_ca
    assert mode(out / "ca.key") == 0o600 and mode(out / "tls.key") == 0o600
    assert main(["certs", "check", str(out)]) == 0


def test_cli_rotate_without_certificates_is_bad_input(tmp_path: Path) -> None:
    assert main(["certs", "rotate", "--out", str(tmp_path)]) == 2


def test_lost_ca_key_recovery_from_the_docs() -> None:
    """docs/operations.md: --force, append the old ca.crt, then rotate drops it."""
    old = certs.new_cert_set("runguard", "runguard", [], T0)
    forced = certs.new_cert_set("runguard", "runguard", [], T0 + timedelta(days=1))
    both = certs.CertSet(forced.ca_bundle + old.ca_bundle, forced.ca_key, forced.cert, forced.key)
    now = T0 + timedelta(days=1)
    # Pods still serving the old certificate and pods serving the new one are both trusted.
    assert trusted(both.ca_bundle, old.cert, now) and trusted(both.ca_bundle, both.cert, now)
    assert rotation.rotate(both, now + timedelta(hours=1)).step == "waiting"
    result = rotation.rotate(both, now + timedelta(hours=25))
    assert result.step == "retired-ca"
    assert cas_of(result.certs) == cas_of(forced)
