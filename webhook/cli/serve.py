"""``runguard serve``: the admission webhook over TLS, in gunicorn (see webhook/serving/server.py).

Its flags and the environment variables it reads are ``webhook.serving.settings.SETTINGS``.
"""

from __future__ import annotations

import argparse
import ssl
import sys
from typing import Any

from webhook.serving.settings import SETTINGS


def env_help() -> str:
    """The epilog: each setting's environment variable."""
    flagged = [s.env for s in SETTINGS if s.flags is not None]
    lines = ["environment (for the container image; flags win):"]
    lines += ["  " + ", ".join(flagged[i : i + 4]) for i in range(0, len(flagged), 4)]
    lines.append("environment only:")
    lines += [f"  {s.env}: {s.help}" for s in SETTINGS if s.flags is None]
    return "\n".join(lines) + "\n"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the admission webhook over TLS",
        description="Serve POST /mutate and /validate, /healthz, /readyz and /metrics\n"
        "over TLS with gunicorn; policy and certificate files are reloaded when they change.",
        epilog=env_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for setting in SETTINGS:
        if setting.flags is not None:
            parser.add_argument(
                *setting.option_strings,
                dest=setting.name,
                metavar=setting.metavar,
                help=setting.help,
            )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from webhook.cli import EXIT_BAD_INPUT
    from webhook.serving.logs import configure_logging
    from webhook.serving.policystore import PolicyStore
    from webhook.serving.server import (
        RunguardApplication,
        prepare_multiprocess_metrics,
        remove_multiprocess_metrics,
    )
    from webhook.serving.settings import ServeSettings, SettingsError

    try:
        settings = ServeSettings.resolve(vars(args))
    except SettingsError as exc:
        print(f"runguard serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    files = (settings.cert_file, settings.key_file, settings.client_ca)
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(settings.cert_file, settings.key_file)
        if settings.client_ca is not None:
            context.load_verify_locations(settings.client_ca)
    except (OSError, ssl.SSLError) as exc:
        shown = " / ".join(str(f) for f in files if f is not None)
        print(f"runguard serve: cannot use {shown}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    configure_logging(capacity=settings.log_queue)
    from webhook.policy.errors import PolicyError

    if settings.policy_objects is not None and not _mirror_policy_objects(settings):
        return EXIT_BAD_INPUT
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


SYNC_TIMEOUT = 60.0  # seconds for the policy watch's first list


def _mirror_policy_objects(settings: Any) -> bool:
    """Start the policy watch (``webhook.policy.mirror``) and wait for its first mirror of
    the cluster's RunPolicy and Profile objects into the policy directory."""
    import atexit

    from webhook.policy.mirror.process import SYNCED, PolicyWatch, wait_synced

    (settings.policy_dir / SYNCED).unlink(missing_ok=True)
    watch = PolicyWatch(settings.policy_dir, settings.policy_objects)
    watch.start()
    atexit.register(watch.stop)
    if wait_synced(settings.policy_dir, SYNC_TIMEOUT, alive=lambda: True):
        return True
    print(
        f"runguard serve: policy objects: not listed within {SYNC_TIMEOUT:.0f}s: check that "
        "the runpolicies, profiles and platforms.runguard.io CRDs are installed and that "
        "runguard's ServiceAccount may get, list and watch them (the watch's log above "
        "says which)",
        file=sys.stderr,
    )
    watch.stop()
    return False
