"""A private redis-server for a machine without a configured Redis (the embedded default).

Why a private redis-server rather than kombu's SQLAlchemy transport: the retrain lock, late acks and
the result backend all behave the same as in production (docker-compose runs Redis too), so there is
one code path to test. The server binds 127.0.0.1 on a free port, keeps its data (AOF) under
`settings.home/redis`, and records its URL and pid there so every process of the same SENSE7_HOME
(worker, beat, ML backend webhook, CLI) finds the same server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import redis

from sense7.processes import free_port
from sense7.settings import Settings, local_secret


class RedisUnavailable(RuntimeError):
    """No Redis URL is configured and no private redis-server could be started."""


def _alive(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


def local_redis_dir(settings: Settings) -> Path:
    return settings.home / "redis"


def running_local_url(settings: Settings) -> str | None:
    """The URL of this home's private redis-server if one answers, else None."""
    url_file = local_redis_dir(settings) / "url"
    if url_file.exists():
        url = url_file.read_text().strip()
        if url and _alive(url):
            return url
    return None


def redis_url(settings: Settings) -> str | None:
    """The configured Redis URL, else a running private server's, else None (nothing is started)."""
    return settings.redis_url or running_local_url(settings)


def start_redis_server(directory: Path, port: int | None = None, wait: float = 10.0,
                       password: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start `redis-server` on 127.0.0.1:`port` with its data in `directory`; return (process, url).
    With `password`, clients must authenticate (it goes in a 0600 config file, never on the command line,
    and in the returned URL).

    The caller owns the process (tests stop and restart it to cause broker faults).
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable(
            "redis-server is not installed and SENSE7_REDIS_URL is not set: "
            "install it (apt-get install redis-server) or point SENSE7_REDIS_URL at a Redis server"
        )
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    port = port or free_port()
    config = directory / "redis.conf"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"requirepass {password}\n" if password else "")
    args = [
        binary, str(config), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory),
        # AOF so queued jobs survive a restart of the private server.
        "--appendonly", "yes", "--save", "", "--daemonize", "no",
        "--logfile", str(directory / "redis.log"), "--protected-mode", "yes",
    ]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, umask=0o077)
    url = f"redis://:{password}@127.0.0.1:{port}/0" if password else f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RedisUnavailable(f"redis-server exited with {proc.returncode}; see {directory / 'redis.log'}")
        if _alive(url):
            return proc, url
        time.sleep(0.05)
    proc.kill()
    raise RedisUnavailable(f"redis-server did not answer on port {port} within {wait:.0f} s")


def ensure_redis(settings: Settings) -> str:
    """The Redis URL to use: the configured one, or this home's private server (started if needed)."""
    url = redis_url(settings)
    if url:
        return url
    directory = local_redis_dir(settings)
    proc, url = start_redis_server(directory, password=local_secret(settings.home, "redis_password"))
    (directory / "pid").write_text(str(proc.pid))
    tmp = directory / "url.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the URL carries the password
    with os.fdopen(fd, "w") as fh:
        fh.write(url)
    os.replace(tmp, directory / "url")
    return url


def stop_local_redis(settings: Settings) -> bool:
    """Stop this home's private redis-server (by its recorded pid). True if one was running."""
    directory = local_redis_dir(settings)
    url = running_local_url(settings)
    if url is None:
        return False
    try:
        redis.Redis.from_url(url).shutdown(nosave=False)
    except redis.RedisError:
        pass  # shutdown closes the connection by design
    for name in ("url", "pid"):
        (directory / name).unlink(missing_ok=True)
    return True
