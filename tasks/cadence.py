"""When to retrain: a counter of ratings stored since the last retrain, kept in Redis so every worker
process shares it. Sync adds to it; a finished retrain resets it. (Its own module, so that the sync
and training jobs need not know each other.)

The threshold grows with the data: max(SENSE7_RETRAIN_EVERY, 10% of the items the served version was
trained on), so a study with 10,000 rated turns does not retrain after every 200 new ones. A requested
retrain is queued once (not once per sync job) and never sooner than SENSE7_RETRAIN_MIN_INTERVAL seconds
after the previous retrain finished.
"""

from __future__ import annotations

import math
import time

from sense7.tasks.broker import redis_client

NEW_RATINGS_KEY = "sense7:new-annotations-since-retrain"
REQUESTED_KEY = "sense7:retrain:requested"   # a triggered retrain is queued (cleared when it runs)
LAST_KEY = "sense7:retrain:finished-at"      # unix time the last retrain finished


def retrain_threshold(every: int, n_train_items: int | None) -> int:
    return max(every, math.ceil(0.1 * (n_train_items or 0)))


def _served_items(registry) -> int | None:
    if registry is None:
        return None
    current = registry.current()
    if current is None:
        return None
    try:
        return int((registry.metrics(current) or {}).get("n_train_items") or 0)
    except Exception:  # unreadable metrics: fall back to the fixed threshold
        return None


def note_new_ratings(redis_url: str, count: int, every: int, registry=None) -> int | None:
    """Add `count` new ratings; returns the total when it reached the threshold (and resets it), else None."""
    if not every or not count:
        return None
    conn = redis_client(redis_url)
    total = conn.incrby(NEW_RATINGS_KEY, count)
    if total < retrain_threshold(every, _served_items(registry)):
        return None
    conn.set(NEW_RATINGS_KEY, 0)
    return int(total)


def request_retrain(app, reason: str, min_interval: float) -> bool:
    """Queue one retrain for `reason` unless one is already queued; it starts no sooner than
    `min_interval` seconds after the last one finished. True when this call queued it."""
    from sense7.tasks import names

    conn = redis_client(app.conf.broker_url)
    last = float(conn.get(LAST_KEY) or 0)
    wait = max(0.0, last + min_interval - time.time())
    if not conn.set(REQUESTED_KEY, reason, nx=True, ex=int(wait) + 3600):
        return False
    app.send_task(names.RETRAIN, kwargs={"reason": reason}, countdown=wait)
    return True


def retrain_finished(redis_url: str, trained: bool = True) -> None:
    """A retrain ran: the next trigger may queue another; a real one restarts the count and the interval."""
    conn = redis_client(redis_url)
    if trained:
        conn.set(NEW_RATINGS_KEY, 0)
        conn.set(LAST_KEY, time.time())
    conn.delete(REQUESTED_KEY)

