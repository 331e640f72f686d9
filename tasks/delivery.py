"""The rater page's jobs. Copying raters' queues from Label Studio (`refresh_queues`: the job's wiring
around sense7.labelstudio.rater_accounts.copy_queues, run by `sense7 raters invite`, the demo and beat
every SENSE7_RATER_QUEUE_INTERVAL s), so that opening a link reads the store only.

Delivery of rater-page submissions to Label Studio: the outbox (sense7.store.rater_page_tables) drained into
annotations written as each rater's attribution account (sense7.labelstudio.rater_accounts).

The rater page stores a submission and calls `request_delivery`: like the sync, one drain job is queued
however many raters submit at once (a Redis flag), and it loops until the outbox is empty. When Label
Studio is down the job fails, is retried with backoff, and the periodic `sense7.deliver_submissions` in
beat's schedule catches up anything left; the rater saw "saved" long before, because the submission was
already durable in the store. Delivering is idempotent per (rater, task): the newest revision is written
by creating the rater's annotation or updating the one their account already has, never a second one.
The annotation then reaches the store through the ordinary webhook -> sync path.
"""

from __future__ import annotations

import logging

from celery import shared_task
from sense7.tasks import names
from sense7.tasks.broker import LEASE_TTL, lease_or_ask_again, queue_once, redis_client
from sense7.tasks.celery_app import get_app
from sense7.tasks.runtime import RETRY, Runtime, as_retryable, current_runtime, describe_error, transient

log = logging.getLogger(__name__)

SCHEDULED_KEY = "sense7:deliver:scheduled"  # a delivery job is queued or running (renewed while it runs;
SCHEDULED_TTL = 30                          # after a crash the restarted worker clears it: tasks/recovery.py)
LOCK_KEY = "sense7:deliver:lock"  # held by the one delivery job that runs (beat's and a requested one may
                                  # both be queued: two at once would both write the same submissions)
LOCK_TTL = LEASE_TTL              # a lease renewed while its holder lives (tasks/broker.py): a killed
                                  # worker's lock is gone within it (a job finding it held asks again: deliver_task)


def request_delivery(app=None) -> bool:
    """Queue one delivery job unless one is queued or running. True when this call queued it."""
    return queue_once(app or get_app(), SCHEDULED_KEY, SCHEDULED_TTL, names.DELIVER)


def deliver_outbox(rt: Runtime, parallel: int = 4, on_round=None) -> dict:
    """Write every undelivered submission to Label Studio, `parallel` at a time (each a different
    (rater, task), so they never touch the same annotation). A transient error (Label Studio down) is
    raised after the batch, so the job is retried; a refusal (a task deleted by staff, say) is recorded on
    the submission, which stays in the outbox. Returns counts."""
    from concurrent.futures import ThreadPoolExecutor

    from sense7.store.rater_page_tables import Outbox
    from sense7.labelstudio.rater_accounts import ensure_accounts, write_annotation

    outbox, accounts = Outbox(rt.store), rt.rater_accounts
    delivered = failed = 0

    def deliver(row: dict):
        rater = row["rater_id"]
        known = outbox.annotation_of(rater, row["task_id"])
        check = row["attempts"] > 0  # an earlier attempt may have created it before failing
        outbox.mark_attempt(row["key"])
        try:
            annotation = write_annotation(rt.client, row["task_id"], accounts[rater], row["result"],
                                          row["lead_time"], known=known, check=check)
        except Exception as exc:
            outbox.mark_failed(row["key"], describe_error(exc))
            if not transient(exc):  # an account deleted by staff, say: look it up (or make it) again next time
                accounts.pop(rater, None)
            return exc
        outbox.mark_delivered(rater, row["task_id"], row["revision"], annotation)
        return None

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        while True:
            if on_round:
                on_round()
            batch = outbox.undelivered(limit=200)
            if not batch:
                break
            try:
                missing = {row["rater_id"] for row in batch} - set(accounts)
                if missing:
                    accounts.update(ensure_accounts(rt.client, rt.store, sorted(missing)))
            except Exception as exc:
                raise as_retryable(exc) from None
            errors = [e for e in pool.map(deliver, batch) if e is not None]
            delivered += len(batch) - len(errors)
            retry = next((e for e in errors if transient(e)), None)
            if retry is not None:
                raise as_retryable(retry) from None
            failed = len(errors)
            for exc in errors:
                log.warning("a submission was not delivered: %s", describe_error(exc))
            if len(errors) == len(batch):  # only refused submissions left: stop instead of looping on them
                break
    return {"delivered": delivered, "failed": failed}


def refresh_queues(rt: Runtime, rater_ids=None) -> int:
    """Copy the queues of raters with an active link (or of `rater_ids`) from Label Studio into the store:
    one pass over both projects. Returns the raters refreshed."""
    from sense7.store.rater_page_tables import LinkBook
    from sense7.labelstudio.rater_accounts import copy_queues

    raters = sorted(rater_ids if rater_ids is not None else LinkBook(rt.store).active())
    if not raters:
        return 0
    try:
        return copy_queues(rt.client, rt.store, rt.rating_project, rt.profile_project, rt.taxonomy, raters)
    except Exception as exc:
        raise as_retryable(exc) from None


@shared_task(name=names.REFRESH_QUEUES, **RETRY)
def refresh_queues_task() -> dict:
    return {"raters": refresh_queues(current_runtime())}


HELD_RETRY = 1.0  # (s) a job that found the lock held runs again this much later (see deliver_task)


@shared_task(name=names.DELIVER, **RETRY)
def deliver_task() -> dict:
    rt = current_runtime()
    app = get_app()
    conn = redis_client(app.conf.broker_url)
    lease = lease_or_ask_again(app, conn, LOCK_KEY, SCHEDULED_KEY, SCHEDULED_TTL, names.DELIVER, HELD_RETRY, LOCK_TTL)
    if lease is None:
        # Another job holds the lock: its loop delivers what is in the outbox, unless it is past its last
        # look (or its worker died, and the lease runs out within LOCK_TTL).
        return {"delivered": 0, "failed": 0, "skipped": "another delivery job holds the lock; asked again"}
    try:
        result = deliver_outbox(rt)
    finally:
        conn.delete(SCHEDULED_KEY)  # a retry (or beat) picks up what is left
        lease.release()
    # A submission stored after the last round saw the flag still set and queued nothing: deliver it too
    # (also after a round that delivered nothing: the submission may have come in just after it looked).
    from sense7.store.rater_page_tables import Outbox

    if Outbox(rt.store).counts()["undelivered"] > result["failed"]:
        request_delivery()
    return result
