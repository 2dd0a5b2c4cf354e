"""gunicorn configuration of runguard, for ``gunicorn -c gunicorn.conf.py``.

The same server as ``runguard serve`` (``webhook.server.gunicorn_options``), set by the
same environment variables (``webhook.settings.SETTINGS``; ``runguard serve --help``
lists them). ``runguard serve`` adds flags and a policy check before it starts.
"""

from webhook.server import configure_logging, gunicorn_options, prepare_multiprocess_metrics
from webhook.settings import ServeSettings

prepare_multiprocess_metrics()  # before the app (and prometheus_client) is loaded
configure_logging()
globals().update(gunicorn_options(ServeSettings.resolve({})))
wsgi_app = "webhook.app:create_app()"
