"""The several-host deployment's services, one list: docker-compose.yml's sense7 services and their commands
(`SERVICE_COMMANDS`), the settings every host shares and each service's own, and `Deployment`, which runs them on
this machine as the hosts would, each instance in a home of its own (no folder in common), with HAProxy and the
shipped `deploy/haproxy/rater-page.cfg` in front of the rater pages.

Who holds to this list: tests/deploy/test_multi_home.py runs these commands, tests/jobs/test_compose.py checks that
the compose file's sense7 services run exactly them, and `scripts/bench_crowd.py --topology compose` measures a
crowd study on a `Deployment`. Label Studio, PostgreSQL and Redis are not here: each deployment brings its own
(`sense7.stack.Stack` starts a Label Studio and a Redis on one machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sense7.processes import ProcessError, free_port, niced

REPO = Path(__file__).resolve().parents[1]
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

# CPU priority: the raters' interactive path (the rater pages, HAProxy, PostgreSQL, Redis) goes before the
# background work, which no rater waits on as they click: Label Studio (raters never reach it), the workers that
# deliver answers to it and make tasks ahead of the participant (the questionnaire and the conversation held ahead
# cover their rounds), beat, and the ML backend (Label Studio calls it). docker-compose.yml gives the background
# services `cpu_shares: BACKGROUND_CPU_SHARES`; one machine without containers runs them under
# `nice -n BACKGROUND_NICE`, the same share of the CPU when it is contended (and no limit when it is not).
# docs/guides/deployment.md#cpu-priority says why and what it costs.
BACKGROUND_NICE = 10
BACKGROUND_CPU_SHARES = 110  # the kernel's CFS weight of nice 10 (sched_prio_to_weight), nice 0 being 1024
SERVICE_NICE: dict[str, int] = {"ml-backend": BACKGROUND_NICE, "worker": BACKGROUND_NICE, "beat": BACKGROUND_NICE,
                                "rater-page": 0, "rater-page-2": 0}
LABEL_STUDIO_NICE = BACKGROUND_NICE  # Label Studio comes with the deployment's stack: SENSE7_LS_NICE

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
    """`service`'s command as docker-compose.yml runs it, with this virtualenv's executables first on PATH, at
    its priority (`SERVICE_NICE`: `nice` execs the command, so the pid is the service's)."""
    missing = [key for key in (*SHARED_SETTINGS, *SERVICE_SETTINGS[service], "SENSE7_HOME") if key not in env]
    if missing:
        raise ProcessError(f"{service}: settings missing: {missing}")
    bin_dir = str(Path(sys.executable).parent)
    env = {**env, "PATH": bin_dir + os.pathsep + env.get("PATH", os.defpath)}
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(log, "wb") as out:
        return subprocess.Popen(niced(SERVICE_COMMANDS[service], SERVICE_NICE[service]), env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, umask=0o077)


def stop_process(process: subprocess.Popen | None, timeout: float = 60) -> None:
    """SIGTERM (gunicorn, Celery and HAProxy stop gracefully), then SIGKILL after `timeout`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def haproxy_executable() -> str | None:
    """Debian's haproxy (`apt-get install haproxy`), or None."""
    return shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(the PEM HAProxy reads: certificate then key, 0600; the certificate a client trusts) for 127.0.0.1."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    key.chmod(0o600)
    combined = folder / "rater-page.pem"
    combined.write_bytes(cert.read_bytes() + key.read_bytes())
    combined.chmod(0o600)
    return combined, cert


@dataclass
class Instance:
    """One running copy of a service: `name` is its host (and home), `service` its SERVICE_COMMANDS key."""
    name: str
    service: str
    home: Path
    env: dict[str, str] = field(repr=False)
    process: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return SERVICE_COMMANDS[self.service]

    @property
    def log(self) -> Path:
        return self.home / "logs" / f"{self.name}.log"


class Deployment:
    """docker-compose.yml's sense7 services on this machine: the ML backend (bound at `backend_bind`, the address
    Label Studio's webhooks and pre-annotation calls go to), `workers` workers (`docker compose up --scale
    worker=N`: every queue each, no scheduler), one beat, two rater pages, each instance in its own home under
    `root`; then (`start_proxy`) HAProxy with the shipped config, TLS on a free 127.0.0.1 port, in front of both
    pages. `shared` holds SHARED_SETTINGS (and whatever else every host gets: a crowd study's key, job settings);
    each instance adds its home and where it listens."""

    def __init__(self, root: Path, shared: dict[str, str], backend_bind: str, workers: int = 2):
        missing = [key for key in SHARED_SETTINGS if not shared.get(key)]
        if missing:
            raise ProcessError(f"the deployment's shared settings lack {missing}")
        self.root, self.shared, self.backend_bind = Path(root), dict(shared), backend_bind
        self.proxy_ports = (free_port(), free_port())  # (https, http): the pages' public URL is the proxy's
        self.proxy_url = f"https://127.0.0.1:{self.proxy_ports[0]}"
        self.instances = [self.instance(name, service) for name, service in self.plan(workers)]
        self.proxy: subprocess.Popen | None = None
        self.proxy_certificate: Path | None = None

    @staticmethod
    def plan(workers: int = 2) -> list[tuple[str, str]]:
        """(instance, service) in start order: each instance runs its service's SERVICE_COMMANDS entry."""
        return [("ml-backend", "ml-backend"), *[(f"worker-{i + 1}", "worker") for i in range(workers)],
                ("beat", "beat"), ("rater-page", "rater-page"), ("rater-page-2", "rater-page-2")]

    def instance(self, name: str, service: str) -> Instance:
        home = self.root / f"host-{name}"
        env = {key: value for key, value in os.environ.items() if not key.startswith(("SENSE7_", "CELERY_"))}
        env.update(self.shared, SENSE7_HOME=str(home), SENSE7_MODEL_DIR=str(home / "models"))
        if service == "ml-backend":
            env.update(SENSE7_BACKEND_BIND=self.backend_bind, SENSE7_BACKEND_ON_EVENT="sense7.tasks.sync:on_event")
        if service.startswith("rater-page"):
            # Behind the proxy: the page believes X-Forwarded-For from it alone (its limits count real clients).
            env.update(SENSE7_RATER_PAGE_HOST="127.0.0.1", SENSE7_RATER_PAGE_PORT=str(free_port()),
                       SENSE7_TRUSTED_PROXIES="127.0.0.1", SENSE7_RATER_PAGE_URL=self.proxy_url)
        return Instance(name, service, home, env)

    def page_addresses(self) -> list[str]:
        return [f"{i.env['SENSE7_RATER_PAGE_HOST']}:{i.env['SENSE7_RATER_PAGE_PORT']}" for i in self.instances
                if i.service.startswith("rater-page")]

    def pids(self) -> dict[str, int]:
        """{instance: pid} of what runs, the proxy's as "haproxy"."""
        found = {i.name: i.process.pid for i in self.instances if i.process is not None and i.process.poll() is None}
        if self.proxy is not None and self.proxy.poll() is None:
            found["haproxy"] = self.proxy.pid
        return found

    def start(self, timeout: float = 180) -> None:
        """Start every instance and wait until the backend and the pages answer and every worker answers a
        ping; an instance that exits meanwhile is an error naming its log. Failed: nothing is left running."""
        try:
            for instance in self.instances:
                instance.home.mkdir(parents=True, exist_ok=True, mode=0o700)
                instance.process = service_process(instance.service, instance.env, instance.log)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float) -> None:
        from sense7.tasks.celery_app import get_app

        auth = (self.shared["SENSE7_BACKEND_USER"], self.shared["SENSE7_BACKEND_PASSWORD"])
        checks = {"ml-backend": lambda: answers(f"http://{self.backend_bind}/health", auth)}
        for address in self.page_addresses():
            checks[address] = lambda address=address: answers(f"http://{address}/healthz")
        workers = sum(1 for i in self.instances if i.service == "worker")

        def pinged() -> bool:
            try:
                return len(get_app().control.ping(timeout=1.0)) >= workers
            except Exception:  # the broker not reachable yet
                return False

        checks["workers"] = pinged
        deadline = time.monotonic() + timeout
        while checks:
            for instance in self.instances:
                if instance.process.poll() is not None:
                    raise ProcessError(f"{instance.name} exited (code {instance.process.returncode}); see "
                                       f"{instance.log}:\n{tail(instance.log)}")
            checks = {name: check for name, check in checks.items() if not check()}
            if checks and time.monotonic() > deadline:
                raise ProcessError(f"not ready within {timeout:.0f} s: {sorted(checks)}")
            time.sleep(0.5)

    def start_proxy(self) -> str:
        """HAProxy with deploy/haproxy/rater-page.cfg as shipped: TLS (a self-signed certificate for 127.0.0.1,
        `proxy_certificate` for clients to trust) in front of both pages, round robin. Its https URL."""
        haproxy = haproxy_executable()
        if haproxy is None or shutil.which("openssl") is None:
            raise ProcessError("HAProxy or openssl is not installed (Debian: apt-get install haproxy openssl)")
        folder = self.root / "host-proxy"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem, self.proxy_certificate = self_signed(folder)
        https, http = self.proxy_ports
        first, second = self.page_addresses()
        env = {"PATH": os.environ.get("PATH", os.defpath), "SENSE7_PROXY_HTTPS_BIND": f"127.0.0.1:{https}",
               "SENSE7_PROXY_HTTP_BIND": f"127.0.0.1:{http}", "SENSE7_TLS_CERT": str(pem),
               "SENSE7_RATER_PAGE_ADDR": first, "SENSE7_RATER_PAGE_ADDR_2": second}
        log = folder / "haproxy.log"
        with open(log, "wb") as out:
            self.proxy = subprocess.Popen([haproxy, "-db", "-f", str(PROXY_CONFIG)], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not answers(f"{self.proxy_url}/healthz", verify=str(self.proxy_certificate)):
            if self.proxy.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProcessError(f"HAProxy did not serve {self.proxy_url}; see {log}:\n{tail(log)}")
            time.sleep(0.3)
        return self.proxy_url

    def stop(self) -> None:
        """The proxy first, then every instance, last started first."""
        stop_process(self.proxy, timeout=20)
        for instance in reversed(self.instances):
            stop_process(instance.process)


def answers(url: str, auth=None, verify: bool | str = True) -> bool:
    try:
        return requests.get(url, timeout=5, auth=auth, verify=verify).status_code == 200
    except requests.RequestException:
        return False


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
