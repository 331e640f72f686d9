"""The retrain job: `sense7.retraining.Retrainer` under a Redis lock, as a Celery task.

A Redis lock keeps two retrains from running at once; its short TTL is renewed while training, so a killed
worker's lock expires within a minute or two.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from celery import shared_task
from sense7.tasks import names
from sense7.tasks.cadence import retrain_finished
from sense7.tasks.celery_app import get_app
from sense7.tasks.runtime import current_runtime

from sense7.model.options import served_params
from sense7.model.registry import ModelRegistry
from sense7.retraining import Retrainer, RetrainBusy, RetrainResult

log = logging.getLogger(__name__)

LOCK_NAME = "sense7:retrain-lock"


@contextmanager
def retrain_lock(redis_url: str, ttl: float = 120.0):
    """Hold the Redis lock for the duration, a lease renewed every ttl/3 s; raise RetrainBusy if taken."""
    from sense7.tasks.broker import redis_client, take_lease

    lease = take_lease(redis_client(redis_url), LOCK_NAME, ttl)
    if lease is None:
        raise RetrainBusy("another retrain is running")
    with lease:
        yield


def run_retrain(runtime, redis_url: str, reason: str) -> dict:
    """Retrain under the lock (CLI and worker share this)."""
    jobs = runtime.jobs
    try:
        with retrain_lock(redis_url, ttl=jobs.retrain_lock_ttl):
            registry = ModelRegistry.from_settings(runtime.settings, runtime.store)
            retrainer = Retrainer(runtime.store, registry, runtime.taxonomy, keep_versions=jobs.keep_versions,
                                  quality=runtime.settings.quality,
                                  personalized_params=served_params(runtime.settings))
            result = retrainer.run(reason)
    except RetrainBusy as exc:
        return RetrainResult("skipped", None, ModelRegistry.from_settings(runtime.settings, runtime.store).current(), str(exc)).as_dict()
    retrain_finished(redis_url, trained=result.status != "skipped")
    return result.as_dict()


@shared_task(name=names.RETRAIN)  # time limits: celery_app.celery_config
def retrain_task(reason: str = "manual") -> dict:
    runtime = current_runtime()
    app = get_app()
    result = run_retrain(runtime, app.conf.broker_url, reason)
    if result["status"] == "promoted" and runtime.jobs.preannotate_after_promote:
        app.send_task(names.PREANNOTATE)
    return result
