"""Background processes that sense7 starts and must be able to stop: one pid file and one log file each
under SENSE7_HOME, a process group of their own (so stopping also stops their children), and a health
check to wait on. Label Studio, the ML backend, a private Redis and the Celery worker all use this.

Every process sense7 starts for a home also carries that home in its environment (`HOME_MARKER`), and so
does every descendant: the environment is inherited through fork and exec, survives its parent's death,
and the kernel keeps it where the process started (a process cannot lose it by changing os.environ). What
neither a pid file nor a process group can find is found by it: the pool children or the beat of a worker
killed with SIGKILL (re-parented to init, their pid file overwritten by the next worker, their group the
shell's when the worker was started by hand). `stop_home_processes` stops them (`sense7 down`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

# The home (resolved path) whose service a process is, and which service: set by sense7 when it starts one
# (ManagedProcess.start, `sense7 worker`, `sense7 beat`), inherited by its children. A developer's shell
# with SENSE7_HOME exported never carries these, so nothing but sense7's own processes match.
HOME_MARKER = "SENSE7_SERVICE_HOME"
SERVICE_MARKER = "SENSE7_SERVICE"


class ProcessError(RuntimeError):
    """A managed process could not be started or did not become healthy."""


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process still answers kill(0): reap it if it is ours
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def process_tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and its living descendants (gunicorn and Celery fork workers); [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    """Resident bytes of the process `pid` and its living descendants (0 when it is gone)."""
    total = 0
    for process in process_tree(pid):
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass  # ended between the listing and now
    return total


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process `pid` and of all its descendants: the living ones, and the ended
    ones their parent waited for (the kernel adds a reaped child's times, and its own reaped children's, to the
    parent's `children_user`/`children_system`; a living child is not in them, so nothing counts twice). A
    descendant ending between two calls moves from its own line to its parent's, neither lost nor doubled. 0.0
    when `pid` is gone; an ended descendant nobody in the tree waited for (re-parented to init) is not counted."""
    total = 0.0
    for process in process_tree(pid):
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # ended between the listing and now: its parent's children_* hold it from now on
        total += times.user + times.system + times.children_user + times.children_system
    return total


class CpuMeter:
    """CPU seconds per service over an interval: `start()`, then `stop()` -> {service: seconds}. Each service is
    one or more root pids (an instance per pid), each measured with its whole process tree (`tree_cpu_seconds`)."""

    def __init__(self, services: dict[str, list[int]]):
        self.services = {name: list(pids) for name, pids in services.items()}
        self.started: dict[str, float] = {}

    def sample(self) -> dict[str, float]:
        return {name: sum(tree_cpu_seconds(pid) for pid in pids) for name, pids in self.services.items()}

    def start(self) -> None:
        self.started = self.sample()

    def stop(self) -> dict[str, float]:
        ended = self.sample()
        return {name: ended[name] - self.started[name] for name in self.services}


def service_environment(env: dict[str, str], home: Path, service: str) -> dict[str, str]:
    """`env` marked as the environment of `service` of `home` (see HOME_MARKER)."""
    return {**env, HOME_MARKER: str(Path(home).resolve()), SERVICE_MARKER: service}


def home_processes(home: Path, service: str | None = None) -> list[psutil.Process]:
    """The running processes marked as services of `home` (of one `service` if named): this user's only
    (another user's environment is unreadable), never this process or its ancestors."""
    mark = str(Path(home).resolve())
    me = psutil.Process()
    spared = {me.pid} | {parent.pid for parent in me.parents()}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in spared:
            continue
        try:
            env = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
        if env.get(HOME_MARKER) == mark and (service is None or env.get(SERVICE_MARKER) == service):
            found.append(proc)
    return found


def stop_home_processes(home: Path, service: str | None = None, timeout: float = 10.0) -> list[int]:
    """SIGTERM every process of `home` (of one `service` if named), SIGKILL what is left after `timeout`.
    Returns the pids that were running."""
    procs = home_processes(home, service)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    return [proc.pid for proc in procs]


@dataclass
class ServiceStatus:
    """What `status` says of one server (Label Studio, the ML backend, the rater page)."""

    name: str
    running: bool
    healthy: bool
    pid: int | None
    url: str
    detail: str | None = None  # what else a healthy server tells: its database, the model version it serves

    def describe(self) -> str:
        if self.running and self.healthy:
            detail = f", {self.detail}" if self.detail else ""
            return f"{self.name} is running at {self.url} (pid {self.pid}{detail})"
        if self.running:
            return f"{self.name} (pid {self.pid}) is starting or unhealthy at {self.url}"
        return f"{self.name} is not running"


class ManagedProcess:
    """A named background process with a pid file, a log file and a health check."""

    def __init__(self, name: str, home: Path, healthy: Callable[[], bool], startup_timeout: float = 120.0):
        self.name = name
        self.home = home
        self.pid_file = home / "run" / f"{name}.pid"
        self.log_file = home / "logs" / f"{name}.log"
        self.healthy = healthy
        self.startup_timeout = startup_timeout

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def start(self, cmd: list[str], env: dict[str, str], cwd: Path | None = None,
              on_wait: Callable[[], None] | None = None) -> int:
        """Start (or find running) and wait until healthy. Interrupted or failed: nothing is left running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as log:
                # umask 077: what the service writes (its database, data files, logs) is its owner's only.
                proc = subprocess.Popen(cmd, env=service_environment(env, self.home, self.name), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                        cwd=cwd, umask=0o077)
            pid = proc.pid
            self.pid_file.write_text(str(pid))
        try:
            self.wait_healthy(pid, on_wait)
        except BaseException:
            self.stop()
            raise
        return pid

    def wait_healthy(self, pid: int, on_wait: Callable[[], None] | None = None) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.healthy():
                return
            if not pid_alive(pid):
                raise ProcessError(f"{self.name} exited during start-up; see {self.log_file}:\n{self.log_tail()}")
            if on_wait:
                on_wait()
            time.sleep(0.3)
        raise ProcessError(f"{self.name} was not healthy within {self.startup_timeout:.0f} s; see {self.log_file}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def kill(self) -> bool:
        """SIGKILL the process group at once: nothing of its own clean-up runs (a crash, as tests cause one).
        Returns True if something was running."""
        return self._signal_group(((signal.SIGKILL, 5.0),))

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM the process group, SIGKILL after `timeout`. Returns True if something was running."""
        return self._signal_group(((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)))

    def _signal_group(self, steps) -> bool:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        # A process we started leads its own group (signalling the group reaches its children too); one
        # started by hand from a script shares its parent's group, so only the process itself is signalled.
        try:
            own_group = os.getpgid(pid) == pid
        except ProcessLookupError:
            own_group = False
        for sig, wait in steps:
            try:
                if own_group:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and pid_alive(pid):
                time.sleep(0.1)
            if not pid_alive(pid):
                break
        self.pid_file.unlink(missing_ok=True)
        return True


def niced(command: list[str], niceness: int) -> list[str]:
    """`command` run at `niceness` (0: as is). `nice` execs the command: the pid stays the service's, and the
    processes it starts (gunicorn's workers) inherit the priority."""
    return ["nice", "-n", str(niceness), *command] if niceness else list(command)
