"""The services of one SENSE7_HOME as one stack: Label Studio, a Redis broker, the ML backend, the Celery
worker (with beat) and the rater page, started in that order and stopped in reverse.

`sense7 demo`, `sense7 down` and the benchmark scripts start and stop services only through here, and the
test fixtures start their workers with the same command (`worker_command`, `worker_process`). A `Stack`
remembers what *it* started: `stop()` (or leaving its `with` block) stops exactly that, last first, and
leaves alone a service that was already running (a developer's own Label Studio, say); `down()` stops
every service of the home, whoever started it.

Every process is a `sense7.processes.ManagedProcess` (pid file and log under SENSE7_HOME, its own process
group, a health check to wait on) and carries its home in its environment, as do its children: `down()`
ends by stopping whatever of the home is still running (the orphans of a worker killed with SIGKILL), and a
worker starting where the last one was killed first stops that one's leftovers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sense7.labelstudio.label_studio_process import LabelStudioServer
from sense7.ml_backend.backend_process import BackendServer
from sense7.processes import ManagedProcess, ServiceStatus, stop_home_processes
from sense7.rater_page.rater_page_process import RaterPageServer
from sense7.settings import Settings

WORKER_NAME = "celery-worker"
LEFTOVERS = "left-over processes"  # down()'s name for what no pid file named


def worker_command(beat_schedule: Path | None = None, concurrency: int = 2, loglevel: str = "info",
                   extra_args: Sequence[str] = ()) -> list[str]:
    """The Celery worker's command line (with beat when `beat_schedule` names its schedule file)."""
    cmd = [sys.executable, "-m", "celery", "-A", "sense7.tasks.celery_app:app", "worker"]
    if beat_schedule:
        cmd.append("--beat")
    cmd += ["--concurrency", str(concurrency), "--loglevel", loglevel]
    if beat_schedule:
        cmd += ["--schedule", str(beat_schedule)]
    return cmd + list(extra_args)


def worker_process(home: Path, name: str = WORKER_NAME, app=None, startup_timeout: float = 90) -> ManagedProcess:
    """A Celery worker as a background process of `home`; healthy when it answers a ping through `app`
    (default: sense7's Celery app, configured for the stack's broker)."""

    def healthy() -> bool:
        from sense7.tasks.celery_app import get_app

        try:
            return bool((app or get_app()).control.ping(timeout=1.0))
        except Exception:  # broker not reachable yet
            return False

    return ManagedProcess(name, home, healthy, startup_timeout=startup_timeout)


def stop_leftovers(process: ManagedProcess) -> list[int]:
    """Before `process` starts where none runs: stop what an earlier one of the same name left (the pool
    children and beat of a worker killed with SIGKILL keep running jobs and scheduling them, twice with the
    new worker's). The pids stopped."""
    return stop_home_processes(process.home, process.name)


def beat_process(home: Path) -> ManagedProcess:
    """A Celery beat started by hand (`sense7 beat`): known by its pid file, so that `sense7 down` stops it
    and a second one for the same home is refused."""
    return ManagedProcess("celery-beat", home, lambda: True)


def stack_environment(cfg: Settings, redis_url: str) -> dict[str, str]:
    """The environment every process of the stack shares: this one's, pointed at the stack's home, store,
    broker, model folder and backend, with webhooks handed to the sync job."""
    return {**os.environ, "SENSE7_HOME": str(cfg.home), "SENSE7_REDIS_URL": redis_url,
            "SENSE7_LS_URL": cfg.ls_url, "SENSE7_STORE_URL": cfg.store_url, "SENSE7_MODEL_DIR": str(cfg.model_dir),
            "SENSE7_BACKEND_URL": cfg.backend_url, "SENSE7_BACKEND_ON_EVENT": "sense7.tasks.sync:on_event",
            "SENSE7_RETRAIN_EVERY": os.environ.get("SENSE7_RETRAIN_EVERY", "100")}


class Stack:
    """Label Studio, Redis, the ML backend, the Celery worker and the rater page of `cfg.home`."""

    def __init__(self, cfg: Settings):
        self.cfg = cfg
        self.label_studio = LabelStudioServer(cfg)
        self.backend = BackendServer(cfg)
        self.rater_page = RaterPageServer(cfg)
        self.worker = worker_process(cfg.home)
        self.redis_url: str | None = None
        self._started: list[tuple[str, Callable[[], object]]] = []  # what this stack started, in order

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _record(self, name: str, stop: Callable[[], object]) -> None:
        if name not in self.started():
            self._started.append((name, stop))

    def started(self) -> list[str]:
        """The services this stack started and has not stopped, in the order they were started."""
        return [name for name, _ in self._started]

    def environment(self) -> dict[str, str]:
        if self.redis_url is None:
            raise RuntimeError("start_redis() first: the stack's processes need its broker")
        return stack_environment(self.cfg, self.redis_url)

    # -- starting, in order --------------------------------------------------------------------------------
    def start_label_studio(self, progress=None) -> ServiceStatus:
        """Label Studio on `cfg.ls_url` (one that already runs is used as it is, and left running)."""
        was_running = self.label_studio.status().running
        status = self.label_studio.start(progress)
        if not was_running:
            self._record("Label Studio", self.label_studio.stop)
        return status

    def start_redis(self) -> str:
        """The broker: the configured Redis, or this home's private redis-server (started if needed).
        This process then sends jobs to it too."""
        from sense7.tasks.celery_app import configure
        from sense7.tasks.redis_local import ensure_redis, running_local_url, stop_local_redis

        had_local = running_local_url(self.cfg) is not None
        self.redis_url = ensure_redis(self.cfg)
        if not had_local and running_local_url(self.cfg):
            self._record("Redis", lambda: stop_local_redis(self.cfg))
        configure(self.cfg, self.redis_url)
        return self.redis_url

    def start_backend(self, workers: int | None = None, threads: int | None = None) -> ServiceStatus:
        """The ML backend (gunicorn), its webhooks handed to the sync job. From here on this process's
        environment is the stack's, so what it starts later (and reads from the environment) agrees. A stack
        without a broker (a load test of the backend alone) serves predictions only."""
        if self.redis_url is not None:
            os.environ.update(self.environment())
        if self.backend.status().running:
            return self.backend.status()
        status = self.backend.start(workers, threads)
        self._record("ML backend", self.backend.stop)
        return status

    def start_worker(self, beat: bool = True, concurrency: int = 2, loglevel: str = "info",
                     extra_args: Sequence[str] = (), extra_env: dict | None = None) -> int:
        """The Celery worker (with beat unless `beat=False`); one that already runs is kept. Its pid."""
        pid = self.worker.pid()
        if pid is None:
            stop_leftovers(self.worker)
            schedule = self.cfg.home / "run" / "celerybeat" if beat else None
            pid = self.worker.start(worker_command(schedule, concurrency, loglevel, extra_args),
                                    {**self.environment(), **(extra_env or {})}, cwd=self.cfg.home)
            self._record("Celery worker", self.worker.stop)
        return pid

    def stop_worker(self) -> bool:
        """Stop the worker (a benchmark restarts it); True if it was running."""
        self._started = [(name, stop) for name, stop in self._started if name != "Celery worker"]
        return self.worker.stop()

    def start_rater_page(self, env: dict | None = None) -> ServiceStatus:
        """The rater page (gunicorn). One left from an earlier run is restarted: it may serve older code or
        settings."""
        if self.rater_page.status().running:
            self.rater_page.stop()
        status = self.rater_page.start({"SENSE7_REDIS_URL": self.redis_url or "", **(env or {})})
        self._record("rater page", self.rater_page.stop)
        return status

    # -- stopping, in reverse --------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop what this stack started, last first (each one even when an earlier stop failed); their names."""
        stopped, failure = [], None
        while self._started:
            name, stop = self._started.pop()
            try:
                stop()
            except Exception as exc:  # stop the rest, then say what failed
                failure = failure or exc
            stopped.append(name)
        if failure:
            raise failure
        return stopped

    def down(self) -> dict[str, bool]:
        """Stop every service of this home, whoever started it (`sense7 down`), last first, then every other
        process marked as the home's (LEFTOVERS: the orphans of a killed worker, say): {name: was running}."""
        from sense7.tasks.redis_local import stop_local_redis

        self._started.clear()
        stopped = {"rater page": self.rater_page.stop(), "Celery worker": self.worker.stop(),
                   "Celery beat": beat_process(self.cfg.home).stop(),
                   "ML backend": self.backend.stop(), "Redis": stop_local_redis(self.cfg),
                   "Label Studio": self.label_studio.stop()}
        return {**stopped, LEFTOVERS: bool(stop_home_processes(self.cfg.home))}
