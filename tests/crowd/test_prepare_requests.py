"""Asking for crowd participants' tasks (tasks/crowd.request_prepare) on a real Redis, no worker: the page
asks at consent and again if the participant waits; one job works for everyone waiting, so while it is
queued or running a burst of arrivals (the same participant or others) queues nothing more."""

from __future__ import annotations

import redis

from sense7.settings import Settings


def test_one_prepare_job_is_queued_for_a_burst_of_participants(tmp_path, redis_server):
    from sense7.tasks.celery_app import configure
    from sense7.tasks.crowd_jobs import SCHEDULED_KEY, request_prepare
    from sense7.tasks.waiting import queue_depths

    app = configure(Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_REDIS_URL": redis_server.url}))
    assert request_prepare("pilot", "pilot-pa", app=app) is True
    assert request_prepare("pilot", "pilot-pa", app=app) is False  # queued already: nothing more
    assert request_prepare("pilot", "pilot-pb", app=app) is False  # another participant: the same job takes them
    assert queue_depths(app)["sense7.crowd"] == 1
    # The job clears the flag when it ends (done or failed): the next ask queues it again.
    redis.Redis.from_url(redis_server.url).delete(SCHEDULED_KEY)
    assert request_prepare("pilot", "pilot-pc", app=app) is True
    assert queue_depths(app)["sense7.crowd"] == 2
