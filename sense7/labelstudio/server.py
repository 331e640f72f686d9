"""Run a real Label Studio (its own virtualenv) as a background process bound to 127.0.0.1.

Idempotent: `start` on a running server returns it as it is. Refuses when the port is taken by something
else, because Label Studio would otherwise move silently to the next port (8080 -> 8081) and every client
would talk to the wrong server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import requests

from sense7.processes import ManagedProcess, ProcessError, port_is_free
from sense7.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]  # sense7/labelstudio/server.py -> the repository


class ServerError(RuntimeError):
    """Label Studio could not be started, or is not the one we expected."""


@dataclass
class ServerStatus:
    running: bool
    healthy: bool
    pid: int | None
    url: str
    database: str

    def describe(self) -> str:
        if self.running and self.healthy:
            return f"Label Studio is running at {self.url} (pid {self.pid}, {self.database})"
        if self.running:
            return f"Label Studio (pid {self.pid}) is starting or unhealthy at {self.url}"
        return "Label Studio is not running"


def label_studio_executable() -> Path:
    """The `label-studio` script of the dedicated virtualenv (SENSE7_LS_BIN overrides)."""
    override = os.environ.get("SENSE7_LS_BIN")
    candidates = [Path(override)] if override else [REPO_ROOT / ".venv-ls" / "bin" / "label-studio"]
    for path in candidates:
        if path.exists():
            return path
    raise ServerError(
        f"Label Studio is not installed at {candidates[0]}: run ./run (it creates .venv-ls), "
        "or set SENSE7_LS_BIN to a label-studio executable"
    )


class LabelStudioServer:
    """Start, stop and inspect the Label Studio process that serves `settings.ls_url`."""

    def __init__(self, settings: Settings, startup_timeout: float = 300.0):
        self.settings = settings
        self.data_dir = settings.home / "label-studio"
        self.process = ManagedProcess("label-studio", settings.home, self.healthy, startup_timeout)

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return requests.get(f"{self.settings.ls_url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def status(self) -> ServerStatus:
        pid = self.process.pid()
        return ServerStatus(
            running=pid is not None,
            healthy=pid is not None and self.healthy(),
            pid=pid,
            url=self.settings.ls_url,
            database="PostgreSQL" if self.settings.ls_database_url else f"SQLite in {self.data_dir}",
        )

    # -- lifecycle -------------------------------------------------------------------------------------
    def environment(self) -> dict[str, str]:
        """Environment for the server. Secrets go through the environment, never the command line (ps)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "POSTGRE_"))}
        env.update(
            LABEL_STUDIO_BASE_DATA_DIR=str(self.data_dir),
            LABEL_STUDIO_USERNAME=self.settings.ls_admin_email,
            LABEL_STUDIO_PASSWORD=self.settings.ls_admin_password,
            LABEL_STUDIO_USER_TOKEN=self.settings.ls_token,
            LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN="true",
            # Our backend and webhooks live on 127.0.0.1: 1.23 blocks local addresses by default.
            ML_BLOCK_LOCAL_IP="false",
            SSRF_PROTECTION_ENABLED="false",
            USE_DEFAULT_BANNED_SUBNETS="false",
            LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK="false",
            SENTRY_DSN="",
            FRONTEND_SENTRY_DSN="",
            COLLECT_ANALYTICS="false",
        )
        db_url = self.settings.ls_database_url
        if db_url:
            parsed = urlparse(db_url)
            env.update(
                DJANGO_DB="postgresql",
                POSTGRE_NAME=parsed.path.lstrip("/"),
                POSTGRE_USER=parsed.username or "postgres",
                POSTGRE_PASSWORD=parsed.password or "",
                POSTGRE_HOST=parsed.hostname or "127.0.0.1",
                POSTGRE_PORT=str(parsed.port or 5432),
            )
        else:
            env["DJANGO_DB"] = "sqlite"
        return env

    def start(self, progress=None) -> ServerStatus:
        if self.process.pid() is None:
            port = urlparse(self.settings.ls_url).port or 80
            if not port_is_free(port):
                raise ServerError(
                    f"port {port} is already in use by another program: Label Studio would silently move to "
                    f"another port. Stop that program or choose another port with SENSE7_LS_PORT.")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(label_studio_executable()), "start", "--no-browser", "--internal-host", "127.0.0.1",
               "--port", str(urlparse(self.settings.ls_url).port or 80), "--data-dir", str(self.data_dir),
               "--enable-legacy-api-token", "--log-level", "WARNING"]
        try:
            self.process.start(cmd, self.environment(), cwd=self.data_dir, on_wait=progress)
        except ProcessError as exc:
            raise ServerError(str(exc)) from None
        return self.status()

    def stop(self) -> bool:
        """Stop the server and its children. Returns True if something was running."""
        return self.process.stop()
