"""Asking for a crowd participant's tasks (tasks/crowd.request_prepare) on a real Redis, no worker: the page
asks at consent and again if the participant waits; while a job for them is queued, asking again queues
nothing (a burst of arrivals never queues the same work twice), and each participant gets their own."""

from __future__ import annotations

import redis

from sense7.settings import Settings
from tests.jobs.conftest import redis_server  # noqa: F401  (fixture)


def test_a_participants_prepare_job_is_queued_once_until_it_runs(tmp_path, redis_server):
    from sense7.tasks.celery_app import configure
    from sense7.tasks.crowd import prepare_flag, request_prepare
    from sense7.tasks.waiting import queue_depths

    app = configure(Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_REDIS_URL": redis_server.url}))
    assert request_prepare("pilot", "pilot-pa", app=app) is True
    assert request_prepare("pilot", "pilot-pa", app=app) is False  # queued already: nothing more
    assert request_prepare("pilot", "pilot-pb", app=app) is True  # another participant: their own job
    assert queue_depths(app)["sense7.crowd"] == 2
    # The job clears the flag when it ends (done or failed): the next ask queues it again.
    redis.Redis.from_url(redis_server.url).delete(prepare_flag("pilot-pa"))
    assert request_prepare("pilot", "pilot-pa", app=app) is True
    assert queue_depths(app)["sense7.crowd"] == 3
