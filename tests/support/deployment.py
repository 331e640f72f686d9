"""The several-host deployment's services, one list for the two tests that must agree on it:
tests/deploy/test_multi_home.py runs these commands (real processes, homes sharing no folder) and
tests/jobs/test_compose.py checks that docker-compose.yml's sense7 services run exactly these, with these
settings, so the compose file is tested through the commands the multi-home test runs (no Docker here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROXY_CONFIG = REPO / "deploy" / "haproxy" / "rater-page.cfg"  # the shipped TLS proxy in front of the rater pages

# docker-compose.yml service -> its command, run from the repository root (the image's WORKDIR holds the same
# folders: ml_backend/, sense7/).
SERVICE_COMMANDS: dict[str, list[str]] = {
    "ml-backend": ["gunicorn", "--config", "ml_backend/gunicorn_conf.py", "sense7.ml_backend.wsgi:app_from_env()"],
    "worker": ["sense7", "worker", "--no-beat", "--concurrency", "1"],
    "beat": ["sense7", "beat"],
    "rater-page": ["gunicorn", "--config", "sense7/rater_page/gunicorn_conf.py",
                   "sense7.rater_page.wsgi:app_from_env()"],
    "rater-page-2": ["gunicorn", "--config", "sense7/rater_page/gunicorn_conf.py",
                     "sense7.rater_page.wsgi:app_from_env()"],
}

# What every host must be given alike (and nothing else is shared): secrets first, which compose must require
# from the environment (`${VAR:?...}`), never write down.
SHARED_SECRETS = ("SENSE7_STORE_URL", "SENSE7_REDIS_URL", "SENSE7_BACKEND_PASSWORD", "SENSE7_WEBHOOK_SECRET",
                  "SENSE7_RATER_PAGE_SECRET", "SENSE7_LS_TOKEN")
SHARED_SETTINGS = (*SHARED_SECRETS, "SENSE7_BACKEND_USER", "SENSE7_LS_URL")

# Each service's own settings: where it listens. (SENSE7_HOME is per host too: each its own folder/volume.)
SERVICE_SETTINGS: dict[str, tuple[str, ...]] = {
    "ml-backend": ("SENSE7_BACKEND_BIND",),
    "worker": (),
    "beat": (),
    "rater-page": ("SENSE7_RATER_PAGE_HOST", "SENSE7_RATER_PAGE_PORT"),
    "rater-page-2": ("SENSE7_RATER_PAGE_HOST", "SENSE7_RATER_PAGE_PORT"),
}


def service_process(service: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`service`'s command as docker-compose.yml runs it, with this virtualenv's executables first on PATH."""
    missing = [key for key in (*SHARED_SETTINGS, *SERVICE_SETTINGS[service], "SENSE7_HOME") if key not in env]
    assert not missing, f"{service}: settings missing: {missing}"
    bin_dir = str(Path(sys.executable).parent)
    env = {**env, "PATH": bin_dir + os.pathsep + env.get("PATH", os.defpath)}
    return subprocess.Popen(SERVICE_COMMANDS[service], env=env, cwd=REPO, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen | None, timeout: float = 60) -> None:
    """SIGTERM (gunicorn and Celery stop gracefully), then SIGKILL after `timeout`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def haproxy_binary() -> str:
    """Debian's haproxy, or a skip naming the packages (openssl makes the test certificates)."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if found is None or shutil.which("openssl") is None:
        pytest.skip("HAProxy or openssl is not installed (Debian: apt-get install haproxy openssl)")
    return found


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(the PEM HAProxy reads: certificate then key, 0600; the certificate a client trusts) for 127.0.0.1."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    combined = folder / "rater-page.pem"
    combined.write_bytes(cert.read_bytes() + key.read_bytes())
    combined.chmod(0o600)
    return combined, cert
