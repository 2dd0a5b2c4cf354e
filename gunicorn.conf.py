"""gunicorn configuration of runguard, for ``gunicorn -c gunicorn.conf.py``.

The same server as ``runguard serve`` (``webhook.serving.server.gunicorn_options``), set by the
same environment variables (``webhook.serving.settings.SETTINGS``; ``runguard serve --help``
lists them). ``runguard serve`` adds flags and a policy check before it starts.
"""

from webhook.serving.logs import configure_logging
from webhook.serving.server import gunicorn_options, prepare_multiprocess_metrics
from webhook.serving.settings import ServeSettings

runguard_settings = ServeSettings.resolve({})
prepare_multiprocess_metrics()  # before the app (and prometheus_client) is loaded
configure_logging(capacity=runguard_settings.log_queue)
globals().update(gunicorn_options(runguard_settings))
wsgi_app = "webhook.serving.app:create_app()"
