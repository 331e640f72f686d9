"""A crowd study on disk for the tests: study file, consent text and a pool of conversations."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlencode

import requests
from sqlalchemy import select

from sense7.crowd.lifecycle import conversations_for, install_study
from sense7.crowd.participants import Studies, pseudonymous_id, study_secret
from sense7.store.rater_page_tables import RaterQueue
from sense7.store.database import Store
from sense7.store.tables import metadata
from sense7.labelstudio.protocol import rating_tasks
from sense7.rater_page.app import create_app
from sense7.settings import Settings
from sense7.taxonomy import load_taxonomy
from tests.support.jobs import wait_for

CONSENT = "# Consent\n\nYou will rate replies of an AI assistant. Your answers are kept under a pseudonym.\n"


def pool_lines(n: int, turns: int = 2, prefix: str = "pool") -> list[str]:
    lines = []
    for i in range(n):
        messages = []
        for t in range(turns):
            messages += [{"role": "user", "content": f"{prefix} {i} question {t}: I feel stuck with my thesis draft."},
                         {"role": "assistant", "content": f"{prefix} {i} reply {t}: That sounds hard; what part feels stuck?"}]
        lines.append(json.dumps({"conversation_id": f"{prefix}{i:03d}", "rater_id": "owner",
                                 "context": {"task_type": "advice", "emotional_state": 3,
                                             "empathy_wanted": 4}, "messages": messages}))
    return lines


def write_study(folder: Path, pool: int = 6, turns: int = 2, k: int = 2, n: int = 2, cap: int = 50,
                lease: int = 60, study: str = "pilot", extra: str = "", budget: int | None = None,
                codes: str = "") -> Path:
    """`codes`: more lines of the codes mapping (e.g. "  full: FULL4242\n")."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "consent.md").write_text(CONSENT)
    (folder / "pool.jsonl").write_text("\n".join(pool_lines(pool, turns)) + "\n")
    path = folder / "study.yaml"
    path.write_text(f"""study: {study}
consent: consent.md
comprehension:
  - question: What does "Continuity" mean here?
    choices: ["The reply follows on from what was said", "The reply is long", "The reply is polite"]
    answer: 1
  - question: A reply ignores what the user said. How continuous is it?
    choices: ["Very", "Not at all"]
    answer: 2
raters_per_conversation: {k}
{f"turns_per_participant: {budget}" if budget is not None else f"conversations_per_participant: {n}"}
lease_minutes: {lease}
participant_cap: {cap}
codes:
  completion: DONE1234
  completion_url: https://app.prolific.com/submissions/complete?cc=DONE1234
  no_consent: NOCONS99
  screen_out: SCREEN77
{codes}pool: pool.jsonl
{extra}""")
    return path


TAX = load_taxonomy()


PID_A, PID_B = "5f3a9c0d1e2b4a6c8d0e1f2a", "60b1c2d3e4f5a6b7c8d9e0f1"


class Flow:
    def __init__(self, tmp_path, cap=50, pool=6, k=2, n=2, env: dict | None = None, codes: str = "", extra: str = ""):
        self.store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        self.store = Store(self.store_url)
        self.study, _ = install_study(self.store, write_study(tmp_path / "s", cap=cap, pool=pool, k=k, n=n,
                                                              codes=codes, extra=extra), TAX)
        Studies(self.store).set_open("pilot", True)
        self.settings = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": self.store_url,
                                           **(env or {})})
        self.prepared: list[tuple[str, str]] = []
        self.next_id = 1000
        self.app = create_app(self.settings, taxonomy=TAX, store=self.store, request_prepare=self.prepare)
        self.app.testing = True

    def prepare(self, study_id: str, rater_id: str) -> None:
        """What the worker's job leaves in the store: the queue copy of the participant's new tasks."""
        self.prepared.append((study_id, rater_id))
        items = [{"task_id": self.next_id, "kind": "profile", "position": -1, "conversation_id": None,
                  "turn_index": None, "data": {"task_key": f"profile::{rater_id}"}, "prediction": None, "answer": None}]
        tasks = [t for c in conversations_for(self.store, self.study, rater_id) for t in rating_tasks(c)]
        for position, task in enumerate(tasks, start=1):
            d = task["data"]
            items.append({"task_id": self.next_id + position, "kind": "rating", "position": position - 1,
                          "conversation_id": d["conversation_id"], "turn_index": d["turn_index"],
                          "data": {"history": d["history"], "turn": d["turn"], "repeat": False, "instructed": None},
                          "prediction": None, "answer": None})
        self.next_id += 100
        RaterQueue(self.store).replace(rater_id, items)

    def client(self, address="10.0.0.1"):
        client = self.app.test_client()
        client.environ_base["REMOTE_ADDR"] = address
        return client

    def rater(self, pid: str) -> str:
        """The pseudonymous rater id of a platform id (as the page derives it)."""
        return pseudonymous_id(study_secret(self.settings, "pilot"), "pilot", pid)


def entry_url(pid, study="pilot", **extra) -> str:
    return f"/s/{study}?" + urlencode({"PROLIFIC_PID": pid, "STUDY_ID": "65aa11bb22cc33dd44ee55ff",
                                       "SESSION_ID": "sess" + pid[:8], **extra})


def csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def enter_and_consent(client, pid) -> str:
    page = client.get(entry_url(pid))
    assert page.status_code == 200 and "I agree" in page.get_data(as_text=True)
    answer = client.post("/s/pilot/consent", data={"csrf_token": csrf(page.get_data(as_text=True)), "consent": "agree"})
    assert answer.status_code == 303 and answer.headers["Location"].endswith("/s/pilot/check")
    return client.get("/s/pilot/check").get_data(as_text=True)


def pass_check(client, html, right=True):
    form = {"csrf_token": csrf(html), "q1": "1" if right else "2", "q2": "2"}
    return client.post("/s/pilot/check", data=form)


def answer_profile(client):
    """The questionnaire answered (each field's first choice or minimum); the POST's response."""
    html = client.get("/profile").get_data(as_text=True)
    form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
            **{f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in TAX.profile_fields}}
    return client.post("/profile", data=form)


def answer_turn(client, task_id: int):
    """Turn `task_id` answered (3 on every control, the last expectation); the POST's response."""
    html = client.get(f"/task/{task_id}").get_data(as_text=True)
    form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
            TAX.expectation_key: TAX.expectation_values[-1], **{c: "3" for c in TAX.controls}}
    return client.post(f"/task/{task_id}", data=form)


def rate_everything(client) -> list[int]:
    """Questionnaire then every turn through the ordinary rater page; the task ids rated."""
    rated = []
    response = client.get("/")
    for _ in range(50):
        location = response.headers.get("Location", "")
        if "/profile" in location:
            response = answer_profile(client)
        elif "/task/" in location:
            task_id = int(location.rsplit("/", 1)[1])
            response = answer_turn(client, task_id)
            rated.append(task_id)
        else:
            return rated
        assert response.status_code == 303
        response = client.get("/")
    raise AssertionError("never finished")


def dump_without_completions(store) -> str:
    out = []
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            if table.name != "crowd_completions":
                out += [repr(tuple(r)) for r in conn.execute(select(table))]
    return "\n".join(out)


def table_rows(store, table) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(table)).mappings()]




def until(condition, timeout: float = 120.0, what: str = "condition"):
    """Poll until condition() is truthy; return its value (tests.support.jobs.wait_for, every half second)."""
    return wait_for(condition, timeout=timeout, interval=0.5, what=what)


def open_study(rt, folder: Path, **design):
    """The study `write_study(folder, **design)` writes, installed in `rt`'s store and opened to entries."""
    study, _ = install_study(rt.store, write_study(folder, **design), rt.taxonomy)
    Studies(rt.store).set_open(study.study_id, True)
    return study


def participant_ids(store) -> list[str]:
    from sense7.store.tables import crowd_participants

    with store.engine.connect() as conn:
        return [r.rater_id for r in conn.execute(select(crowd_participants.c.rater_id))]


def participants_conversations(store, rater) -> list[str]:
    from sense7.store.tables import crowd_slots

    with store.engine.connect() as conn:
        return [r.conversation_id for r in conn.execute(select(crowd_slots.c.conversation_id)
                                                        .where(crowd_slots.c.rater_id == rater))]


def consent_session(url: str, pid: str, passed: bool = True) -> requests.Session:
    """Enter and agree; then (`passed`) pass the check: a seat and the slots, the tasks asked for."""
    browser = requests.Session()
    consent = browser.get(f"{url}/s/pilot?PROLIFIC_PID={pid}", timeout=30)
    check = browser.post(f"{url}/s/pilot/consent", data={"csrf_token": csrf(consent.text), "consent": "agree"},
                         timeout=30)
    assert "resume-code" in check.text  # at the check: a reservation, nothing held
    if passed:
        done = browser.post(f"{url}/s/pilot/check", data={"csrf_token": csrf(check.text), "q1": "1", "q2": "2"},
                            timeout=30, allow_redirects=False)
        assert done.headers["Location"].endswith("/s/pilot/wait")
    return browser

def enter_and_pass(url: str, pid: str) -> tuple[requests.Session, requests.Response]:
    browser = requests.Session()
    consent = browser.get(f"{url}/s/pilot?PROLIFIC_PID={pid}", timeout=30)
    check = browser.post(f"{url}/s/pilot/consent", data={"csrf_token": csrf(consent.text), "consent": "agree"},
                         timeout=30)
    passed = browser.post(f"{url}/s/pilot/check", data={"csrf_token": csrf(check.text), "q1": "1", "q2": "2"},
                          timeout=30, allow_redirects=False)
    assert passed.headers["Location"].endswith("/s/pilot/wait")
    return browser, passed




def answer_crowd_profile(client) -> None:
    html = client.get("/profile").get_data(as_text=True)
    form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
            **{f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in TAX.profile_fields}}
    assert client.post("/profile", data=form).status_code == 303


def rate_turn(client, task_id: int) -> None:
    html = client.get(f"/task/{task_id}").get_data(as_text=True)
    form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
            TAX.expectation_key: TAX.expectation_values[-1], **{c: "3" for c in TAX.controls}}
    assert client.post(f"/task/{task_id}", data=form).status_code == 303
