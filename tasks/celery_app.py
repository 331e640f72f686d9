"""The one Celery app of sense7: Redis as broker and result backend, configured from the environment.

Reliability choices (see tasks/README.md): late acks + reject on worker loss so a job whose worker dies
is delivered again; prefetch 1 so a long retrain never holds other jobs hostage; every job is idempotent
(upserts keyed by annotation id + updated time, predictions keyed by model version, retrain guarded by a
Redis lock and an atomic promote), so a second delivery is harmless.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from celery import Celery

from sense7.settings import Settings
from sense7.tasks.redis_local import redis_url

TASK_MODULES = ["sense7.tasks.sync", "sense7.tasks.training", "sense7.tasks.preannotate"]


@dataclass(frozen=True)
class JobSettings:
    """Knobs of the jobs that sense7.settings.Settings does not carry (yet)."""

    sync_interval: float = 300.0          # SENSE7_SYNC_INTERVAL: seconds between reconciliations (beat)
    retrain_interval: float = 86400.0     # SENSE7_RETRAIN_INTERVAL: seconds between scheduled retrains
    retrain_every: int = 200              # SENSE7_RETRAIN_EVERY: new ratings that trigger a retrain (0 = off)
    keep_versions: int = 5                # SENSE7_KEEP_VERSIONS: model versions kept on disk
    retry_backoff: int = 2                # SENSE7_RETRY_BACKOFF: first retry delay (s), doubled each time
    retry_backoff_max: int = 300          # SENSE7_RETRY_BACKOFF_MAX
    max_retries: int = 8                  # SENSE7_MAX_RETRIES
    retrain_soft_limit: int = 1800        # SENSE7_RETRAIN_SOFT_LIMIT (s); hard limit is +120 s
    sync_soft_limit: int = 600            # SENSE7_SYNC_SOFT_LIMIT (s); hard limit is +60 s
    preannotate_chunk: int = 500          # SENSE7_PREANNOTATE_CHUNK: predictions per import request
    preannotate_after_promote: int = 1    # SENSE7_PREANNOTATE_AFTER_PROMOTE: 1 = push predictions of a new version
    retrain_lock_ttl: float = 120.0       # SENSE7_RETRAIN_LOCK_TTL (s): a dead worker's lock expires after this
    visibility_timeout: int = 3600        # SENSE7_VISIBILITY_TIMEOUT (s): unacked job of a vanished worker
                                          # is delivered again after this (must exceed the longest job)

    @classmethod
    def from_env(cls, env: dict | None = None) -> "JobSettings":
        env = os.environ if env is None else env
        values = {}
        for name, fld in cls.__dataclass_fields__.items():
            raw = env.get(f"SENSE7_{name.upper()}")
            if raw not in (None, ""):
                try:
                    values[name] = float(raw) if fld.type == "float" else int(raw)
                except ValueError:
                    raise ValueError(f"environment variable SENSE7_{name.upper()}: expected a number, got {raw!r}") from None
        return cls(**values)


def celery_config(url: str | None, jobs: JobSettings) -> dict:
    schedule = {
        "reconcile-labels": {"task": "sense7.reconcile", "schedule": jobs.sync_interval},
        "scheduled-retrain": {"task": "sense7.retrain", "schedule": jobs.retrain_interval,
                              "kwargs": {"reason": "schedule"}},
    }
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
        # A job taken by a worker that vanished is delivered again after this (Redis transport).
        # kombu sweeps for a vanished worker's unacked jobs every interval x throttle seconds (10 x 10 by
        # default): scan every time, at most every 10 s and never less often than the visibility timeout,
        # so redelivery follows the timeout instead of trailing it by up to 100 s.
        "broker_transport_options": {"visibility_timeout": jobs.visibility_timeout,
                                     "unacked_restore_interval": min(10, jobs.visibility_timeout),
                                     "unacked_restore_throttle": 1},
        "result_backend_transport_options": {"visibility_timeout": jobs.visibility_timeout},
        "beat_schedule": schedule,
        "timezone": "UTC",
        "worker_hijack_root_logger": False,
    }


def create_app(settings: Settings | None = None, jobs: JobSettings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    jobs = jobs or JobSettings.from_env()
    app = Celery("sense7", include=TASK_MODULES)
    app.conf.update(celery_config(redis_url(settings), jobs))
    app.conf.sense7_jobs = jobs
    return app


app = create_app()
