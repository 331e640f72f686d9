"""The sync jobs: Celery wrappers around sense7.labelstudio.label_sync.LabelSync (the service that reads
annotations from Label Studio into the store), and `on_event`, the ML backend's webhook hook.

Transient failures (Label Studio down, 5xx) are retried with exponential backoff.
"""

from __future__ import annotations

import logging

from celery import shared_task
from sense7.tasks import names
from sense7.tasks.broker import LEASE_TTL, broker_app, enqueue, queue_once, redis_client, take_lease
from sense7.tasks.cadence import note_new_ratings
from sense7.tasks.celery_app import get_app
from sense7.tasks.runtime import RETRY, Runtime, as_retryable, current_runtime

from sense7.labelstudio.label_sync import LabelSync, SyncResult
from sense7.labelstudio.protocol import WEBHOOK_ACTIONS, parse_annotation_event, webhook_headers

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------
# Celery tasks. Transient failures (Label Studio down, 5xx) are retried with exponential backoff.
#
# Webhooks are coalesced: an event only adds "project:task:annotation" to a Redis set and makes sure one
# drain job (sense7.sync_pending) is queued; that job reads up to 200 tasks with their annotations per
# Label Studio request. A burst of 1,000 events is then a handful of requests, not 2,000, and replayed or
# forged events add nothing but a re-read of what Label Studio holds.

#
# A round claims members: it moves them from the set into its "claimed" twin (one MULTI), reads them into the
# store, and only then removes them from the twin. Only the drain holding the lease lock claims, so whatever
# a drain finds in a twin when it takes the lock was left by a drain whose worker died mid-round: it goes
# back into the set first (recovered in seconds, instead of waiting for the next reconciliation).

PENDING_KEY = "sense7:sync:pending"      # set of "project:task:annotation" named by webhooks
DELETED_KEY = "sense7:sync:deleted"      # set of annotation ids a deletion webhook named
CLAIMED = {PENDING_KEY: "sense7:sync:pending:claimed",   # members a drain is reading into the store
           DELETED_KEY: "sense7:sync:deleted:claimed"}
SCHEDULED_KEY = "sense7:sync:scheduled"  # a drain job is queued or running (expires if its worker dies;
SCHEDULED_TTL = 30                       # renewed while draining; a restarted worker clears it)
LOCK_KEY = "sense7:sync:lock"            # held by the one drain that claims (a lease: tasks/broker.py)
DRAIN_BATCH = 1000                       # set members taken per round


def _run(fn):
    """Run fn(); turn transient errors into LabelStudioUnavailable so autoretry picks them up."""
    try:
        return fn()
    except Exception as exc:
        retryable = as_retryable(exc)
        if retryable is exc:
            raise
        raise retryable from None  # `from None`: the SDK error's text (headers, cookies) stays out of logs


def _count_new(rt: Runtime, result: SyncResult) -> None:
    """New ratings credited to raters count toward the next retrain (tasks/cadence.py decides when)."""
    from sense7.model.registry import ModelRegistry
    from sense7.tasks.cadence import request_retrain

    app = get_app()
    total = note_new_ratings(app.conf.broker_url, result.credited, rt.jobs.retrain_every,
                             ModelRegistry(rt.settings.model_dir, rt.store))
    if total:
        request_retrain(app, f"{total} new annotations", rt.jobs.retrain_min_interval)


def backlog(conn=None) -> dict[str, int]:
    """What the sync has not read yet: annotations named by webhooks, deletions to verify."""
    conn = conn or redis_client(get_app().conf.broker_url)
    return {"pending": len(conn.sunion(PENDING_KEY, CLAIMED[PENDING_KEY])),
            "deleted": len(conn.sunion(DELETED_KEY, CLAIMED[DELETED_KEY]))}


def _schedule_drain(app) -> bool:
    """Queue one drain job unless one is queued or running. True when this call queued it."""
    return queue_once(app, SCHEDULED_KEY, SCHEDULED_TTL, names.SYNC_PENDING)


def claim(conn, key: str, limit: int = DRAIN_BATCH) -> list[str]:
    """Up to `limit` members of `key`, moved into its claimed twin in one transaction: a worker killed
    from here on leaves them in the twin, never nowhere."""
    members = conn.srandmember(key, limit)
    if members:
        conn.pipeline(transaction=True).sadd(CLAIMED[key], *members).srem(key, *members).execute()
    return [m.decode() for m in members]


def unclaim(conn, key: str, members: list[str]) -> None:
    """Members read into the store: out of the claimed twin."""
    if members:
        conn.srem(CLAIMED[key], *members)


def give_back(conn, key: str, members: list[str] | None = None) -> int:
    """Claimed members (all of them when None: a dead drain's) back into `key`, for the next round."""
    claimed = CLAIMED[key]
    if members is None:
        members = conn.smembers(claimed)
    if not members:
        return 0
    conn.pipeline(transaction=True).sadd(key, *members).srem(claimed, *members).execute()
    return len(members)


def drain_pending(rt: Runtime, conn) -> SyncResult:
    """Read everything the webhooks named, round after round, until the sets are empty. The caller holds
    LOCK_KEY (the only drain that claims)."""
    syncer = None  # built at the first claim: a drain that finds nothing touches no Label Studio
    total = SyncResult()
    for key in CLAIMED:
        if recovered := give_back(conn, key):
            log.warning("recovered %d sync entries a stopped drain had claimed", recovered)
    while True:
        pending, deleted = claim(conn, PENDING_KEY), claim(conn, DELETED_KEY)
        if not pending and not deleted:
            return total
        try:
            syncer = syncer or LabelSync.from_runtime(rt)
            named = [tuple(int(x) for x in member.split(":")) for member in pending]
            syncer.sync_named(named, [int(a) for a in deleted], total)
        except BaseException:
            # Put them back for the retry (the reconciliation would catch them up anyway).
            give_back(conn, PENDING_KEY, pending)
            give_back(conn, DELETED_KEY, deleted)
            raise
        unclaim(conn, PENDING_KEY, pending)
        unclaim(conn, DELETED_KEY, deleted)


@shared_task(name=names.SYNC_PENDING, **RETRY)
def sync_pending_task() -> dict:
    rt = current_runtime()
    app = get_app()
    conn = redis_client(app.conf.broker_url)
    # Waiting one lease (and a little) takes over the lock of a worker killed mid-drain, not a live one's.
    lease = take_lease(conn, LOCK_KEY, LEASE_TTL, wait=LEASE_TTL + 1, keep_alive={SCHEDULED_KEY: SCHEDULED_TTL})
    if lease is None:  # the drain that holds it loops until the sets are empty
        return {**SyncResult().as_dict(), "skipped": "another drain is running"}
    try:
        # On failure the flag stays (and expires): the retry of this job drains what was put back.
        result = _run(lambda: drain_pending(rt, conn))
    finally:
        lease.release()
    conn.delete(SCHEDULED_KEY)
    # An event that arrived after the last round but saw the flag still set: drain it too.
    if conn.scard(PENDING_KEY) or conn.scard(DELETED_KEY):
        _schedule_drain(app)
    _count_new(rt, result)
    if result.invalid:
        log.warning("sync skipped %d invalid annotations, first: %s", len(result.invalid), result.invalid[0])
    return result.as_dict()


@shared_task(name=names.SYNC_ANNOTATION, **RETRY)
def sync_annotation_task(annotation_id: int) -> dict:
    rt = current_runtime()
    result = _run(lambda: LabelSync.from_runtime(rt).sync_annotation(int(annotation_id)))
    _count_new(rt, result)
    return result.as_dict()


@shared_task(name=names.DELETE_ANNOTATIONS, **RETRY)
def delete_annotations_task(annotation_ids: list[int]) -> dict:
    rt = current_runtime()
    return _run(lambda: LabelSync.from_runtime(rt).delete_annotations(annotation_ids)).as_dict()


@shared_task(name=names.RECONCILE, bind=True, **RETRY)
def reconcile_task(self) -> dict:
    rt = current_runtime()

    def work():
        syncer = LabelSync.from_runtime(rt)
        # Re-registering is one list call per project and heals a webhook someone deleted.
        syncer.ensure_webhooks(f"{rt.settings.backend_url}/webhook", webhook_headers(rt.settings))
        return syncer.reconcile()

    result = _run(work)
    _count_new(rt, result)
    if result.invalid:
        log.warning("reconcile skipped %d invalid annotations, first: %s", len(result.invalid), result.invalid[0])
    return {**result.as_dict(), "retries": self.request.retries}


def on_event(action: str, payload: dict) -> dict:
    """The ML backend's /webhook calls this: it only notes what changed (never touches Label Studio or the
    store), so the webhook answers well within Label Studio's 1 s timeout. An event carries no authority:
    it only names annotations for the drain job to re-read from Label Studio. Returns what was noted and
    whether a drain job was queued; raises MalformedEvent (400) for a payload that names no annotation,
    and a broker error (503) when Redis is unreachable."""
    if action in WEBHOOK_ACTIONS:
        event = parse_annotation_event(action, payload)
        app = broker_app()
        conn = redis_client(app.conf.broker_url)
        if event.deletes:
            conn.sadd(DELETED_KEY, *[str(a) for a, _ in event.annotations])
        else:
            project = event.project
            members = [f"{project}:{task}:{a}" for a, task in event.annotations
                       if project is not None and task is not None]
            if members:
                conn.sadd(PENDING_KEY, *members)
            # An event without its task or project (not what Label Studio sends): verify it on its own.
            for annotation, task in event.annotations:
                if project is None or task is None:
                    enqueue(names.SYNC_ANNOTATION, (int(annotation),))
        queued = _schedule_drain(app)
        return {"enqueued": [names.SYNC_PENDING] if queued else [], "annotations": [a for a, _ in event.annotations]}
    if action == "START_TRAINING":
        # Only reaches here with the backend's basic auth (ml_backend/app.py): Label Studio's "Start training".
        enqueue(names.RETRAIN, kwargs={"reason": "START_TRAINING"})
        return {"enqueued": [names.RETRAIN]}
    return {"enqueued": []}
