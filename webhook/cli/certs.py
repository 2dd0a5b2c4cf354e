"""``runguard certs``: the webhook's CA and serving certificate, created, rotated, checked.

    runguard certs [--service S] [--namespace N] --out DIR [--host H ...] [--force]
    runguard certs rotate --out DIR [--grace-hours H] [--ca-renew-days D] [--new-ca]
    runguard certs check DIR [--days N]
    runguard certs secret DIR

Exit codes: 0 done / certificates fine, 1 ``check`` found a certificate under the
threshold or one the apiserver would reject, 2 bad arguments or an unusable directory.
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from webhook.cli import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_OK
from webhook.install import certs, rotation

DEFAULT_CHECK_DAYS = 30


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="create, rotate or check the webhook's TLS certificates",
        description=(
            "Create a CA and a serving certificate for the webhook Service in DIR "
            "(ca.crt, ca.key, tls.crt, tls.key; keys mode 0600), and secret.yaml, the "
            "TLS Secret the kustomize base applies (with client-ca.crt when DIR has "
            "one). An existing CA is kept, and signs the new serving certificate, "
            "unless --force."
        ),
    )
    parser.add_argument("--service", default="runguard", help="Service name (default runguard)")
    parser.add_argument(
        "--namespace", default="runguard", help="Service namespace (default runguard)"
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="certificate directory")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="H",
        help="extra DNS name or IP address in the certificate (repeatable)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing CA (fresh installs only)"
    )
    parser.set_defaults(func=run_create, certs_parser=parser)
    sub = parser.add_subparsers(dest="certs_command", metavar="{rotate,check,secret}")

    rot = sub.add_parser(
        "rotate",
        help="issue a new serving certificate; roll the CA over in safe steps",
        description=(
            "Issue a new serving certificate with the same names. When the CA nears "
            "expiry (or with --new-ca) a new CA is rolled in over three runs, each to be "
            "applied to the cluster before the next: the new CA is added to ca.crt; then "
            "it signs the serving certificate; then the old CA is dropped. The "
            "kube-apiserver never sees a serving certificate its caBundle does not trust."
        ),
    )
    rot.add_argument("--out", type=Path, metavar="DIR", required=True, dest="rotate_out")
    rot.add_argument(
        "--grace-hours",
        type=float,
        default=rotation.ROTATION_GRACE.total_seconds() / 3600,
        metavar="H",
        help="minimum hours between CA rotation steps (default %(default)g)",
    )
    rot.add_argument(
        "--ca-renew-days",
        type=int,
        default=rotation.CA_RENEW_DAYS,
        metavar="D",
        help="start a CA rotation when the CA has fewer days left (default %(default)s)",
    )
    rot.add_argument("--new-ca", action="store_true", help="start a CA rotation now")
    rot.set_defaults(func=run_rotate)

    chk = sub.add_parser(
        "check",
        help="report days to expiry; exit 1 under --days or when untrusted",
    )
    chk.add_argument("dir", type=Path, metavar="DIR")
    chk.add_argument(
        "--days",
        type=int,
        default=DEFAULT_CHECK_DAYS,
        metavar="N",
        help="exit 1 when the serving certificate expires in fewer days (default %(default)s)",
    )
    chk.set_defaults(func=run_check)

    sec = sub.add_parser(
        "secret",
        help="write DIR/secret.yaml again from the files in DIR",
        description=(
            "Write DIR/secret.yaml, the TLS Secret the kustomize base applies, from "
            "ca.crt, tls.crt and tls.key (and client-ca.crt when there is one) as they "
            "are: after adding client-ca.crt, or editing ca.crt by hand. The other "
            "commands write it themselves."
        ),
    )
    sec.add_argument("dir", type=Path, metavar="DIR")
    sec.set_defaults(func=run_secret)


def _now() -> datetime:
    return datetime.now(UTC)


def _fail(message: str) -> int:
    print(f"runguard certs: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def run_create(args: argparse.Namespace) -> int:
    if args.out is None:
        args.certs_parser.error("--out DIR is required")
    out: Path = args.out
    try:
        if certs.has_ca(out) and not args.force:
            cs = rotation.reissue_serving_cert(
                certs.read_cert_set(out), args.service, args.namespace, args.host, _now()
            )
            note = f"kept the existing CA {out / certs.CA_FILE} (--force replaces it)"
        else:
            cs = certs.new_cert_set(args.service, args.namespace, args.host, _now())
            note = f"new CA {out / certs.CA_FILE}"
            if args.force:
                note += "; re-apply the webhook configurations before the new serving cert"
        certs.write_cert_set(out, cs)
    except certs.CertError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    print(note)
    print(f"serving certificate {out / certs.CERT_FILE} for {args.service}.{args.namespace}.svc")
    return EXIT_OK


def run_rotate(args: argparse.Namespace) -> int:
    out: Path = args.rotate_out
    try:
        result = rotation.rotate(
            certs.read_cert_set(out),
            _now(),
            ca_renew_days=args.ca_renew_days,
            grace=timedelta(hours=args.grace_hours),
            new_ca=args.new_ca,
        )
        if result.step != "waiting":
            certs.write_cert_set(out, result.certs)
    except certs.CertError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    print(f"{result.step}: {result.message}")
    return EXIT_OK


def run_secret(args: argparse.Namespace) -> int:
    try:
        certs.write_secret(args.dir)
    except certs.CertError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}")
    print(f"wrote {args.dir / certs.SECRET_FILE}")
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    now = _now()
    try:
        statuses, problems = rotation.inspect(certs.read_cert_set(args.dir), now)
    except certs.CertError as exc:
        return _fail(str(exc))
    width = max(len(s.file) for s in statuses)
    for s in statuses:
        days = math.floor(s.days_left)
        print(
            f"{s.file:<{width}}  {s.subject}  expires {s.not_after:%Y-%m-%d}  "
            f"{days} days{'  ' + s.note if s.note else ''}"
        )
    serving = next(s for s in statuses if s.file == certs.CERT_FILE)
    if serving.days_left < args.days:
        problems.append(
            f"{certs.CERT_FILE} expires in {math.floor(serving.days_left)} days "
            f"(threshold {args.days}): run `runguard certs rotate --out {args.dir}`"
        )
    newest_ca = max((s for s in statuses if s.file != certs.CERT_FILE), key=lambda s: s.not_after)
    if newest_ca.days_left < rotation.CA_RENEW_DAYS:
        print(
            f"note: the CA expires in {math.floor(newest_ca.days_left)} days; "
            "the next `certs rotate` starts a CA rotation"
        )
    for problem in problems:
        print(f"FAIL: {problem}")
    return EXIT_DENIED if problems else EXIT_OK
