"""One test's stack: a private redis-server and the processes a test starts on it (workers, the ML backend),
each a ManagedProcess stopped in reverse. The fixtures that build them are in tests/conftest.py."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sense7.processes import ManagedProcess
from sense7.settings import BACKEND_HOST
from sense7.stack import worker_command, worker_process
from sense7.tasks.redis_local import start_redis_server

REPO = Path(__file__).resolve().parents[2]


VENV_BIN = Path(sys.executable).parent


stack_counter = itertools.count(1)


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


@dataclass
class JobStack:
    """One test's stack: own Label Studio projects, store, model dir and Redis; processes on demand, each a
    ManagedProcess with its pid file and log under the test's tmp folder, stopped in reverse at the end."""

    env: dict
    tmp: Path
    redis: RedisHandle
    procs: list[ManagedProcess] = field(default_factory=list)
    backend_url: str | None = None

    def start(self, proc: ManagedProcess, cmd: list[str], env: dict) -> ManagedProcess:
        self.procs.append(proc)
        proc.start(cmd, env, cwd=REPO)  # waits until healthy; the error carries the log's tail
        return proc

    def start_worker(self, name: str = "worker", beat: bool = False, extra_env: dict | None = None) -> ManagedProcess:
        """A worker as sense7.stack starts one (concurrency 1, its own host name), healthy when it answers a
        ping on this stack's broker."""
        cmd = worker_command(self.tmp / f"{name}-beat-schedule" if beat else None, concurrency=1, loglevel="INFO",
                             extra_args=("--pool", "prefork", "--hostname", f"{name}-{next(stack_counter)}@%h",
                                         "--without-gossip", "--without-mingle"))
        return self.start(worker_process(self.tmp, name, app=self.celery()), cmd, {**self.env, **(extra_env or {})})

    def start_backend(self) -> ManagedProcess:
        port = int(self.env["SENSE7_BACKEND_PORT"])
        # The backend's own entry point, wired to the jobs the way docker-compose wires it.
        args = [str(VENV_BIN / "gunicorn"), "--config", str(REPO / "ml_backend" / "gunicorn_conf.py"),
                "--workers", "1", "--bind", f"{BACKEND_HOST}:{port}", "sense7.ml_backend.wsgi:app_from_env()"]
        env = {**self.env, "SENSE7_BACKEND_ON_EVENT": "sense7.tasks.sync:on_event"}
        self.backend_url = f"http://{BACKEND_HOST}:{port}"

        def up() -> bool:
            try:
                return requests.get(f"{self.backend_url}/health", auth=self.backend_auth, timeout=1).status_code == 200
            except requests.RequestException:
                return False

        return self.start(ManagedProcess("backend", self.tmp, up, startup_timeout=90), args, env)

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
