"""WSGI entry point: `gunicorn sense7.ml_backend.wsgi:app` (see gunicorn_conf.py).

SENSE7_BACKEND_ON_EVENT="module:function" names the `on_event(action, payload)` that receives webhook
events (e.g. the Celery jobs' "enqueue sync/retrain"); without it events are logged and acknowledged.
"""

from __future__ import annotations

import importlib
import logging
import os

from sense7.ml_backend.app import create_app
from sense7.settings import Settings


def _on_event_from_env():
    spec = os.environ.get("SENSE7_BACKEND_ON_EVENT")
    if not spec:
        return None
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name or "on_event")


logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
app = create_app(Settings.from_env(), on_event=_on_event_from_env())
