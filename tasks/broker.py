"""The jobs' Redis, in one place: one client per URL and process, the app with a broker, "queue this job
once", and locks.

"Queue once": a burst of webhooks or rater-page submissions asks for the same drain job many times; a
Redis flag (SET NX with a TTL, renewed by the running job, deleted when it ends) lets the first request
queue it and the rest return at once. A job whose worker dies leaves the flag to expire.
"""

from __future__ import annotations

import redis

from sense7.tasks.celery_app import configure, get_app

_clients: dict[str, redis.Redis] = {}


def redis_client(url: str) -> redis.Redis:
    """This process's client for the Redis at `url` (built once: it holds the connection pool)."""
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=2.0)
    return _clients[url]


def broker_app():
    """This process's jobs app, with a broker (a home's private Redis may have started after it was built)."""
    app = get_app()
    if not app.conf.broker_url:
        # Built before this home's private Redis was started: look again (never start one here).
        from sense7.tasks.redis_local import RedisUnavailable, redis_url

        url = redis_url(app.conf.sense7_settings)
        if not url:
            raise RedisUnavailable("no Redis: set SENSE7_REDIS_URL or start the jobs with `sense7 worker`")
        app = configure(app.conf.sense7_settings, url)
    return app


def enqueue(name: str, args: tuple = (), kwargs: dict | None = None) -> None:
    """Queue a job now or fail now. retry=False: fail at once when Redis is down (the reconciliation catches
    up later); ignore_result: nobody waits for it, and subscribing to its result would tie this process to
    the result backend's connection state."""
    broker_app().send_task(name, args=args, kwargs=kwargs, retry=False, ignore_result=True)


def queue_once(app, flag: str, ttl: int, job: str) -> bool:
    """Queue `job` unless the `flag` says one is queued or running. True when this call queued it.
    The job renews the flag (`conn.expire(flag, ttl)`) while it runs and deletes it when it ends."""
    conn = redis_client(app.conf.broker_url)
    if not conn.set(flag, 1, nx=True, ex=ttl):
        return False
    try:
        app.send_task(job, retry=False, ignore_result=True)
    except Exception:
        conn.delete(flag)  # nothing was queued: let the next request try again
        raise
    return True


def try_lock(conn: redis.Redis, name: str, ttl: float):
    """The lock `name` held for `ttl` s (renew it with `lock.extend` / `lock.reacquire`), or None when
    someone else holds it."""
    lock = conn.lock(name, timeout=ttl, blocking=False)
    return lock if lock.acquire() else None


def release(lock) -> None:
    """Let go of a lock; one that expired meanwhile has nothing to release."""
    try:
        lock.release()
    except Exception:
        pass
