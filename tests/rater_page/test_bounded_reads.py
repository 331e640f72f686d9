"""The rater page bounds its reads (issue 37, item 5; sense7/rater_page/bounded_worker.py): connections that send
part of a request's head and then nothing, or drip it a byte at a time, hold no thread and are closed after
SENSE7_RATER_PAGE_READ_TIMEOUT; a body shorter than its Content-Length is answered 408 and the worker goes on
serving. With gunicorn's stock gthread worker each of these held a thread until the client gave up: the tests
fail on it (checked by planting `worker_class = "gthread"` back)."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest
import requests

from tests.support.rater_page import TAXONOMY_WITH_CHECK, build, csrf_of, gunicorn_page, hidden, rating_form, stored_rows

HELD, DRIPPING = 20, 3


class Holder(threading.Thread):
    """What an attacker does: keeps `held` connections that sent part of a header line and then nothing,
    and `dripping` ones that send one more byte of an endless header line every 0.2 s; a connection the
    server closes is counted and replaced at once, so that that many are held all along."""

    def __init__(self, host: str, port: int, held: int, dripping: int):
        super().__init__(daemon=True)
        self.address, self.wanted = (host, port), {"held": held, "dripping": dripping}
        self.open: dict[socket.socket, str] = {}
        self.closed_by_server = {"held": 0, "dripping": 0}
        self.ready, self.stopping = threading.Event(), threading.Event()

    def connect(self, kind: str) -> None:
        sock = socket.create_connection(self.address, timeout=10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + (b"a" if kind == "dripping" else b"abc"))
        sock.setblocking(False)
        self.open[sock] = kind

    def run(self) -> None:
        for kind, count in self.wanted.items():
            for _ in range(count):
                self.connect(kind)
        self.ready.set()
        while not self.stopping.is_set():
            readable, _, _ = select.select(list(self.open), [], [], 0.2)
            for sock in readable:
                try:
                    data = sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                assert data == b"", data  # the server never answers a head that is not whole
                kind = self.open.pop(sock)
                sock.close()
                self.closed_by_server[kind] += 1
                self.connect(kind)
            for sock, kind in list(self.open.items()):
                if kind == "dripping":
                    try:
                        sock.send(b"a")
                    except OSError:
                        pass  # closed: the next select reads the end

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        for sock in self.open:
            sock.close()


def wait_for(condition, limit: float = 120.0) -> bool:
    """Poll `condition` until it holds; False after `limit` seconds (a failure bound, not a timing claim)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.slow
def test_twenty_held_and_dripping_connections_hold_no_thread_and_are_closed(job_stack):
    """Before: 16 connections sending a partial header line held every thread (2 x 8); /healthz took over 5 s.
    Now, on one worker with 4 threads: 20 held and 3 dripping connections, kept up all along, and /healthz
    and a rater's link and task page answer; the server closes every one of them after the read timeout."""
    ps = build(job_stack, page_env={"SENSE7_RATER_PAGE_READ_TIMEOUT": "2"})
    holder = Holder("127.0.0.1", int(ps.url.rsplit(":", 1)[1]), HELD, DRIPPING)
    holder.start()
    try:
        assert holder.ready.wait(30)
        for _ in range(5):
            assert requests.get(f"{ps.url}/healthz", timeout=10).status_code == 200
        rater = ps.raters[0]["rater_id"]
        session = ps.session_for(rater)  # opening the link copies the rater's queue from Label Studio
        first = ps.rating_tasks(rater)[0].id
        task = session.get(f"{ps.url}/task/{first}", timeout=30)
        assert task.status_code == 200 and f'action="/task/{first}"' in task.text, task.status_code
        # Each of the first 20 held and 3 dripping connections was closed by the server (the dripping ones
        # although bytes kept coming), and their replacements too, while the page kept answering.
        assert wait_for(lambda: holder.closed_by_server["held"] >= 2 * HELD
                        and holder.closed_by_server["dripping"] >= 2 * DRIPPING), holder.closed_by_server
        assert requests.get(f"{ps.url}/healthz", timeout=10).status_code == 200
    finally:
        holder.stop()
    assert "Traceback" not in ps.page.log_file.read_text()


def post_raw(port: int, head: str, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(head.encode() + body)
    return sock


@pytest.mark.slow
def test_a_short_body_gets_408_and_the_worker_then_serves_others(tmp_path, redis_server):
    """Before: a body shorter than its Content-Length held its thread until the client gave up. Now it is
    answered 408 after the read timeout, nothing is stored, the connection is closed, and the same (single)
    worker serves the next requests; a kept-alive connection that starts its next request and stalls is
    closed too."""
    with gunicorn_page(tmp_path, redis_server.url, SENSE7_RATER_PAGE_WORKERS="1", SENSE7_RATER_PAGE_THREADS="2",
                       SENSE7_RATER_PAGE_READ_TIMEOUT="2") as (url, store, tokens, process):
        port = int(url.rsplit(":", 1)[1])
        session = requests.Session()
        assert session.get(f"{url}/r/{tokens['ha']}", timeout=30).status_code == 200
        page = session.get(f"{url}/task/101", timeout=30).text
        form = {"csrf_token": csrf_of(page), "revision": hidden(page, "revision"),
                "rendered_at": hidden(page, "rendered_at"), **rating_form(TAXONOMY_WITH_CHECK, "4")}
        body = "&".join(f"{k}={v}" for k, v in form.items()).encode()
        cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.get_dict().items())
        head = (f"POST /task/101 HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                f"Cookie: {cookie}\r\nContent-Length: {len(body)}\r\n\r\n")
        # Both threads of the one worker get a short body at once: the whole form but its last 10 bytes.
        shorts = [post_raw(port, head, body[:-10]) for _ in range(2)]
        for short in shorts:
            answer = short.makefile("rb")
            assert answer.readline().split()[1] == b"408"
            headers = []
            while (line := answer.readline()) not in (b"\r\n", b""):
                headers.append(line.strip().lower())
            assert b"connection: close" in headers and b"connection: keep-alive" not in headers
            assert b"did not arrive whole" in answer.read(), "the 408 page, then the connection's end"
            short.close()
        assert stored_rows(store) == []
        # The worker serves others: the same form sent whole is stored.
        whole = post_raw(port, head, body)
        assert whole.makefile("rb").readline().split()[1] == b"303"
        whole.close()
        assert [r["task_id"] for r in stored_rows(store)] == [101]
        # A kept-alive connection: one request answered, then part of the next one's head and nothing.
        kept = post_raw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHo", b"")
        answer = kept.makefile("rb")
        assert answer.readline().startswith(b"HTTP/1.1 200")
        while answer.readline() not in (b"\r\n", b""):
            pass
        assert b'"ok"' in answer.read(len(b'{"status":"ok"}\n'))
        assert answer.read() == b"", "the server closes the stalled kept-alive connection without an answer"
        kept.close()
        assert requests.get(f"{url}/healthz", timeout=10).status_code == 200
    assert "Traceback" not in process.log_file.read_text()


def test_the_read_timeout_setting_is_seconds_above_zero_else_one_clear_error(tmp_path):
    from sense7.settings import Settings, SettingsError

    home = {"SENSE7_HOME": str(tmp_path)}
    assert Settings.from_env(home).rater_page.read_timeout == 5.0
    assert Settings.from_env({**home, "SENSE7_RATER_PAGE_READ_TIMEOUT": "2.5"}).rater_page.read_timeout == 2.5
    for bad in ["0", "-1", "five", "nan", "inf"]:
        with pytest.raises(SettingsError) as refused:
            Settings.from_env({**home, "SENSE7_RATER_PAGE_READ_TIMEOUT": bad})
        assert str(refused.value) == (f"environment variable SENSE7_RATER_PAGE_READ_TIMEOUT: expected a number of "
                                      f"seconds above 0, got {bad!r}")
