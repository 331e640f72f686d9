"""When to retrain: a counter of ratings stored since the last retrain, kept in Redis so every worker
process shares it. Sync adds to it; a finished retrain resets it. (Its own module, so that the sync
and training jobs need not know each other.)"""

from __future__ import annotations

import redis

NEW_RATINGS_KEY = "sense7:new-annotations-since-retrain"


def note_new_ratings(redis_url: str, count: int, every: int) -> int | None:
    """Add `count` new ratings; returns the total when it reached `every` (and resets it), else None."""
    if not every or not count:
        return None
    conn = redis.Redis.from_url(redis_url)
    total = conn.incrby(NEW_RATINGS_KEY, count)
    if total < every:
        return None
    conn.set(NEW_RATINGS_KEY, 0)
    return int(total)


def reset_new_ratings(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).set(NEW_RATINGS_KEY, 0)
