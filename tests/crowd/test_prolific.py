"""Prolific's API mode (SENSE7_PROLIFIC_TOKEN) against a local stand-in of the two documented endpoints (real
HTTP on a free port: the one stand-in this calls for, since Prolific cannot be reached from here): an entry
needs a submission holding a place in that Prolific study, for that participant (refused otherwise, nothing
stored); Prolific down lets entries in (fail-open: they hold nothing until the check); beat frees the slots
and seats of returned and timed-out submissions at once."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from sense7.crowd.lifecycle import assignments_of
from sense7.crowd.participants import Participants
from sense7.crowd.prolific import ProlificClient
from sense7.store.tables import crowd_slots
from tests.support.crowd import Flow, enter_and_consent, entry_url, pass_check
from tests.support.crowd import table_rows

TOKEN = "stand-in-token-7f3a"
STUDY = "65aa11bb22cc33dd44ee55ff"  # the STUDY_ID tests.crowd.test_flow.entry_url sends
PIDS = [f"{i + 1:x}" + "ab" * 11 + "c" for i in range(6)]  # distinct first 8 characters: distinct sessions


def session_of(pid: str) -> str:
    return "sess" + pid[:8]  # the SESSION_ID tests.crowd.test_flow.entry_url sends: the submission's id


class StandIn:
    """Prolific's `GET /api/v1/submissions/{id}/` and `GET /api/v1/submissions/?study&status&page&page_size`,
    as documented, over the submissions it holds; answers 401 without `Authorization: Token <TOKEN>`, and
    `down` (an HTTP status) to every request when set. Counts the requests it answered."""

    def __init__(self):
        self.submissions: dict[str, dict] = {}
        self.down: int | None = None
        self.requests: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                stand_in.requests.append(self.path)
                if stand_in.down:
                    return self.answer(stand_in.down, {"error": {"detail": "down"}})
                if self.headers.get("Authorization") != f"Token {TOKEN}":
                    return self.answer(401, {"error": {"detail": "Invalid token."}})
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if parts[:3] == ["api", "v1", "submissions"] and len(parts) == 4:
                    found = stand_in.submissions.get(parts[3])
                    return self.answer(200, found) if found else self.answer(404, {"error": {"detail": "Not found."}})
                if parts == ["api", "v1", "submissions"]:
                    query = {k: v[0] for k, v in parse_qs(url.query).items()}
                    matching = [s for s in stand_in.submissions.values()
                                if s["study_id"] == query.get("study") and s["status"] == query.get("status")]
                    page, size = int(query.get("page", 1)), int(query.get("page_size", 20))
                    chunk = matching[(page - 1) * size: page * size]
                    more = page * size < len(matching)
                    return self.answer(200, {"results": [{"id": s["id"], "participant_id": s["participant"],
                                                          "status": s["status"]} for s in chunk],
                                             "_links": {"next": {"href": f"?page={page + 1}" if more else None}}})
                return self.answer(404, {"error": {"detail": "Not found."}})

            def answer(self, code: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, pid: str, status: str = "ACTIVE", study: str = STUDY, submission: str | None = None) -> None:
        sid = submission or session_of(pid)
        self.submissions[sid] = {"id": sid, "participant": pid, "study_id": study, "status": status,
                                 "started_at": "2026-11-28T10:00:00Z"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def _flow(tmp_path, url: str, **kwargs) -> Flow:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return Flow(tmp_path, env={"SENSE7_PROLIFIC_TOKEN": TOKEN, "SENSE7_PROLIFIC_API_URL": url}, **kwargs)


def test_an_entry_needs_a_submission_holding_a_place_in_that_study(tmp_path, stand_in):
    flow = _flow(tmp_path, stand_in.url)
    stand_in.add(PIDS[0])                                          # ACTIVE: enters
    stand_in.add(PIDS[1], status="RESERVED")                       # a place reserved, not started yet: enters
    stand_in.add(PIDS[2], status="RETURNED")                       # gave the place back
    stand_in.add(PIDS[3], study="7" * 24)                          # active in another study
    stand_in.add("9" * 24, submission=session_of(PIDS[4]))         # the session is someone else's submission
    before = flow.store.snapshot()
    refused = {}
    for pid, url in [(PIDS[2], entry_url(PIDS[2])), (PIDS[3], entry_url(PIDS[3])), (PIDS[4], entry_url(PIDS[4])),
                     (PIDS[5], entry_url(PIDS[5])),                                     # no submission at all
                     ("no-session", f"/s/pilot?PROLIFIC_PID={PIDS[0]}&STUDY_ID={STUDY}")]:
        browser = flow.client()
        page = browser.get(url)
        refused[pid] = page.status_code
        assert "I agree" not in page.get_data(as_text=True) and "not show you taking part" in page.get_data(as_text=True)
        assert browser.post("/s/pilot/consent", data={"consent": "agree"}).status_code in (400, 404)
    assert set(refused.values()) == {403}
    assert flow.store.snapshot() == before  # nothing stored for a refused entry
    for pid in PIDS[:2]:
        browser = flow.client()
        pass_check(browser, enter_and_consent(browser, pid))
        assert Participants(flow.store, flow.study).get(flow.rater(pid)).state == "rating"
    # Every call carried the token as Prolific documents it; none went without.
    assert stand_in.requests and all(p.startswith("/api/v1/submissions/") for p in stand_in.requests)


def test_prolific_down_lets_entries_in_at_once_and_they_still_hold_nothing(tmp_path, stand_in):
    flow = _flow(tmp_path, stand_in.url)
    stand_in.down = 503
    for pid in PIDS[:3]:
        browser = flow.client()
        enter_and_consent(browser, pid)  # fail-open: the consent page, then the check
    # The first entry asked and met the outage; the next ones did not wait on it again (a pause).
    assert len(stand_in.requests) == 1
    participants = Participants(flow.store, flow.study)
    assert participants.counts()["checking"] == 3 and participants.seated() == 0 and table_rows(flow.store, crowd_slots) == []
    # A token Prolific refuses is an outage too (the study is not blocked by a mistyped token), not a refusal.
    (tmp_path / "other").mkdir()
    refused_token = Flow(tmp_path / "other", env={"SENSE7_PROLIFIC_TOKEN": "wrong",
                                                  "SENSE7_PROLIFIC_API_URL": stand_in.url})
    stand_in.down = None
    stand_in.add(PIDS[4])
    browser = refused_token.client()
    assert "I agree" in browser.get(entry_url(PIDS[4])).get_data(as_text=True)
    # Nothing listens there at all: the same.
    (tmp_path / "closed").mkdir()
    closed = Flow(tmp_path / "closed", env={"SENSE7_PROLIFIC_TOKEN": TOKEN, "SENSE7_PROLIFIC_API_URL":
                                            "http://127.0.0.1:9"})
    assert "I agree" in closed.client().get(entry_url(PIDS[5])).get_data(as_text=True)


def test_beat_frees_the_places_of_returned_and_timed_out_submissions_at_once(tmp_path, stand_in):
    from sense7.tasks.crowd_jobs import end_returned_submissions

    flow = _flow(tmp_path, stand_in.url, pool=8, k=1, n=2)
    for pid in PIDS[:3]:
        stand_in.add(pid)
        browser = flow.client()
        pass_check(browser, enter_and_consent(browser, pid))
    stand_in.add(PIDS[3])
    waiting = flow.client()
    enter_and_consent(waiting, PIDS[3])  # still at the check
    participants, assignments = Participants(flow.store, flow.study), assignments_of(flow.store, flow.study)
    assert participants.seated() == 3 and assignments.coverage()["in_lease"] == 6
    for i in range(230):  # other studies' and earlier participants' returns: more than one page
        stand_in.add(f"{i:08x}" + "e" * 16, status="RETURNED")
    stand_in.submissions[session_of(PIDS[0])]["status"] = "RETURNED"
    stand_in.submissions[session_of(PIDS[1])]["status"] = "TIMED-OUT"
    stand_in.submissions[session_of(PIDS[3])]["status"] = "RETURNED"
    client = ProlificClient.from_settings(flow.settings)
    assert end_returned_submissions(flow.store, client) == {"participants": 3, "released": 4}
    states = {pid: participants.get(flow.rater(pid)).state for pid in PIDS[:4]}
    assert states == {PIDS[0]: "abandoned", PIDS[1]: "abandoned", PIDS[2]: "rating", PIDS[3]: "abandoned"}
    assert participants.seated() == 1 and assignments.coverage()["in_lease"] == 2
    assert any("page=2" in p for p in stand_in.requests)  # every page read
    # A second pass changes nothing; Prolific down: nothing changes and nothing fails.
    assert end_returned_submissions(flow.store, client) == {"participants": 0, "released": 0}
    stand_in.down = 502
    assert end_returned_submissions(flow.store, client) == {"participants": 0, "released": 0}
    # Without a token the API is not used at all.
    (tmp_path / "plain").mkdir()
    assert ProlificClient.from_settings(Flow(tmp_path / "plain").settings) is None


def test_a_pinned_platform_study_refuses_entries_naming_another_and_the_api_asks_about_the_pinned_one(tmp_path,
                                                                                                   stand_in):
    """Without a pinned study id the entry's STUDY_ID is the participant's word: a submission held in any
    Prolific study (here `7` * 24) would pass the API check. `platform.study_id` pins ours."""
    flow = _flow(tmp_path, stand_in.url, extra=f"platform:\n  study_id: {STUDY}\n")
    other = "7" * 24
    stand_in.add(PIDS[0], study=other)   # holds a place, but in another Prolific study
    stand_in.add(PIDS[1])                # holds a place in ours
    before = flow.store.snapshot()
    for url in (entry_url(PIDS[0]).replace(STUDY, other),   # names the study it holds a place in
                entry_url(PIDS[1]).replace(STUDY, other),   # a real participant of ours, the URL changed
                f"/s/pilot?PROLIFIC_PID={PIDS[1]}&SESSION_ID={session_of(PIDS[1])}"):  # no STUDY_ID
        browser = flow.client()
        page = browser.get(url)
        assert page.status_code == 403 and "I agree" not in page.get_data(as_text=True)
        assert browser.post("/s/pilot/consent", data={"consent": "agree"}).status_code in (400, 404)
    assert flow.store.snapshot() == before
    browser = flow.client()
    pass_check(browser, enter_and_consent(browser, PIDS[1]))
    assert Participants(flow.store, flow.study).get(flow.rater(PIDS[1])).state == "rating"


def test_a_pinned_platform_study_is_checked_without_prolifics_api_too(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    flow = Flow(tmp_path, extra=f"platform:\n  study_id: {STUDY}\n")
    assert flow.client().get(entry_url(PIDS[0]).replace(STUDY, "7" * 24)).status_code == 403
    assert "I agree" in flow.client().get(entry_url(PIDS[0])).get_data(as_text=True)


def test_a_platform_study_id_that_is_not_an_id_is_refused_with_its_line(tmp_path):
    from sense7.crowd.study import load_study
    from sense7.readers.formats import FormatError
    from tests.support.crowd import write_study

    path = write_study(tmp_path / "s", extra="platform:\n  study_id: \"a b/../c\"\n")
    with pytest.raises(FormatError) as refused:
        load_study(path)
    assert "platform.study_id" in str(refused.value) and f"{path.name}:" in str(refused.value)
