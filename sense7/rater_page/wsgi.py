"""WSGI entry point: `gunicorn "sense7.rater_page.wsgi:app_from_env()"` (sense7/rater_page/gunicorn_conf.py).

Wires the page to its collaborators: Label Studio (the rater's queue is copied from it when they open
their link), the worker (a submission asks for a delivery job) and Redis (failed link openings are
counted there, across gunicorn workers).
"""

from __future__ import annotations

import logging

from sense7.settings import Settings


def queue_refresher(settings: Settings, store, taxonomy):
    """refresh_queue(rater_id) -> bool for the page: False when Label Studio cannot be reached."""
    from sense7.labelstudio.client import connect, ensure_projects
    from sense7.labelstudio.rater_accounts import copy_queue

    state: dict = {}
    accounts: dict[str, int] = {}  # each rater's attribution account as last seen (copy_queue checks it)

    def refresh(rater_id: str) -> bool:
        try:
            if "client" not in state:
                state["client"] = connect(settings, timeout=20.0)
                state["projects"] = ensure_projects(state["client"], settings, taxonomy)
            client, (rating, profile) = state["client"], state["projects"]
            accounts[rater_id] = copy_queue(client, store, rating, profile, taxonomy, rater_id,
                                            accounts.get(rater_id))
        except Exception as exc:  # Label Studio down or refusing: serve the copy the store has
            logging.getLogger(__name__).warning("queue refresh failed: %s", type(exc).__name__)
            state.clear()
            return False
        return True

    return refresh


def app_from_env():
    """gunicorn's app factory: called once per worker process."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    from sense7.store.database import Store
    from sense7.rater_page.app import create_app
    from sense7.rater_page.services import EXTENSION
    from sense7.tasks.crowd_jobs import request_prepare
    from sense7.tasks.delivery import request_delivery
    from sense7.tasks.redis_local import redis_url
    from sense7.taxonomy import study_taxonomy

    settings = Settings.from_env()
    store, taxonomy = Store(settings.store_url), study_taxonomy(settings)
    try:
        limiter_storage = redis_url(settings) or "memory://"
    except Exception:
        limiter_storage = "memory://"
    app = create_app(settings, refresh_queue=queue_refresher(settings, store, taxonomy),
                     request_delivery=request_delivery, taxonomy=taxonomy, store=store,
                     limiter_storage=limiter_storage, request_prepare=request_prepare)
    # The served model version is loaded and followed in this worker's background thread, never by a
    # request: pages show the queue's pre-fill until it is loaded.
    app.extensions[EXTENSION].live_prefills.start()
    return app
