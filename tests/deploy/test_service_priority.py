"""The deployment's CPU priority (sense7.deployment.SERVICE_NICE): the background services (the ML backend, the
workers, beat) run below the rater pages, as docker-compose.yml's `cpu_shares` make them (tests/jobs/test_compose.py
holds the file to the same list). A real beat is started the deployment's way and its process is asked its
priority (relative to this process's: `nice -n`); the rater pages keep the deployment's own."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sense7.deployment import BACKGROUND_NICE, SERVICE_NICE, SHARED_SETTINGS, service_process, stop_process
from sense7.processes import niced


def running(pid: int) -> list[str]:
    """The process's command line, once `nice` has handed over to the service ([] until then)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if words and words[0] and Path(words[0].decode()).name != "nice":
            return [w.decode() for w in words if w]
        time.sleep(0.05)
    return []


def test_beat_runs_at_the_background_priority_and_the_pages_at_the_default_one(tmp_path, redis_server):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SENSE7_", "CELERY_"))}
    env.update({key: "not-used-here" for key in SHARED_SETTINGS}, SENSE7_REDIS_URL=redis_server.url,
               SENSE7_STORE_URL=f"sqlite:///{tmp_path / 'store.sqlite'}", SENSE7_HOME=str(tmp_path / "host-beat"))
    beat = service_process("beat", env, tmp_path / "beat.log")
    try:
        command = running(beat.pid)
        assert "beat" in command, command
        # `nice -n` is relative to the deployment's own priority (capped at 19, the lowest): run at 0, beat is at 10.
        assert beat.args[:3] == ["nice", "-n", str(BACKGROUND_NICE)] and BACKGROUND_NICE > 0
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, beat.pid) == min(19, own + BACKGROUND_NICE)
    finally:
        stop_process(beat)
    assert {service for service, nice in SERVICE_NICE.items() if nice} == {"ml-backend", "worker", "beat"}
    assert SERVICE_NICE["rater-page"] == SERVICE_NICE["rater-page-2"] == 0
    assert niced(["gunicorn"], 0) == ["gunicorn"]
