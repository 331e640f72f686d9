"""The rater page against what an outside probe tried (issue 23): form values it must refuse, bodies over
the limit, identical submits racing, and link guessing behind a reverse proxy.

No Label Studio is needed here: the store holds the raters' links and queues (as `raters invite` leaves
them), the page runs for real (gunicorn, a private Redis counting failed link openings) or, for
per-request checks, as the same Flask app in the test process."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import requests

from sense7.rater_page.app import create_app
from sense7.settings import Settings
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers
from tests.support.rater_page import csrf_of, hidden
from tests.support.rater_page import gunicorn_page, rating_form, stored_rows
from tests.support.rater_page import CHECK, TAXONOMY_WITH_CHECK, fill_queues

REPO = Path(__file__).resolve().parents[2]


# -- the app in the test process --------------------------------------------------------------------

@pytest.fixture
def page(tmp_path):
    """(make_app(env), store, tokens): the rater page's Flask app on a fresh store with two raters."""
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = Store(store_url)
    tokens = fill_queues(store)

    def make_app(**env):
        settings = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": store_url, **env})
        app = create_app(settings, taxonomy=TAXONOMY_WITH_CHECK, store=store)
        app.testing = True
        return app

    return make_app, store, tokens


def opened(app, token: str, address: str = "127.0.0.1"):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    assert client.get(f"/r/{token}").status_code == 303
    return client


@pytest.mark.parametrize("value", ["\u00b3", "\u0663", "\uff13", " 3", "3 ", "+3", "3.0", "1_0", "", "0", "6",
                                   "-1", "9" * 400])
def test_every_level_is_ascii_digits_in_range_else_422(page, value):
    """`³` passed str.isdigit() and broke int() (a 500 with a traceback); `٣` was stored as 3."""
    make_app, store, tokens = page
    client = opened(make_app(), tokens["ha"])
    csrf = csrf_of(client.get("/task/101").text)
    plain = client.post("/task/101", data={"csrf_token": csrf, "revision": "1", **rating_form(TAXONOMY_WITH_CHECK, value)})
    assert plain.status_code == 422
    checked = client.post("/task/102", data={"csrf_token": csrf, "revision": "1", CHECK.key: value,
                                             **rating_form(TAXONOMY_WITH_CHECK, "3")})
    assert checked.status_code == 422
    assert b"Traceback" not in checked.data
    assert stored_rows(store) == [] and InstructedAnswers(store).frame().empty
    # The same forms with ASCII levels are stored, each value as given.
    assert client.post("/task/102", data={"csrf_token": csrf, "revision": "1", CHECK.key: "2",
                                          **rating_form(TAXONOMY_WITH_CHECK, "3")}).status_code == 303
    assert [r["answer"]["values"] for r in stored_rows(store)] == [{c: 3 for c in TAXONOMY_WITH_CHECK.controls}]
    assert InstructedAnswers(store).frame()["answered"].tolist() == [2]


def test_profile_numbers_go_through_the_same_parser(page):
    make_app, store, tokens = page
    client = opened(make_app(), tokens["hb"])
    csrf = csrf_of(client.get("/profile").text)
    traits = {f.key: (f.choices[0] if f.type == "choice" else str(f.max)) for f in TAXONOMY_WITH_CHECK.profile_fields}
    number = next(f for f in TAXONOMY_WITH_CHECK.profile_fields if f.type == "int")
    for bad in ["\u0663", "\u00b3", f" {number.max}", "1e1"]:
        response = client.post("/profile", data={"csrf_token": csrf, "revision": "1", **traits, number.key: bad})
        assert response.status_code == 422, bad
    assert stored_rows(store) == []
    assert client.post("/profile", data={"csrf_token": csrf, "revision": "1", **traits}).status_code == 303
    assert stored_rows(store)[0]["answer"]["traits"][number.key] == number.max


def test_hidden_fields_out_of_form_never_break_a_submission(page):
    """A tampered revision or page time is treated as absent: stored once, no NaN lead time."""
    make_app, store, tokens = page
    client = opened(make_app(), tokens["ha"])
    csrf = csrf_of(client.get("/task/101").text)
    for revision, rendered_at in [("\u00b3", "inf"), ("\u0663", "nan"), ("-5", "1e400"), ("1", "\u0661\u0662")]:
        response = client.post("/task/101", data={"csrf_token": csrf, "revision": revision,
                                                  "rendered_at": rendered_at, **rating_form(TAXONOMY_WITH_CHECK, "4")})
        assert response.status_code == 303
    rows = stored_rows(store)
    assert len(rows) == 1 and rows[0]["revision"] == 1 and rows[0]["lead_time"] is None


def test_a_valid_link_opens_even_when_its_address_is_over_the_guessing_limit(page):
    make_app, store, tokens = page
    app = make_app(SENSE7_RATER_PAGE_LINK_LIMIT="5 per minute")
    guesser = app.test_client()
    answers = [guesser.get(f"/r/guess{i:040d}").status_code for i in range(7)]
    assert answers == [404] * 5 + [429] * 2
    # The same address holding a real link: opened (others' failures never lock a rater out).
    assert guesser.get(f"/r/{tokens['ha']}").status_code == 303
    assert guesser.get("/").status_code == 303
    assert guesser.get(f"/r/guess{8:040d}").status_code == 429  # while guesses stay limited


def test_behind_a_trusted_proxy_each_client_address_has_its_own_limit(page):
    make_app, store, tokens = page
    proxy = "10.1.2.3"

    def guesses(app, forwarded_for: str | None, n: int, remote: str = proxy) -> list[int]:
        client = app.test_client()
        client.environ_base["REMOTE_ADDR"] = remote
        headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
        return [client.get(f"/r/guess{i:040d}", headers=headers).status_code for i in range(n)]

    behind = make_app(SENSE7_RATER_PAGE_LINK_LIMIT="3 per minute", SENSE7_TRUSTED_PROXIES="1")
    assert guesses(behind, "203.0.113.7", 4) == [404, 404, 404, 429]
    # Another participant behind the same proxy is not locked out by the first one's failures...
    assert guesses(behind, "198.51.100.20", 3) == [404] * 3
    # ...and a forged X-Forwarded-For of more hops than are trusted cannot escape: the address the
    # trusted proxy saw (the last entry) is the one counted.
    assert guesses(behind, "192.0.2.99, 203.0.113.7", 1) == [429]

    # The same with the proxy named by address (a second proxy in front of it too).
    named = make_app(SENSE7_RATER_PAGE_LINK_LIMIT="3 per minute", SENSE7_TRUSTED_PROXIES="10.0.0.0/8, 192.0.2.1")
    assert guesses(named, "203.0.113.7, 192.0.2.1", 4) == [404, 404, 404, 429]
    assert guesses(named, "198.51.100.20, 192.0.2.1", 3) == [404] * 3

    # Without trusted proxies (the default) X-Forwarded-For is ignored: a forged one changes nothing.
    direct = make_app(SENSE7_RATER_PAGE_LINK_LIMIT="3 per minute")
    assert guesses(direct, "203.0.113.7", 3, remote="127.0.0.9") == [404] * 3
    assert guesses(direct, "198.51.100.20", 1, remote="127.0.0.9") == [429]
    # An address that is not a trusted proxy cannot claim to forward for someone else.
    assert guesses(named, "198.51.100.21", 4, remote="127.0.0.10") == [404, 404, 404, 429]
    assert guesses(named, "198.51.100.22", 1, remote="127.0.0.10") == [429]


def test_a_malformed_trusted_proxies_setting_is_one_clear_error(tmp_path):
    for bad in ["two", "10.0.0.300", "-1"]:
        with pytest.raises(ValueError, match="SENSE7_TRUSTED_PROXIES"):
            Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_TRUSTED_PROXIES": bad})


@pytest.mark.slow  # `sense7 rater-page start` in a process of its own
def test_a_malformed_trusted_proxies_setting_stops_the_rater_page_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")},
           "SENSE7_HOME": str(tmp_path / "home"), "SENSE7_TRUSTED_PROXIES": "two"}
    sense7 = str(Path(sys.executable).with_name("sense7"))
    result = subprocess.run([sense7, "rater-page", "start"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: SENSE7_TRUSTED_PROXIES='two': expected a number of proxy hops or proxy addresses separated by "
        "commas (e.g. 1, or 10.0.0.5, or 10.0.0.0/8)"]


# -- the page under gunicorn -------------------------------------------------------------------------


@pytest.fixture
def served_page(tmp_path, redis_server):
    """(url, store, tokens): the rater page under gunicorn (2 workers x 4 threads) on a fresh store."""
    with gunicorn_page(tmp_path, redis_server.url) as (url, store, tokens, _process):
        yield url, store, tokens


@pytest.mark.slow
def test_eight_identical_concurrent_submits_store_one_revision(served_page):
    url, store, tokens = served_page
    session = requests.Session()
    assert session.get(f"{url}/r/{tokens['ha']}", timeout=30).status_code == 200
    cookies = session.cookies.get_dict()
    tasks = [101] + list(range(103, 111))  # every turn without an attention check: nine races
    forms = {}
    for task in tasks:
        page = session.get(f"{url}/task/{task}", timeout=30).text
        forms[task] = {"csrf_token": csrf_of(page), "revision": hidden(page, "revision"),
                       "rendered_at": hidden(page, "rendered_at"), **rating_form(TAXONOMY_WITH_CHECK, "4")}
    for task in tasks:
        start, answers = threading.Barrier(8), []

        def post():
            start.wait()
            answers.append(requests.post(f"{url}/task/{task}", data=forms[task], cookies=cookies, timeout=60,
                                         allow_redirects=False).status_code)

        threads = [threading.Thread(target=post) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers == [303] * 8
    rows = stored_rows(store)
    assert sorted((r["task_id"], r["revision"]) for r in rows) == [(t, 1) for t in tasks]
    # A different answer is the next revision; the first one posted again after it is the one after that.
    for level, expected in [("2", [1, 2]), ("4", [1, 2, 3])]:
        assert requests.post(f"{url}/task/101", data={**forms[101], **rating_form(TAXONOMY_WITH_CHECK, level)},
                             cookies=cookies, timeout=60, allow_redirects=False).status_code == 303
        assert sorted(r["revision"] for r in stored_rows(store) if r["task_id"] == 101) == expected


def _chunked_post(url: str, path: str, cookies: dict, body: bytes) -> int:
    """POST `body` in 16 kB chunks (no Content-Length); the status line, also when the server answers
    before the whole body is sent and closes."""
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n"
                f"Cookie: {'; '.join(f'{k}={v}' for k, v in cookies.items())}\r\n\r\n")
        try:
            sock.sendall(head.encode())
            for i in range(0, len(body), 16384):
                chunk = body[i:i + 16384]
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered early: its answer is waiting
        status = sock.makefile("rb").readline()
    return int(status.split()[1])


@pytest.mark.slow
def test_chunked_bodies_over_the_limit_are_413_and_nothing_is_stored(served_page):
    url, store, tokens = served_page
    session = requests.Session()
    assert session.get(f"{url}/r/{tokens['ha']}", timeout=30).status_code == 200
    page = session.get(f"{url}/task/101", timeout=30).text
    fields = {"csrf_token": csrf_of(page), "revision": "1", "rendered_at": hidden(page, "rendered_at"),
              **rating_form(TAXONOMY_WITH_CHECK, "4")}
    encoded = "&".join(f"{k}={v}" for k, v in fields.items())
    cookies = session.cookies.get_dict()
    for size in (300_000, 3_000_000):
        padded = (encoded + "&" + TAXONOMY_WITH_CHECK.comment_key + "=" + "x" * size).encode()
        assert _chunked_post(url, "/task/101", cookies, padded) == 413
    assert stored_rows(store) == []
    # A small chunked form is fine.
    assert _chunked_post(url, "/task/101", cookies, encoded.encode()) == 303
    assert len(stored_rows(store)) == 1
