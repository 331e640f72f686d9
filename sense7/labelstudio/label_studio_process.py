"""Run a real Label Studio (its own virtualenv) as a background process bound to 127.0.0.1.

Locked down by default (docs/SECURITY.md): no sign-up without the organization's invite link (every
account is staff: Label Studio Community lets any member read and change everything), and its SSRF
protection on, allowing only the address the ML backend listens on (Label Studio 1.23.2 has no allow-list:
we replace its default banned subnets by the same list minus that one address).

Idempotent: `start` on a running server returns it as it is. Refuses when the port is taken by something
else, because Label Studio would otherwise move silently to the next port (8080 -> 8081) and every client
would talk to the wrong server.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import requests

from sense7.processes import ManagedProcess, ProcessError, ServiceStatus, niced, port_is_free
from sense7.settings import Settings, secure_home

REPO_ROOT = Path(__file__).resolve().parents[2]  # sense7/labelstudio/label_studio_process.py -> the repository


# Label Studio 1.23.2's default banned subnets (core/utils/io.py validate_ip), which it drops when
# USE_DEFAULT_BANNED_SUBNETS=false: we then hand back this list minus the addresses sense7 registers.
DEFAULT_BANNED_SUBNETS = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "224.0.0.0/4", "233.252.0.0/24", "240.0.0.0/4", "255.255.255.255/32", "::/128", "::1/128",
    "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001:0000::/32",
    "2001:20::/28", "2001:db8::/32", "2002::/16", "fc00::/7", "fe80::/10", "ff00::/8",
)


def banned_subnets(allowed: list[str]) -> list[str]:
    """Label Studio's default banned subnets with the `allowed` IP addresses cut out (host names and
    public addresses need no exception)."""
    holes = []
    for host in allowed:
        try:
            holes.append(ipaddress.ip_network(host))
        except ValueError:
            continue  # a name: Label Studio resolves it and checks the address against this list
    result = []
    for subnet in map(ipaddress.ip_network, DEFAULT_BANNED_SUBNETS):
        pieces = [subnet]
        for hole in holes:
            if hole.version != subnet.version:
                continue
            pieces = [rest for piece in pieces
                      for rest in (piece.address_exclude(hole) if hole.subnet_of(piece) else [piece])]
        result.extend(str(p) for p in pieces)
    return result


class ServerError(RuntimeError):
    """Label Studio could not be started, or is not the one we expected."""


def label_studio_package() -> Path:
    """The folder of the `label_studio` package inside Label Studio's virtualenv."""
    venv = label_studio_executable().parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/label_studio"))
    if not found:
        raise ServerError(f"no label_studio package under {venv}/lib")
    return found[-1]


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

    @staticmethod
    def sqlite_file(home: Path) -> Path:
        """Label Studio's SQLite database in `home` (its default name under LABEL_STUDIO_BASE_DATA_DIR):
        what `sense7 backup` copies when SENSE7_LS_DATABASE_URL is not set."""
        return home / "label-studio" / "label_studio.sqlite3"

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return requests.get(f"{self.settings.ls_url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def status(self) -> ServiceStatus:
        pid = self.process.pid()
        return ServiceStatus(
            "Label Studio",
            running=pid is not None,
            healthy=pid is not None and self.healthy(),
            pid=pid,
            url=self.settings.ls_url,
            detail=(("PostgreSQL" if self.settings.ls_database_url else f"SQLite in {self.data_dir}")
                    + (f", gunicorn x {self.settings.ls_workers}" if self.settings.ls_workers else "")),
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
            # SSRF protection stays on: Label Studio may call the ML backend's address and no other local
            # one (not Redis, PostgreSQL, itself or any other service on this machine).
            ML_BLOCK_LOCAL_IP="true",
            SSRF_PROTECTION_ENABLED="true",
            USE_DEFAULT_BANNED_SUBNETS="false",
            USER_ADDITIONAL_BANNED_SUBNETS=",".join(banned_subnets([urlparse(self.settings.backend_url).hostname or ""])),
            # Staff only: accounts are created by the invite link (`sense7 server invite-staff`) or by us.
            LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK="true",
            SENTRY_DSN="",
            FRONTEND_SENTRY_DSN="",
            COLLECT_ANALYTICS="false",
            # Otherwise `label-studio start` asks pypi.org for its latest version: a call out at run time that
            # waits up to 10 s on a machine without network.
            LATEST_VERSION_CHECK="false",
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
        if self.settings.ls_workers:
            env.update(DJANGO_SETTINGS_MODULE="label_studio.core.settings.label_studio", HOST="",
                       LOG_LEVEL="WARNING")
        return env

    def start(self, progress=None) -> ServiceStatus:
        if self.process.pid() is None:
            port = urlparse(self.settings.ls_url).port or 80
            if not port_is_free(port):
                raise ServerError(
                    f"port {port} is already in use by another program: Label Studio would silently move to "
                    f"another port. Stop that program or choose another port with SENSE7_LS_PORT.")
        secure_home(self.settings.home)
        self.data_dir.mkdir(exist_ok=True, mode=0o700)
        os.chmod(self.data_dir, 0o700)
        env = self.environment()
        if self.settings.ls_workers and self.process.pid() is None:
            self.initialize(env)
        try:
            self.process.start(self.command(), env, cwd=self.data_dir, on_wait=progress)
        except ProcessError as exc:
            raise ServerError(str(exc)) from None
        return self.status()

    def command(self) -> list[str]:
        """Label Studio's own server, or (SENSE7_LS_WORKERS >= 1) its WSGI app under gunicorn; under `nice` at
        SENSE7_LS_NICE (`nice` execs it: the pid is Label Studio's, its workers inherit the priority)."""
        return niced(self.server_command(), self.settings.ls_nice)

    def server_command(self) -> list[str]:
        port = str(urlparse(self.settings.ls_url).port or 80)
        if not self.settings.ls_workers:
            return [str(label_studio_executable()), "start", "--no-browser", "--internal-host", self.settings.ls_host,
                    "--port", port, "--data-dir", str(self.data_dir), "--enable-legacy-api-token",
                    "--log-level", "WARNING"]
        gunicorn = label_studio_executable().parent / "gunicorn"
        if not gunicorn.exists():
            raise ServerError(f"SENSE7_LS_WORKERS is set but {gunicorn} is missing: run ./run setup "
                              "(requirements-label-studio.txt lists gunicorn)")
        host = self.settings.ls_host
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        threads = self.settings.ls_threads
        # Label Studio's modules import each other by their top-level names (`projects.models`): its package
        # folder goes on the path, as `label-studio start` does.
        return [str(gunicorn), "label_studio.core.wsgi:application", "--pythonpath", str(label_studio_package()),
                "--bind", bind, "--workers", str(self.settings.ls_workers), "--threads", str(threads),
                "--worker-class", "gthread" if threads > 1 else "sync", "--timeout", "120",
                "--graceful-timeout", "20", "--log-level", "warning",
                "--name", "sense7-label-studio"]

    def initialize(self, env: dict[str, str]) -> None:
        """What `label-studio start` does before it serves, for gunicorn: the migrations, the admin account
        with its API token and the organization (`label-studio init`, idempotent)."""
        cmd = [str(label_studio_executable()), "init", "--data-dir", str(self.data_dir), "--enable-legacy-api-token",
               "--quiet", "--log-level", "WARNING"]
        self.process.log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.process.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as log:
            try:
                done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=self.data_dir, timeout=self.process.startup_timeout, umask=0o077)
            except subprocess.TimeoutExpired:
                raise ServerError(f"`label-studio init` did not finish within {self.process.startup_timeout:.0f} s; "
                                  f"see {self.process.log_file}") from None
        if done.returncode:
            raise ServerError(f"`label-studio init` failed (exit {done.returncode}); see {self.process.log_file}:\n"
                              f"{self.process.log_tail()}")

    def invite_link(self) -> str:
        """The organization's sign-up link for a new staff member (Label Studio's own invite token; the
        endpoint is not in the SDK)."""
        response = requests.get(f"{self.settings.ls_url}/api/invite",
                                headers={"Authorization": f"Token {self.settings.ls_token}"}, timeout=10)
        response.raise_for_status()
        return f"{self.settings.ls_url}{response.json()['invite_url']}"

    def stop(self) -> bool:
        """Stop the server and its children. Returns True if something was running."""
        return self.process.stop()
