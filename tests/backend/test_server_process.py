"""`sense7 backend start|status|stop`: a real gunicorn process on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
import requests

from sense7.processes import free_port
from sense7.settings import BACKEND_HOST
from tests.support.backend import PASSWORD, SECRET, USER
from sense7.taxonomy import load_taxonomy, render_rating_config

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def _env(tmp_path, port) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")}
    env.update(SENSE7_HOME=str(tmp_path / "home"), SENSE7_BACKEND_PORT=str(port), SENSE7_BACKEND_USER=USER,
               SENSE7_BACKEND_PASSWORD=PASSWORD, SENSE7_WEBHOOK_SECRET=SECRET, SENSE7_BACKEND_WORKERS="1")
    # (threads: the default, sync workers; the Label Studio integration test runs gthread workers)
    return env


def _cli(env, *args):
    sense7 = os.path.join(os.path.dirname(sys.executable), "sense7")
    return subprocess.run([sense7, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_start_status_stop_and_port_taken(tmp_path):
    port = free_port()
    env = _env(tmp_path, port)
    try:
        started = _cli(env, "backend", "start")
        assert started.returncode == 0, started.stderr
        assert f"running at http://{BACKEND_HOST}:{port}" in started.stdout and "untrained" in started.stdout
        pid_file = tmp_path / "home" / "run" / "ml-backend.pid"
        pid = int(pid_file.read_text())
        status = _cli(env, "backend", "status")
        assert status.returncode == 0 and f"pid {pid}" in status.stdout
        # the real process enforces auth and answers the protocol
        assert requests.get(f"http://{BACKEND_HOST}:{port}/health", timeout=5).status_code == 401
        health = requests.get(f"http://{BACKEND_HOST}:{port}/health", auth=(USER, PASSWORD), timeout=5)
        assert health.json()["model_version"] == "untrained"
        again = _cli(env, "backend", "start")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = _cli(env, "backend", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not pid_file.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _cli(env, "backend", "status").returncode == 1


@pytest.mark.slow  # a `sense7` command in a process of its own
def test_start_refuses_a_taken_port(tmp_path):
    with socket.socket() as blocker:
        blocker.bind((BACKEND_HOST, 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = _cli(_env(tmp_path, port), "backend", "start")
    assert result.returncode == 1
    assert f"port {port} is already in use" in result.stderr
    assert not (tmp_path / "home" / "run" / "ml-backend.pid").exists()


@pytest.fixture(scope="module")
def small_bundles():
    """Two real bundles (tiny synthetic data): v1 and v2 differ only in their version name."""
    from sense7.synthetic import synth
    from sense7.model.bundle import train_bundle

    data = synth.generate(30, 6, seed=5, taxonomy=TAXONOMY).rating_data()
    return train_bundle(data, "v1", TAXONOMY), train_bundle(data, "v2", TAXONOMY)


@pytest.mark.slow
def test_every_gunicorn_worker_follows_a_promotion(tmp_path, small_bundles):
    import time

    from sense7.ml_backend.backend_process import BackendServer

    from sense7.model.registry import ModelRegistry
    from sense7.settings import Settings
    from sense7.taxonomy import load_taxonomy, render_rating_config
    from tests.support.backend import task

    port = free_port()
    settings = Settings.from_env(_env(tmp_path, port))
    registry = ModelRegistry.from_settings(settings)
    registry.add(small_bundles[0], "v1")
    registry.promote("v1")
    server = BackendServer(settings, port=port)
    server.start(workers=2)  # sync workers: the default
    auth = (USER, PASSWORD)
    body = {"tasks": [task(1), task(2, "stranger")], "label_config": render_rating_config(load_taxonomy())}
    try:
        answer = requests.post(f"{server.url}/predict", json=body, auth=auth, timeout=30).json()["results"]
        assert [r["model_version"] for r in answer] == ["v1", "v1"]
        assert all(len(r["result"]) == len(load_taxonomy().controls) for r in answer)
        registry.add(small_bundles[1], "v2")
        registry.promote("v2")
        # Each worker's background thread notices within a second (one query) and loads; nobody restarts.
        deadline, workers = time.monotonic() + 30, {}
        while time.monotonic() < deadline:
            health = requests.get(f"{server.url}/health", auth=auth, timeout=5).json()
            workers[health["worker"]] = health["model_version"]
            if len(workers) == 2 and set(workers.values()) == {"v2"}:
                break
            time.sleep(0.05)
        assert len(workers) == 2 and set(workers.values()) == {"v2"}, workers
        assert server.pid() == int((tmp_path / "home" / "run" / "ml-backend.pid").read_text())
        answer = requests.post(f"{server.url}/predict", json=body, auth=auth, timeout=30).json()["results"]
        assert [r["model_version"] for r in answer] == ["v2", "v2"]
    finally:
        server.stop()


class _CallOnLoad:
    """Pickled as a call of `function(*args)`: unpickling the object calls it (only stdlib functions are
    named in the pickle, so the gunicorn worker unpickles it without importing the tests)."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


@pytest.mark.slow
def test_a_gevent_worker_answers_while_it_loads_a_promotion(tmp_path, small_bundles):
    """Under the gevent worker the follower "thread" is a greenlet: a load that never yields (CPU, or as
    here a blocking system call) held the whole worker, and requests waited for the load's end. Here v2's
    bundle blocks its unpickling in open() of a FIFO until the test opens it for writing (after first
    creating a marker file, so the test knows the load is under way): the request sent meanwhile must be
    answered, by v1, while the load is still blocked."""
    import copy
    import time

    from sense7.ml_backend.backend_process import BackendServer
    from sense7.model.registry import ModelRegistry
    from sense7.settings import Settings
    from tests.support.backend import task

    port = free_port()
    settings = Settings.from_env(_env(tmp_path, port))
    registry = ModelRegistry.from_settings(settings)
    registry.add(small_bundles[0], "v1")
    registry.promote("v1")
    gate, entered = tmp_path / "gate.fifo", tmp_path / "load-entered"
    os.mkfifo(gate)
    slow = copy.copy(small_bundles[1])
    slow.load_gate = [_CallOnLoad(open, str(entered), "w"), _CallOnLoad(open, str(gate), "rb")]
    registry.add(slow, "v2")

    def release() -> bool:
        """Open the FIFO for writing, which lets a reader blocked in open() go on; False: no reader yet."""
        try:
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
            return True
        except OSError:  # ENXIO: nobody has it open for reading
            return False

    server = BackendServer(settings, port=port)
    server.start(workers=1)  # threads 1: the gevent worker (the default)
    auth = (USER, PASSWORD)
    body = {"tasks": [task(1)], "label_config": render_rating_config(load_taxonomy())}
    released = False
    try:
        assert requests.get(f"{server.url}/health", auth=auth, timeout=30).json()["model_version"] == "v1"
        # promote() test-loads v2 in this process: let that load through (and forget its marker).
        feeder = threading.Thread(target=lambda: open(gate, "wb").close(), daemon=True)
        feeder.start()
        registry.promote("v2")
        feeder.join()
        entered.unlink()
        deadline = time.monotonic() + 60
        while not entered.exists():  # the worker's follower noticed the promotion and is loading v2
            assert time.monotonic() < deadline, "the worker never started loading v2"
            time.sleep(0.05)
        answer = requests.post(f"{server.url}/predict", json=body, auth=auth, timeout=60)
        # Answered while v2's load is still blocked: nothing has opened the FIFO for writing yet.
        assert answer.status_code == 200 and answer.json()["results"][0]["model_version"] == "v1"
        assert requests.get(f"{server.url}/health", auth=auth, timeout=60).json()["model_version"] == "v1"
        released = release()
        assert released  # (the load was still waiting in open())
        deadline = time.monotonic() + 60
        while requests.get(f"{server.url}/health", auth=auth, timeout=60).json()["model_version"] != "v2":
            assert time.monotonic() < deadline, "v2 was never served after its load was let through"
            time.sleep(0.05)
    finally:
        if not released:
            release()  # a worker still blocked in the load goes on (or is killed by stop())
        server.stop()


@pytest.mark.slow
def test_two_stacks_share_no_gunicorn_control_socket(tmp_path):
    """gunicorn 24+ opens a control socket at $XDG_RUNTIME_DIR/gunicorn.ctl or ~/.gunicorn/gunicorn.ctl by
    default: every stack on a machine (and the tests) would share one, `gunicornc` would answer for another
    stack's master and the first master to exit would delete it. sense7's gunicorns open none."""
    user_home = tmp_path / "user"
    user_home.mkdir()
    base = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    base["HOME"] = str(user_home)
    backend_env = {**_env(tmp_path / "a", free_port()), "HOME": str(user_home)}
    backend_env.pop("XDG_RUNTIME_DIR", None)
    page_env = {k: v for k, v in base.items() if not k.startswith("SENSE7_")}
    page_env.update(SENSE7_HOME=str(tmp_path / "b" / "home"), SENSE7_RATER_PAGE_PORT=str(free_port()),
                    SENSE7_RATER_PAGE_WORKERS="1", SENSE7_RATER_PAGE_THREADS="2")
    try:
        started = _cli(backend_env, "backend", "start")
        assert started.returncode == 0, started.stderr
        page = _cli(page_env, "rater-page", "start")
        assert page.returncode == 0, page.stderr
        sockets = [p for p in tmp_path.rglob("*") if p.is_socket()]
        assert not (user_home / ".gunicorn").exists() and sockets == [], sockets
    finally:
        _cli(backend_env, "backend", "stop")
        _cli(page_env, "down")  # the rater page and the Redis it started for its home


def _half_open(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` connections that send part of a request's headers and then nothing (no credentials needed)."""
    held = []
    for _ in range(n):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
        held.append(sock)
    return held


@pytest.mark.slow
def test_half_open_connections_and_short_bodies_hold_no_worker(tmp_path):
    """Three half-open connections held both sync workers (Label Studio's /health and /predict timed
    out); a body shorter than its Content-Length held a worker 120 s, then 500 WORKER TIMEOUT. Now: one
    worker, 30 half-open connections, and credentialed requests are answered; the short body gets 408."""
    port = free_port()
    env = _env(tmp_path, port)
    env["SENSE7_BACKEND_READ_TIMEOUT"] = "2"
    held = []
    try:
        assert _cli(env, "backend", "start").returncode == 0
        held = _half_open(BACKEND_HOST, port, 30)
        for _ in range(3):
            health = requests.get(f"http://{BACKEND_HOST}:{port}/health", auth=(USER, PASSWORD), timeout=10)
            assert health.status_code == 200
        short = socket.create_connection((BACKEND_HOST, port), timeout=30)
        token = __import__("base64").b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        short.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Authorization: Basic " + token.encode() + b"\r\nContent-Length: 100000\r\n\r\n{\"tasks\": [")
        status = short.makefile("rb").readline()
        short.close()
        assert status.split()[1] == b"408", status
        # Still serving, and the log names no worker timeout.
        assert requests.get(f"http://{BACKEND_HOST}:{port}/health", auth=(USER, PASSWORD), timeout=10).ok
        # The worker sends a response's headers with its body (ml_backend/gevent_worker.py), and alone when
        # there is no body (HEAD): both framed whole.
        for method in (b"GET", b"HEAD"):
            raw = socket.create_connection((BACKEND_HOST, port), timeout=10)
            raw.sendall(method + b" /health HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + token.encode() + b"\r\n\r\n")
            answer = b""
            while chunk := raw.recv(65536):  # the worker closes after each response
                answer += chunk
            raw.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), answer[:200]
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            assert length > 0 and len(body) == (length if method == b"GET" else 0), answer[:300]
        log = (tmp_path / "home" / "logs" / "ml-backend.log")
        text = log.read_text() if log.exists() else ""
        assert "WORKER TIMEOUT" not in text and "Traceback" not in text
    finally:
        for sock in held:
            sock.close()
        _cli(env, "backend", "stop")
