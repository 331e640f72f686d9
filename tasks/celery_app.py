"""The one Celery app of sense7: Redis as broker and result backend, configured from sense7's Settings.

Importing this module reads no settings and touches neither disk nor network: the app is built on first
use. The worker (`celery -A sense7.tasks.celery_app:app worker`) asks for `app`, which configures it once
from the environment; a process that already holds its Settings (the CLI, the demo, tests) calls
`configure(settings)` instead. Job modules declare their jobs with `shared_task`, so they need no app.

Reliability choices (see tasks/README.md): late acks + reject on worker loss so a job whose worker dies
is delivered again; prefetch 1 so a long retrain never holds other jobs hostage; every job is idempotent
(upserts keyed by annotation id + updated time, predictions keyed by model version, retrain guarded by a
Redis lock and an atomic promote), so a second delivery is harmless.
"""

from __future__ import annotations

import threading

from celery import Celery
from kombu import Queue
from sense7.tasks import names

from sense7.settings import JobSettings, Settings

# One queue per kind of work, so that none waits behind thousands of another's jobs; a worker started
# without -Q consumes them all (and Celery's default queue, where plain clients send).
QUEUES = {names.SYNC_PENDING: "sense7.sync", names.SYNC_ANNOTATION: "sense7.sync",
          names.DELETE_ANNOTATIONS: "sense7.sync", names.RECONCILE: "sense7.reconcile",
          names.RETRAIN: "sense7.train", names.PREANNOTATE: "sense7.preannotate",
          names.DELIVER: "sense7.deliver", names.REFRESH_QUEUES: "sense7.deliver",
          names.CROWD_PREPARE: "sense7.crowd", names.CROWD_EXPIRE: "sense7.crowd",
          names.EMBED_TEXTS: "sense7.embed"}

_lock = threading.Lock()
_app: Celery | None = None


def celery_config(url: str | None, jobs: JobSettings) -> dict:
    schedule = {
        "reconcile-labels": {"task": names.RECONCILE, "schedule": jobs.sync_interval},
        # Rater-page submissions left undelivered while Label Studio was down (each submission also queues
        # a delivery at once; this is the safety net).
        "deliver-submissions": {"task": names.DELIVER, "schedule": jobs.deliver_interval},
        # New tasks and fresh predictions reach the raters' queue copies (opening a link reads only those).
        "refresh-rater-queues": {"task": names.REFRESH_QUEUES, "schedule": jobs.rater_queue_interval},
        # Crowd participants whose lease ended give their unfinished conversations back to the pool.
        "crowd-expire-leases": {"task": names.CROWD_EXPIRE, "schedule": 60.0},
        "scheduled-retrain": {"task": names.RETRAIN, "schedule": jobs.retrain_interval,
                              "kwargs": {"reason": "schedule"}},
    }
    # Retry policy and time limits per job, from the settings (Celery applies annotations when it binds
    # a job to the app, so the job modules carry no numbers of their own).
    retry = {"retry_backoff": jobs.retry_backoff, "retry_backoff_max": jobs.retry_backoff_max,
             "max_retries": jobs.max_retries}
    sync_limits = {"soft_time_limit": jobs.sync_soft_limit, "time_limit": jobs.sync_time_limit}
    annotations = {name: {**retry, **sync_limits}
                   for name in (names.SYNC_PENDING, names.SYNC_ANNOTATION, names.DELETE_ANNOTATIONS,
                                names.RECONCILE, names.PREANNOTATE, names.DELIVER,
                                 names.REFRESH_QUEUES, names.CROWD_PREPARE, names.CROWD_EXPIRE)}
    # Embedding a large import is CPU work like a retrain: the retrain's limits.
    annotations[names.EMBED_TEXTS] = {**retry, "soft_time_limit": jobs.retrain_soft_limit,
                                      "time_limit": jobs.retrain_time_limit}
    annotations[names.RETRAIN] = {"soft_time_limit": jobs.retrain_soft_limit,
                                  "time_limit": jobs.retrain_time_limit}
    return {
        "broker_url": url,
        "result_backend": url,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_track_started": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 7 * 86400,
        "broker_connection_retry_on_startup": True,
        # A job taken by a worker that vanished is delivered again after this (Redis transport): the longest
        # job's hard limit and a minute by default, so a job still running is never handed out twice.
        # kombu sweeps for a vanished worker's unacked jobs every interval x throttle seconds (10 x 10 by
        # default): scan every time, at most every 10 s and never less often than the visibility timeout,
        # so redelivery follows the timeout instead of trailing it by up to 100 s.
        "broker_transport_options": {"visibility_timeout": jobs.redelivery_timeout,
                                     "unacked_restore_interval": min(10, jobs.redelivery_timeout),
                                     "unacked_restore_throttle": 1},
        "result_backend_transport_options": {"visibility_timeout": jobs.redelivery_timeout},
        "beat_schedule": schedule,
        "task_annotations": annotations,
        "task_queues": [Queue(q) for q in sorted(set(QUEUES.values()))] + [Queue("celery")],
        "task_routes": {name: {"queue": queue} for name, queue in QUEUES.items()},
        "timezone": "UTC",
        "worker_hijack_root_logger": False,
    }


def create_app(settings: Settings, redis_url: str | None = None) -> Celery:
    """A configured Celery app for these settings (`redis_url`: the broker when already resolved)."""
    from sense7.tasks.redis_local import redis_url as configured_redis

    app = Celery("sense7", include=list(names.JOB_MODULES), set_as_current=True)
    app.conf.update(celery_config(redis_url or configured_redis(settings), settings.jobs))
    app.conf.sense7_settings = settings
    return app


def configure(settings: Settings, redis_url: str | None = None) -> Celery:
    """Make this process's app the one for `settings` (the CLI and the demo, once they know their
    broker). Replaces an app built earlier in this process."""
    global _app
    with _lock:
        _app = create_app(settings, redis_url)
        _app.set_default()
        return _app


def get_app() -> Celery:
    """This process's app, configured from the environment on first use."""
    global _app
    with _lock:
        if _app is None:
            _app = create_app(Settings.from_env())
            _app.set_default()
        return _app


def __getattr__(name: str):
    # `celery -A sense7.tasks.celery_app:app` and `from sense7.tasks.celery_app import app` resolve here,
    # so the app is built when it is first asked for, not when the module is imported.
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
