"""sense7.stack on real processes: services start in order, a stack stops what it started in reverse and
leaves alone what was running before it, and `down()` stops everything of the home."""

from __future__ import annotations

import pytest
import redis
from sense7.tasks.redis_local import running_local_url

from sense7.processes import pid_alive
from sense7.settings import Settings
from sense7.stack import Stack

QUIET_WORKER = ("--without-gossip", "--without-mingle")


def test_a_stack_stops_what_it_started_in_reverse(tmp_path):
    cfg = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home")})
    with Stack(cfg) as stack:
        url = stack.start_redis()
        stack.start_worker(beat=False, concurrency=1, extra_args=QUIET_WORKER)
        worker_pid = stack.worker.pid()
        assert stack.started() == ["Redis", "Celery worker"]
        assert redis.Redis.from_url(url).ping() and pid_alive(worker_pid)
        assert stack.stop() == ["Celery worker", "Redis"]
    assert stack.started() == [] and not pid_alive(worker_pid) and running_local_url(cfg) is None


def test_a_stack_leaves_running_services_alone_and_down_stops_them(tmp_path):
    cfg = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home")})
    first = Stack(cfg)
    url = first.start_redis()
    try:
        with Stack(cfg) as second:
            assert second.start_redis() == url  # the home's running broker, found, not started
            assert second.started() == []
        assert running_local_url(cfg) == url  # still running: the second stack did not start it
        assert Stack(cfg).down() == {"rater page": False, "Celery worker": False, "ML backend": False,
                                     "Redis": True, "Label Studio": False}
        assert running_local_url(cfg) is None
    finally:
        first.stop()


def test_the_stacks_processes_need_its_broker(tmp_path):
    stack = Stack(Settings.from_env({"SENSE7_HOME": str(tmp_path / "home")}))
    with pytest.raises(RuntimeError, match=r"start_redis\(\) first"):
        stack.start_worker()
    assert stack.worker.pid() is None and stack.started() == []
