"""Fixtures for the jobs tests: a private redis-server, real Celery worker processes, the ML backend
(gunicorn, wired to the jobs) and a per-test stack environment on top of the session's Label Studio.

Everything runs as real processes on free ports; nothing is mocked.
"""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from sense7.tasks.redis_local import start_redis_server

from sense7.processes import free_port
from sense7.settings import BACKEND_HOST
from tests.jobs.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
_counter = itertools.count(1)


@dataclass
class RedisHandle:
    directory: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc, _ = start_redis_server(self.directory, self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis-server flushes its AOF and exits
            self.proc.wait(timeout=20)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path) -> RedisHandle:
    handle = RedisHandle(tmp_path / "redis", free_port())
    handle.start()
    yield handle
    handle.stop()


class Proc:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict, log_path: Path):
        self.name, self.args, self.env, self.log_path = name, args, env, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Proc":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (worker and its pool children): no cleanup runs."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> None:
        if not self.alive():
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except FileNotFoundError:
            return ""


@dataclass
class JobStack:
    """One test's stack: own Label Studio projects, store, model dir and Redis; processes on demand."""

    env: dict
    tmp: Path
    redis: RedisHandle
    procs: list[Proc] = field(default_factory=list)
    backend_url: str | None = None

    def start_worker(self, name: str = "worker", beat: bool = False, extra_env: dict | None = None) -> Proc:
        args = [str(VENV_BIN / "celery"), "-A", "sense7.tasks.celery_app:app", "worker", "--pool", "prefork",
                "--concurrency", "1", "--loglevel", "INFO", "--hostname", f"{name}-{next(_counter)}@%h",
                "--without-gossip", "--without-mingle"]
        if beat:
            args += ["--beat", "--schedule", str(self.tmp / f"{name}-beat-schedule")]
        proc = Proc(name, args, {**self.env, **(extra_env or {})}, self.tmp / f"{name}.log").start()
        self.procs.append(proc)
        celery = self.celery()
        try:
            wait_for(lambda: proc.alive() and celery.control.ping(timeout=0.5), timeout=90,
                     what=f"worker {name} to answer ping")
        except AssertionError:
            raise AssertionError(f"worker {name} did not start:\n{proc.log()}") from None
        return proc

    def start_backend(self) -> Proc:
        port = int(self.env["SENSE7_BACKEND_PORT"])
        # The backend's own entry point, wired to the jobs the way docker-compose wires it.
        args = [str(VENV_BIN / "gunicorn"), "--config", str(REPO / "ml_backend" / "gunicorn_conf.py"),
                "--workers", "1", "--bind", f"{BACKEND_HOST}:{port}", "sense7.ml_backend.wsgi:app_from_env()"]
        env = {**self.env, "SENSE7_BACKEND_ON_EVENT": "sense7.tasks.sync:on_event"}
        proc = Proc("backend", args, env, self.tmp / "backend.log").start()
        self.procs.append(proc)
        self.backend_url = f"http://{BACKEND_HOST}:{port}"

        def up():
            if not proc.alive():
                raise AssertionError(f"backend exited:\n{proc.log()}")
            try:
                return requests.get(f"{self.backend_url}/health", auth=self.backend_auth, timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, timeout=90, what="ML backend /health")
        return proc

    @property
    def backend_auth(self) -> tuple[str, str]:
        return self.env["SENSE7_BACKEND_USER"], self.env["SENSE7_BACKEND_PASSWORD"]

    def celery(self):
        """A Celery client on this stack's broker (the test process's own, not sense7.tasks.celery_app.app)."""
        from celery import Celery

        if not hasattr(self, "_celery"):
            self._celery = Celery("sense7-test", broker=self.redis.url, backend=self.redis.url)
        return self._celery

    def run(self, task: str, timeout: float = 300.0, **kwargs):
        """Enqueue a job on the stack's worker and wait for its result."""
        return self.celery().send_task(task, kwargs=kwargs).get(timeout=timeout)

    def runtime(self):
        """A Runtime with this stack's settings, for reading the store / registry from the test."""
        from sense7.tasks.runtime import Runtime

        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            return Runtime.from_env()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        if hasattr(self, "_celery"):
            self._celery.close()


@pytest.fixture
def job_stack(label_studio, redis_server, tmp_path) -> JobStack:
    """Environment for one test's processes: the session's Label Studio, a fresh store and model dir,
    its own two Label Studio projects (unique titles), this test's Redis."""
    # A random part too: this fixture is imported by other folders' conftests, and a module imported
    # twice would count from 1 again and hand a later test a project that already has annotations.
    n = f"{next(_counter)}-{secrets.token_hex(3)}"
    backend_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env.update(label_studio.settings_env())
    env.update({
        "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
        "SENSE7_MODEL_DIR": str(tmp_path / "models"),
        "SENSE7_REDIS_URL": redis_server.url,
        "SENSE7_BACKEND_PORT": str(backend_port),
        "SENSE7_BACKEND_URL": f"http://{BACKEND_HOST}:{backend_port}",
        "SENSE7_BACKEND_USER": "sense7-test",
        "SENSE7_BACKEND_PASSWORD": secrets.token_hex(12),
        "SENSE7_RATING_PROJECT_TITLE": f"jobs rating {n} {os.getpid()}",
        "SENSE7_PROFILE_PROJECT_TITLE": f"jobs profile {n} {os.getpid()}",
        # Fast retries so fault tests recover in seconds (production default: 2 s doubling to 300 s).
        "SENSE7_RETRY_BACKOFF": "1",
        "SENSE7_RETRY_BACKOFF_MAX": "4",
        "SENSE7_MAX_RETRIES": "20",
        "SENSE7_RETRAIN_EVERY": "0",
        "SENSE7_PREANNOTATE_AFTER_PROMOTE": "0",
        "PYTHONUNBUFFERED": "1",
    })
    stack = JobStack(env, tmp_path, redis_server)
    yield stack
    stack.close()
