"""Run the rater page under gunicorn as a background process (`sense7 rater-page start|stop|status`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import requests

from sense7.processes import ManagedProcess, ProcessError, ServiceStatus, port_is_free
from sense7.settings import Settings

GUNICORN_CONF = Path(__file__).with_name("gunicorn_conf.py")


class RaterPageError(RuntimeError):
    """The rater page could not be started."""


class RaterPageServer:
    def __init__(self, settings: Settings, startup_timeout: float = 60.0):
        self.settings = settings
        page = settings.rater_page
        self.host, self.port = page.host, page.port
        self.url = f"http://{'127.0.0.1' if self.host in ('0.0.0.0', '') else self.host}:{self.port}"
        self.process = ManagedProcess("rater-page", settings.home, self.healthy, startup_timeout)
        self.log_file = self.process.log_file

    def healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1.0).status_code == 200
        except requests.RequestException:
            return False

    def status(self) -> ServiceStatus:
        pid = self.process.pid()
        return ServiceStatus("rater page", pid is not None, bool(pid) and self.healthy(), pid, self.url)

    def start(self, env: dict | None = None) -> ServiceStatus:
        running = self.process.pid()
        if running:
            raise RaterPageError(f"the rater page is already running (pid {running}, {self.url})")
        if not port_is_free(self.port, self.host):
            raise RaterPageError(f"port {self.port} is already in use: choose another with SENSE7_RATER_PAGE_PORT")
        from sense7.store.database import Store

        Store(self.settings.store_url)  # tables created once, not raced by the workers booting together
        cmd = [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONF),
               "sense7.rater_page.wsgi:app_from_env()"]
        environment = {**os.environ, **(env or {}), "SENSE7_HOME": str(self.settings.home),
                       "SENSE7_STORE_URL": self.settings.store_url,
                       "SENSE7_RATER_PAGE_HOST": self.host, "SENSE7_RATER_PAGE_PORT": str(self.port)}
        try:
            self.process.start(cmd, environment)
        except ProcessError as exc:
            raise RaterPageError(str(exc)) from None
        return self.status()

    def stop(self, timeout: float = 20.0) -> bool:
        return self.process.stop(timeout)
