"""gunicorn configuration of runguard, for ``gunicorn -c gunicorn.conf.py``.

The settings are those of ``runguard serve`` (``webhook.server.gunicorn_options``), read
from the same environment: RUNGUARD_POLICY_DIR, RUNGUARD_CERT_FILE, RUNGUARD_KEY_FILE,
RUNGUARD_BIND, RUNGUARD_WORKERS, RUNGUARD_THREADS, RUNGUARD_MAX_BODY. ``runguard serve``
is the same server with command-line flags and a policy check before it starts.
"""

from webhook.server import (
    ServeSettings,
    configure_logging,
    gunicorn_options,
    prepare_multiprocess_metrics,
)

prepare_multiprocess_metrics()  # before the app (and prometheus_client) is loaded
configure_logging()
globals().update(gunicorn_options(ServeSettings.resolve({})))
wsgi_app = "webhook.app:create_app()"
