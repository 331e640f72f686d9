"""Run the ML backend under gunicorn as a background process (`sense7 backend start|stop|status`).

gunicorn's config is ml_backend/gunicorn_conf.py: sync workers (SENSE7_BACKEND_WORKERS, default 2 = the
cores of the reference machine), bound to SENSE7_BACKEND_HOST (127.0.0.2: loopback, and the one local
address Label Studio's SSRF protection lets it call), each worker loading the served model once, with
HTTP basic auth on by default. Credentials reach the process through its environment only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

import requests

from sense7.processes import ManagedProcess, ProcessError, ServiceStatus, port_is_free
from sense7.settings import Settings

GUNICORN_CONF = Path(__file__).with_name("gunicorn_conf.py")


class BackendError(RuntimeError):
    """The backend could not be started, or is not the one we expected."""


class BackendServer:
    def __init__(self, settings: Settings, port: int | None = None, startup_timeout: float = 60.0):
        self.settings = settings
        self.port = port or urlparse(settings.backend_url).port or settings.backend_port
        self.host = settings.serving.bind.rpartition(":")[0] or "127.0.0.2"
        self.url = f"http://{self.host}:{self.port}"
        self.process = ManagedProcess("ml-backend", settings.home, lambda: self.health(timeout=1.0) is not None,
                                      startup_timeout)
        self.pid_file, self.log_file = self.process.pid_file, self.process.log_file

    @property
    def auth(self):
        s = self.settings
        return (s.backend_user, s.backend_password) if s.backend_user and s.backend_password else None

    def pid(self) -> int | None:
        return self.process.pid()

    def health(self, timeout: float = 2.0) -> dict | None:
        try:
            response = requests.get(f"{self.url}/health", auth=self.auth, timeout=timeout)
        except requests.RequestException:
            return None
        return response.json() if response.status_code == 200 else None

    def status(self) -> ServiceStatus:
        pid = self.pid()
        health = self.health() if pid else None
        return ServiceStatus("ML backend", pid is not None, health is not None, pid, self.url,
                             f"model {health.get('model_version')}" if health else None)

    def environment(self, workers: int | None = None, threads: int | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SENSE7_HOME=str(self.settings.home), SENSE7_STORE_URL=self.settings.store_url,
                   SENSE7_MODEL_DIR=str(self.settings.model_dir), SENSE7_BACKEND_PORT=str(self.port),
                   SENSE7_BACKEND_BIND=f"{self.host}:{self.port}", SENSE7_BACKEND_PIDFILE=str(self.pid_file),
                   SENSE7_WEBHOOK_SECRET=self.settings.webhook_secret)
        if self.auth:
            env.update(SENSE7_BACKEND_USER=self.auth[0], SENSE7_BACKEND_PASSWORD=self.auth[1])
        if workers:
            env["SENSE7_BACKEND_WORKERS"] = str(workers)
        if threads:
            env["SENSE7_BACKEND_THREADS"] = str(threads)
        return env

    def start(self, workers: int | None = None, threads: int | None = None) -> ServiceStatus:
        running = self.pid()
        if running:
            raise BackendError(f"the ML backend is already running (pid {running}, {self.url}); "
                               "`sense7 backend stop` first")
        if not port_is_free(self.port, self.host):
            raise BackendError(f"port {self.port} is already in use by another program: stop it or choose another "
                               "port with SENSE7_BACKEND_PORT (or --port)")
        # Create the store's tables once here, so the workers booting together need not race to do it.
        from sense7.store.database import Store

        Store(self.settings.store_url)
        cmd = [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONF), "sense7.ml_backend.wsgi:app_from_env()"]
        try:
            # gunicorn writes the same pid (its master) to the pid file; we need it before that.
            self.process.start(cmd, self.environment(workers, threads))
        except ProcessError as exc:
            raise BackendError(str(exc).replace("ml-backend", "the ML backend", 1)) from None
        return self.status()

    def stop(self, timeout: float = 20.0) -> bool:
        """Graceful stop (SIGTERM lets workers finish their requests). True if something was running."""
        return self.process.stop(timeout)

    def _tail(self, lines: int = 20) -> str:
        return self.process.log_tail(lines)
