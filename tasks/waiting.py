"""Waiting for a job (the demo, scripts) and, when giving up, saying what was waited for and why it may
be late: the depth of every sense7 queue, the sync backlog the webhooks noted, what the workers are
running now, and which log to read. Never a bare "TimeoutError"."""

from __future__ import annotations

from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import AsyncResult
from sense7.tasks.celery_app import QUEUES, get_app


class JobWaitTimeout(RuntimeError):
    """A job did not finish in time; the message says what, the queues' state and where to look."""


def queue_depths(app=None) -> dict[str, int]:
    """Jobs waiting in each sense7 queue (and Celery's default one), read from the Redis broker."""
    from sense7.tasks.broker import redis_client

    app = app or get_app()
    conn = redis_client(app.conf.broker_url)
    # With the Redis transport a queue is a list named after it (priority steps would add suffixed keys,
    # which sense7 does not configure).
    return {queue: int(conn.llen(queue)) for queue in [*sorted(set(QUEUES.values())), "celery"]}


def running_jobs(app=None, timeout: float = 1.0) -> list[str]:
    """Names of the jobs the workers are executing now (empty when no worker answers within `timeout`)."""
    app = app or get_app()
    try:
        active = app.control.inspect(timeout=timeout).active() or {}
    except Exception:  # broker unreachable: the depths line says so already
        return []
    return sorted(job.get("name", "?") for jobs in active.values() for job in jobs)


def describe_state(app=None) -> str:
    """One line: queue depths, the sync backlog and running jobs, for a message that gives up."""
    from sense7.tasks.sync import backlog

    app = app or get_app()
    try:
        depths = queue_depths(app)
        pending = backlog()
    except Exception as exc:  # the broker itself is the problem: say that instead
        return f"the broker could not be read ({type(exc).__name__}: {exc})"
    queues = ", ".join(f"{name} {n}" for name, n in depths.items())
    running = running_jobs(app)
    return (f"queued jobs: {queues}; sync backlog: {pending['pending']} annotations named by webhooks, "
            f"{pending['deleted']} deletions; running: {', '.join(running) if running else 'nothing (is a worker up?)'}")


def wait_for_job(result: AsyncResult, what: str, timeout: float, log_hint: str) -> dict:
    """The job's return value, or JobWaitTimeout naming `what`, the queues' state and `log_hint`."""
    try:
        return result.get(timeout=timeout)
    except CeleryTimeout:
        raise JobWaitTimeout(f"gave up after {timeout:.0f} s waiting for {what} (job {result.id}); "
                             f"{describe_state(result.app)}; read {log_hint}") from None
