"""The jobs' Redis, in one place: one client per URL and process, the app with a broker, "queue this job
once", and locks.

"Queue once": a burst of webhooks or rater-page submissions asks for the same drain job many times; a
Redis flag (SET NX with a TTL, renewed by the running job, deleted when it ends) lets the first request
queue it and the rest return at once. A job whose worker dies leaves the flag to expire.

Locks are leases (`take_lease`): a few seconds' TTL renewed by a thread of the holding process, so a lock
dies with its holder (`kill -9` included) within one lease, and the next job takes it over in seconds
instead of waiting out a TTL sized to the longest job.
"""

from __future__ import annotations

import logging
import threading

import redis

from sense7.tasks.celery_app import configure, get_app

log = logging.getLogger(__name__)

_clients: dict[str, redis.Redis] = {}

LEASE_TTL = 10.0  # (s) a lock outlives a dead holder by at most this; renewed every third of it


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


def queue_once(app, flag: str, ttl: int, job: str, args: tuple = ()) -> bool:
    """Queue `job` (with `args`) unless the `flag` says one is queued or running. True when this call queued
    it. The job renews the flag (`conn.expire(flag, ttl)`) while it runs and deletes it when it ends."""
    conn = redis_client(app.conf.broker_url)
    if not conn.set(flag, 1, nx=True, ex=ttl):
        return False
    try:
        app.send_task(job, args=list(args), retry=False, ignore_result=True)
    except Exception:
        conn.delete(flag)  # nothing was queued: let the next request try again
        raise
    return True


def release(lock) -> None:
    """Let go of a lock; one that expired meanwhile has nothing to release."""
    try:
        lock.release()
    except Exception:
        pass


class Lease:
    """A held Redis lock whose short TTL a daemon thread of this process renews every ttl/3 s (and the TTL of
    the `keep_alive` keys with it, such as a "queued or running" flag): while the process lives the lock
    stays; when it dies, however abruptly, the renewals stop and the lock expires within `ttl` s."""

    def __init__(self, conn: redis.Redis, lock, ttl: float, keep_alive: dict[str, int] | None = None):
        self.conn, self.lock, self.ttl, self.keep_alive = conn, lock, ttl, dict(keep_alive or {})
        self.lost = False  # set when a renewal found the lock gone (expired while Redis was unreachable)
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._renew, name=f"lease {lock.name}", daemon=True)
        self._keeper.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.lock.reacquire()
                for key, key_ttl in self.keep_alive.items():
                    self.conn.expire(key, key_ttl)
            except redis.exceptions.LockNotOwnedError:
                self.lost = True
                log.warning("lost the lock %s (not renewed in time)", self.lock.name)
                return
            except Exception as exc:  # Redis unreachable for a moment: try again at the next renewal
                log.warning("could not renew the lock %s: %s", self.lock.name, exc)

    def release(self) -> None:
        self._stop.set()
        self._keeper.join(timeout=5)
        release(self.lock)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take_lease(conn: redis.Redis, name: str, ttl: float = LEASE_TTL, wait: float = 0.0,
               keep_alive: dict[str, int] | None = None) -> Lease | None:
    """The lock `name` as a Lease, or None when someone else holds it after `wait` s. A `wait` just over
    `ttl` takes over the lock of a holder that died (its lease runs out) but not of one that lives.
    `keep_alive`: key -> TTL (s) set again at each renewal, for as long as the lease is held."""
    # thread_local=False: the token must be visible to the renewing thread (redis-py keeps it per thread
    # by default, and a renewal from another thread then fails as "an unlocked lock").
    lock = conn.lock(name, timeout=ttl, blocking=wait > 0, blocking_timeout=wait or None, thread_local=False)
    if not lock.acquire():
        return None
    return Lease(conn, lock, ttl, keep_alive)


def lease_or_ask_again(app, conn: redis.Redis, lock: str, flag: str, flag_ttl: int, job: str, later: float,
                       ttl: float = LEASE_TTL) -> Lease | None:
    """The lock of a job that loops over shared work (delivery, crowd preparation) as a Lease whose
    renewals keep the job's "queued" `flag` up, or None when another job holds it. Then this job is asked
    for again `later` s on (the flag kept up meanwhile) rather than waiting for the lock: a wait would hold
    one of the worker's few processes while other jobs queue behind it. Only the holder does the work, so
    nothing is done twice however many of these run."""
    lease = take_lease(conn, lock, ttl, keep_alive={flag: flag_ttl})
    if lease is None:
        conn.set(flag, 1, ex=flag_ttl)
        app.send_task(job, countdown=later, retry=False, ignore_result=True)
    return lease
