"""What a worker does as it starts: pick up the work a killed worker left half-done, in seconds.

A worker killed with `kill -9` runs none of its clean-up: its "queued or running" flags stay until they
expire (so the submissions and webhooks that arrive meanwhile queue no job), its locks stay until their
lease runs out (seconds: tasks/broker.py), sync entries it had claimed stay in the claimed sets, and its
unacknowledged messages come back only after the broker's visibility timeout (sized to the longest job:
JobSettings.redelivery_timeout). So a starting worker clears the flags and queues one delivery and one
sync drain (and the crowd's prepare job) at once: the delivery waits out a dead holder's lease and writes every undelivered submission
(idempotently: a retry reads the task before writing), the drain gives the claimed entries back and reads
them into the store. On a clean start both find an empty outbox and empty sets, and touch no Label Studio.
"""

from __future__ import annotations

import logging

from celery.signals import worker_ready

from sense7.tasks import crowd_jobs, delivery, names, sync
from sense7.tasks.broker import queue_once, redis_client

log = logging.getLogger(__name__)

# job -> its "queued or running" flag and that flag's TTL
RESUMABLE = {names.DELIVER: (delivery.SCHEDULED_KEY, delivery.SCHEDULED_TTL),
             names.SYNC_PENDING: (sync.SCHEDULED_KEY, sync.SCHEDULED_TTL),
             names.CROWD_PREPARE: (crowd_jobs.SCHEDULED_KEY, crowd_jobs.SCHEDULED_TTL)}


def resume_interrupted_work(app) -> list[str]:
    """Clear the flags a dead worker may have left and queue one delivery and one sync drain (not only when
    Redis shows a trace: a flag and a lease may have expired while the worker was down, and the outbox is
    in the store). Returns the jobs queued."""
    conn = redis_client(app.conf.broker_url)
    queued = []
    for job, (flag, ttl) in RESUMABLE.items():
        conn.delete(flag)  # a live worker's flag too, at worst: its job then runs once more and finds nothing
        if queue_once(app, flag, ttl, job):
            queued.append(job)
    return queued


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs) -> None:
    try:
        queued = resume_interrupted_work(sender.app)
    except Exception as exc:  # Redis down at start: beat's catch-up delivery and reconciliation remain
        log.warning("could not look for interrupted work at start-up: %s", exc)
        return
    if queued:
        log.info("worker ready: queued %s to resume interrupted work", ", ".join(queued))
