"""A benchmark stopped with SIGTERM (`kill`, `timeout`) stops what it started: its `with Stack(...)` blocks
unwind (scripts/benchkit.py), instead of Python dying and leaving its services running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from benchkit import argument_parser, fresh_home
from sense7.stack import Stack

argument_parser("a benchmark").parse_args([])
cfg = fresh_home("bench-cleanup-")
with Stack(cfg) as stack:
    stack.start_redis()
    print(cfg.home, flush=True)
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not reaped yet) is not running
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_benchmark_stopped_with_sigterm_stops_the_services_it_started():
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    redis = None
    try:
        home = Path(proc.stdout.readline().strip())
        redis = int((home / "redis" / "pid").read_text())
        assert alive(redis)  # the benchmark's own redis-server runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30  # (stop_local_redis waits for it; this only bounds a broken stop)
        while alive(redis) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(redis)
    finally:
        if proc.poll() is None:
            proc.kill()
        if redis is not None and alive(redis):  # (what a broken benchmark left: not this test's to leave)
            os.kill(redis, signal.SIGKILL)
