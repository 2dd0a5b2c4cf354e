"""``runguard serve``: the admission webhook over TLS, in gunicorn (see webhook/server.py)."""

from __future__ import annotations

import argparse
import ssl
import sys
from typing import Any

ENV_HELP = """\
environment (for the container image; flags win):
  RUNGUARD_POLICY_DIR, RUNGUARD_CERT_FILE, RUNGUARD_KEY_FILE, RUNGUARD_BIND,
  RUNGUARD_WORKERS, RUNGUARD_THREADS, RUNGUARD_MAX_BODY
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the admission webhook over TLS",
        description="Serve POST /mutate and /validate, /healthz, /readyz and /metrics\n"
        "over TLS with gunicorn; policy and certificate files are reloaded when they change.",
        epilog=ENV_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-p", "--policy-dir", metavar="DIR", help="policy directory")
    parser.add_argument("--cert", dest="cert_file", metavar="FILE", help="serving certificate")
    parser.add_argument("--key", dest="key_file", metavar="FILE", help="its private key")
    parser.add_argument("--bind", metavar="HOST:PORT", help="default 127.0.0.1:8443")
    parser.add_argument("--workers", metavar="N", help="worker processes (default: cores)")
    parser.add_argument("--threads", metavar="N", help="threads per worker (default 2)")
    parser.add_argument("--max-body", metavar="BYTES", help="request size limit (default 4Mi)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from webhook.cli import EXIT_BAD_INPUT
    from webhook.server import (
        PolicyStore,
        RunguardApplication,
        ServeSettings,
        SettingsError,
        configure_logging,
        prepare_multiprocess_metrics,
        remove_multiprocess_metrics,
    )

    try:
        settings = ServeSettings.resolve(vars(args))
    except SettingsError as exc:
        print(f"runguard serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            settings.cert_file, settings.key_file
        )
    except (OSError, ssl.SSLError) as exc:
        print(f"runguard serve: cannot use {settings.cert_file} / {settings.key_file}: {exc}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT

    configure_logging()
    from webhook.policy.errors import PolicyError

    store = PolicyStore(settings.policy_dir, interval=settings.reload_interval)
    try:
        store.load()
    except PolicyError as exc:
        print(f"runguard serve: policy in {settings.policy_dir} does not load:", file=sys.stderr)
        for issue in exc.errors:
            print(f"  {issue}", file=sys.stderr)
        return EXIT_BAD_INPUT
    prepare_multiprocess_metrics()  # before anything imports prometheus_client
    try:
        RunguardApplication(settings, store).run()
    finally:
        remove_multiprocess_metrics()  # also when gunicorn fails to start (port in use)
    return 0
