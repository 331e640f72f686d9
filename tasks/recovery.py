"""What a worker does as it starts: pick up the work a killed worker left half-done, in seconds.

A worker killed with `kill -9` runs none of its clean-up: its "queued or running" flags stay until they
expire (so the submissions and webhooks that arrive meanwhile queue no job), its locks stay until their
lease runs out (seconds: tasks/broker.py), sync entries it had claimed stay in the claimed sets, and its
unacknowledged messages come back only after the broker's visibility timeout (sized to the longest job:
JobSettings.redelivery_timeout). So a starting worker clears the two flags and queues one delivery and one
sync drain at once: the delivery waits out the dead holder's lease and writes every undelivered submission
(idempotently: a retry reads the task before writing), the drain gives the claimed entries back and reads
them into the store. Both are harmless when nothing was left: they find empty sets and an empty outbox.
"""

from __future__ import annotations

import logging

from celery.signals import worker_ready

from sense7.tasks import delivery, sync
from sense7.tasks.broker import queue_once, redis_client

log = logging.getLogger(__name__)


def resume_interrupted_work(app) -> list[str]:
    """Clear the drain flags a dead worker may have left and queue one delivery and one sync drain.
    Returns the jobs queued."""
    from sense7.tasks import names

    conn = redis_client(app.conf.broker_url)
    queued = []
    for flag, ttl, job in ((delivery.SCHEDULED_KEY, delivery.SCHEDULED_TTL, names.DELIVER),
                           (sync.SCHEDULED_KEY, sync.SCHEDULED_TTL, names.SYNC_PENDING)):
        conn.delete(flag)  # a live worker's flag too, at worst: its job then runs once more and finds nothing
        if queue_once(app, flag, ttl, job):
            queued.append(job)
    return queued


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs) -> None:
    try:
        queued = resume_interrupted_work(sender.app)
        log.info("worker ready: queued %s to resume interrupted deliveries and syncs", ", ".join(queued))
    except Exception as exc:  # Redis down at start: beat's catch-up delivery and reconciliation remain
        log.warning("could not queue the resume jobs at start-up: %s", exc)
