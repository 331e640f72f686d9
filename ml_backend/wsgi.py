"""WSGI entry point: `gunicorn "sense7.ml_backend.wsgi:app_from_env()"` (see gunicorn_conf.py).

SENSE7_BACKEND_ON_EVENT="module:function" names the `on_event(action, payload)` that receives webhook
events (e.g. the Celery jobs' "enqueue sync/retrain"); without it events are logged and acknowledged.
"""

from __future__ import annotations

import importlib
import logging

from sense7.ml_backend.app import create_app

from sense7.settings import Settings


def _on_event(spec: str | None):
    if not spec:
        return None
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name or "on_event")


def app_from_env():
    """gunicorn's app factory (`sense7.ml_backend.wsgi:app_from_env()`): called once per worker process,
    so importing this module reads no settings and loads no model. The app returned holds the registry's
    current version already: a worker answers /predict only once it is loaded."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    app = create_app(settings, on_event=_on_event(settings.serving.on_event))  # the current version loaded
    # Promotions are followed by this worker's background thread, never by a request. Started here, in each
    # worker (gunicorn_conf.py: no preload); were the app built in gunicorn's master, the thread would not
    # survive the fork, and HotModel.get starts it again in the worker on its first request.
    app.extensions["sense7_model"].hot_model.start()
    return app
