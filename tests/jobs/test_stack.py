"""sense7.stack on real processes: services start in order, a stack stops what it started in reverse and
leaves alone what was running before it, and `down()` stops everything of the home."""

from __future__ import annotations

import os

import pytest
import redis
from sense7.tasks.redis_local import running_local_url

from sense7.processes import pid_alive
from sense7.settings import Settings
from sense7.stack import Stack

QUIET_WORKER = ("--without-gossip", "--without-mingle")


@pytest.mark.slow
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
        assert Stack(cfg).down() == {"rater page": False, "Celery worker": False, "Celery beat": False,
                                     "ML backend": False, "Redis": True, "Label Studio": False,
                                     "left-over processes": False}
        assert running_local_url(cfg) is None
    finally:
        first.stop()


def test_the_stacks_processes_need_its_broker(tmp_path):
    stack = Stack(Settings.from_env({"SENSE7_HOME": str(tmp_path / "home")}))
    with pytest.raises(RuntimeError, match=r"start_redis\(\) first"):
        stack.start_worker()
    assert stack.worker.pid() is None and stack.started() == []


@pytest.mark.slow
def test_down_stops_a_worker_started_by_hand_and_a_second_worker_is_refused(tmp_path, redis_server):
    """Issue 23 item 3: `sense7 worker` started from a script (sharing its parent's process group, no pid
    file of the demo's) is stopped by `sense7 down`; a second `sense7 worker` for the home is refused."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from sense7.stack import worker_process

    home = tmp_path / "home"
    env = {**os.environ, "SENSE7_HOME": str(home), "SENSE7_REDIS_URL": redis_server.url}
    sense7 = str(Path(sys.executable).parent / "sense7")
    log = open(tmp_path / "worker.log", "wb")
    hand = subprocess.Popen([sense7, "worker", "--no-beat", "--concurrency", "1"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # same process group as us
    try:
        proc = worker_process(home)
        deadline = time.monotonic() + 60
        while proc.pid() != hand.pid and hand.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.pid() == hand.pid, (tmp_path / "worker.log").read_text()
        second = subprocess.run([sense7, "worker", "--no-beat"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode != 0
        assert f"already running (pid {hand.pid})" in second.stdout + second.stderr
        assert hand.poll() is None  # the refusal left the first one alone
        down = subprocess.run([sense7, "down"], env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "Celery worker: stopped" in down.stdout
        hand.wait(timeout=30)
        assert proc.pid() is None
    finally:
        if hand.poll() is None:
            hand.kill()
            hand.wait(timeout=10)
        log.close()



def _of_home(home) -> list:
    """The running processes whose environment names `home` as their SENSE7_HOME (read with psutil, not with
    sense7's own marker), zombies and this test's own process aside."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE \
                    and proc.environ().get("SENSE7_HOME") == str(home):
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found


def _children_of(pid: int, at_least: int) -> list:
    """The worker's children (its pool and its beat) once it has `at_least` of them."""
    import psutil

    from tests.support.jobs import wait_for

    return wait_for(lambda: [c for c in psutil.Process(pid).children() if c.status() != psutil.STATUS_ZOMBIE]
                    if len(psutil.Process(pid).children()) >= at_least else None, what=f"{at_least} children of {pid}")


@pytest.mark.slow
def test_a_killed_worker_leaves_nothing_behind(tmp_path, redis_server):
    """Issue 37 item 11: the Celery worker's main process killed with SIGKILL leaves its beat (and pool
    children) running, re-parented, in no pid file. `sense7 down` stops them: after a worker the stack
    started, and after one started by hand (sharing this process's group), with another worker started by
    hand in between (which first stops what the killed one left). No process of the home remains."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    from sense7.stack import worker_process
    from tests.support.jobs import wait_for

    home = tmp_path / "home"
    env = {**os.environ, "SENSE7_HOME": str(home), "SENSE7_REDIS_URL": redis_server.url}
    sense7 = str(Path(sys.executable).parent / "sense7")

    def down():
        done = subprocess.run([sense7, "down"], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    hands = []

    def by_hand():
        log = open(tmp_path / f"worker{len(hands)}.log", "wb")
        hands.append((subprocess.Popen([sense7, "worker", "--concurrency", "1"], env=env, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT), log))  # this process's group
        proc = hands[-1][0]
        wait_for(lambda: worker_process(home).pid() == proc.pid or proc.poll() is not None, what="its pid file")
        assert worker_process(home).pid() == proc.pid, (tmp_path / f"worker{len(hands) - 1}.log").read_text()
        return proc, _children_of(proc.pid, 2)  # started: its beat and pool are up

    try:
        # A worker (with beat) the stack started, its main process killed: its beat lives on; down stops it.
        cfg = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_REDIS_URL": redis_server.url})
        stack = Stack(cfg)
        stack.start_redis()
        main = stack.start_worker(beat=True, concurrency=1, extra_args=QUIET_WORKER)
        children = _children_of(main, 2)
        os.kill(main, signal.SIGKILL)
        wait_for(lambda: not pid_alive(main), what="the killed worker gone")
        assert [c for c in children if c.is_running()], "nothing outlived the killed worker: no orphan to stop"
        said = down()
        assert _of_home(home) == [], [p.cmdline() for p in _of_home(home)]
        assert "left-over processes: stopped" in said

        # One started by hand (this process's group) killed, a second started by hand, then down.
        first, children = by_hand()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        assert [c for c in children if c.is_running()]
        second, _ = by_hand()
        assert not [c for c in children if c.is_running()]  # the killed one's leftovers were stopped first
        assert "Celery worker: stopped" in down()
        second.wait(timeout=30)
        assert _of_home(home) == [], [p.cmdline() for p in _of_home(home)]
    finally:
        for hand, log in hands:
            if hand.poll() is None:
                hand.kill()
                hand.wait(timeout=10)
            log.close()
        for proc in _of_home(home):
            proc.kill()
        psutil.wait_procs(_of_home(home), timeout=10)
