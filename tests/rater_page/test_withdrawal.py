"""Participants' rights on the real stack (Label Studio, Redis, a worker with beat, the ML backend, the rater
page): a participant reviews their donated conversations before rating and leaves some out; the "withdraw"
button revokes the link at once; `sense7 raters erase --confirm` then leaves nothing of theirs in any store
table, in Label Studio's API (tasks, annotations, users), in the model directory or in the logs, the model
is retrained without them and the version trained on them removed, and the other rater is untouched. The new
routes are attacked as a stranger and as rater A holding rater B's conversation ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import requests
from sqlalchemy import select

from sense7.labelstudio.importer import import_conversations, import_profile_tasks
from sense7.labelstudio.protocol import user_id
from sense7.labelstudio.rater_accounts import account_email
from sense7.privacy.participation import ConversationChoices, Withdrawals
from sense7.store import tables
from sense7.store.rater_page_tables import LinkBook, RaterQueue, token_hash
from sense7.synthetic.toy_study import make_conversations, turn_level
from tests.support.jobs import make_raters, wait_for
from tests.support.rater_page import csrf_of, start_rating_services
from tests.support.rater_page import answer_profile, submit

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

SENSE7 = str(Path(sys.executable).parent / "sense7")
A, B = "withdrawer1", "withdrawer2"


def _study(stack):
    """Two raters with six donated conversations each (A's context names its export), every turn also
    rated in an imported pilot (enough for a retrain without A), the stack serving, one link each."""
    rt = stack.runtime()
    raters = make_raters(2, prefix="withdrawer")
    rt.store.upsert_raters(raters)
    convs = make_conversations([A, B], per_rater=6, turns=3, prefix="wd")
    for conv in convs:
        if conv.rater_id == A:
            conv.context["source"] = "chatgpt"
    import_conversations(rt.client, rt.rating_project, convs, rt.store, taxonomy=rt.taxonomy)
    import_profile_tasks(rt.client, rt.profile_project, [A, B])
    pilot = [{"conversation_id": c.conversation_id, "turn_index": i, "rater_id": c.rater_id, "dimension": control,
              "rating": turn_level(m.content)} for c in convs for i, m in enumerate(c.messages)
             if m.role == "assistant" for control in rt.taxonomy.controls]
    rt.store.import_ratings(pd.DataFrame(pilot))
    url, _ = start_rating_services(stack, rt)
    book = LinkBook(rt.store)
    links = {r: f"{url}/r/{book.issue(r)}" for r in (A, B)}
    from sense7.tasks.delivery import refresh_queues

    assert refresh_queues(rt, [A, B]) == 2
    return rt, url, links, convs


def _tasks(rt, rater: str) -> list:
    return [t for project in (rt.rating_project, rt.profile_project)
            for t in rt.client.tasks.list(project=project, fields="all", page_size=1000)
            if (t.data or {}).get("rater_id") == rater]


def _own_texts(convs, rater: str) -> set[str]:
    return {m.content for c in convs if c.rater_id == rater for m in c.messages if m.role == "user"}


def _rows_of(store, rater: str) -> dict[str, list[str]]:
    snapshot = json.loads(store.snapshot())
    return {name: [r for r in rows if rater in r] for name, rows in snapshot.items()}


def test_choices_before_rating_then_withdrawal_erases_everything_of_theirs(job_stack):
    stack = job_stack
    rt, url, links, convs = _study(stack)
    tax = rt.taxonomy
    not_found = requests.get(f"{url}/no-such-page", timeout=10).text
    a_convs = sorted(c.conversation_id for c in convs if c.rater_id == A)
    b_convs = sorted(c.conversation_id for c in convs if c.rater_id == B)

    # A stranger (only the URL) gets the bare 404 (or the CSRF refusal) on every new route; nothing changes.
    before = rt.store.snapshot()
    stranger = requests.Session()
    for path in ("/conversations", "/withdraw"):
        response = stranger.get(url + path, timeout=10, allow_redirects=False)
        assert response.status_code == 404 and response.text == not_found, path
    for path, form in (("/conversations/choice", {"conversation": a_convs[0], "study": "out", "release": "out"}),
                       ("/conversations/confirm", {}), ("/withdraw", {})):
        assert stranger.post(url + path, data=form, timeout=10, allow_redirects=False).status_code in (400, 404)
    assert rt.store.snapshot() == before

    # A's first visit shows their donated conversations (scrubbed texts, as stored) before anything is rated.
    a = requests.Session()
    review = a.get(links[A], timeout=30)
    assert review.status_code == 200 and review.url.endswith("/conversations")
    assert _own_texts(convs, A) <= {t for t in _own_texts(convs, A) if t in review.text}
    assert not any(text in review.text for text in _own_texts(convs, B)) and B not in review.text
    assert a.get(f"{url}/", timeout=10, allow_redirects=False).headers["Location"].endswith("/conversations")
    token = csrf_of(review.text)
    # Rater A holding B's conversation ids: 404, nothing recorded.
    for cid in (b_convs[0], "no-such-conversation", ""):
        refused = a.post(f"{url}/conversations/choice", data={"csrf_token": token, "conversation": cid,
                                                               "study": "out", "release": "out"}, timeout=10)
        assert refused.status_code == 404 and refused.text == not_found, cid
    bad = a.post(f"{url}/conversations/choice", data={"csrf_token": token, "conversation": a_convs[0],
                                                       "study": "maybe", "release": "out"}, timeout=10)
    assert bad.status_code == 422
    assert ConversationChoices(rt.store).of(A) == {} and ConversationChoices(rt.store).of(B) == {}
    # A leaves one conversation out of the study and another out of a release.
    for cid, study, release in ((a_convs[0], "out", "in"), (a_convs[1], "in", "out")):
        saved = a.post(f"{url}/conversations/choice", data={"csrf_token": token, "conversation": cid,
                                                             "study": study, "release": release},
                       timeout=10, allow_redirects=False)
        assert saved.status_code == 303
    chosen = ConversationChoices(rt.store).of(A)
    assert (chosen[a_convs[0]].in_study, chosen[a_convs[0]].in_release) == (False, False)
    assert (chosen[a_convs[1]].in_study, chosen[a_convs[1]].in_release) == (True, False)
    assert chosen[a_convs[0]].chosen_at is not None
    left_out = [i.task_id for i in RaterQueue(rt.store).items(A, left_out=True) if i.conversation_id == a_convs[0]]
    assert left_out and all(i.conversation_id != a_convs[0] for i in RaterQueue(rt.store).items(A))
    assert a.get(f"{url}/task/{left_out[0]}", timeout=10).status_code == 404  # not rated: out of the queue
    went_on = a.post(f"{url}/conversations/confirm", data={"csrf_token": token}, timeout=10)
    assert went_on.url.endswith("/profile")
    assert set(ConversationChoices(rt.store).of(A)) == set(a_convs)

    # Both rate: answers reach Label Studio and the store (annotations, history, submissions).
    b = requests.Session()
    assert b.get(links[B], timeout=30).url.endswith("/profile")  # nothing donated: straight to the questionnaire
    for rater, session in ((A, a), (B, b)):
        traits = next(r for r in make_raters(2, prefix="withdrawer") if r["rater_id"] == rater)["traits"]
        answer_profile(session, url, tax, traits)
        for item in [i for i in RaterQueue(rt.store).items(rater) if i.kind == "rating"][:2]:
            assert submit(session, url, item.task_id, tax, 4).status_code == 303

    def synced() -> bool:
        with rt.store.engine.connect() as conn:
            raters = [r for (r,) in conn.execute(select(tables.annotations.c.rater_id))]
        return raters.count(A) >= 2 and raters.count(B) >= 2

    wait_for(synced, timeout=180, what="both raters' answers synced into the store")

    # A served version trained on both.
    from sense7.model.bundle import train_bundle
    from sense7.model.registry import ModelRegistry

    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    registry.add(train_bundle(rt.store.rating_data(tax), "v1", tax), "v1")
    registry.promote("v1")
    assert A in registry.load("v1").known_raters

    a_texts = _own_texts(convs, A)
    a_hash = token_hash(links[A].rsplit("/", 1)[1])
    a_emails = {f"{A}@raters.test", account_email(A)}
    a_accounts = {u.id for u in rt.client.users.list() if (u.email or "").lower() in a_emails}
    assert a_accounts
    b_rows, b_tasks = _rows_of(rt.store, B), {t.id for t in _tasks(rt, B)}

    # The button: the link is revoked at once; the next request with the cookie or the link is a 404.
    page = a.get(f"{url}/withdraw", timeout=10)
    assert page.status_code == 200
    gone = a.post(f"{url}/withdraw", data={"csrf_token": csrf_of(page.text), "rater_id": B}, timeout=10)
    assert gone.status_code == 200 and "withdrawn" in gone.text
    assert a.get(f"{url}/", timeout=10, allow_redirects=False).status_code == 404
    assert requests.get(links[A], timeout=10).status_code == 404
    assert requests.get(links[B], timeout=30).status_code == 200  # B's link, not A's session's target
    assert Withdrawals(rt.store).pending_raters() == {A}

    # Staff confirm; the withdrawal cannot be asked for twice.
    env = {**stack.env, "SENSE7_HOME": str(stack.tmp / "home")}

    def cli(*args):
        return subprocess.run([SENSE7, *args], env=env, capture_output=True, text=True, cwd=stack.tmp, timeout=600)

    twice = cli("raters", "withdraw", A)
    assert twice.returncode == 2 and "already withdrawn" in twice.stderr and twice.stderr.count("\n") == 1
    erased = cli("raters", "erase", "--confirm")
    assert erased.returncode == 0, erased.stderr
    assert "erased (receipt" in erased.stdout and "v1" in erased.stdout and "retrain: queued" in erased.stdout
    again = cli("raters", "withdraw", A)
    assert again.returncode == 2 and "no such rater" in again.stderr
    assert cli("raters", "erase", "--confirm").stdout.strip() == "no withdrawal is waiting"

    # The retrain (queued to the worker) serves a version without A, then v1 is removed.
    wait_for(lambda: registry.current() not in (None, "v1") and "v1" not in [v.name for v in registry.list_versions()], timeout=600,
             what="a new version served and v1 removed")
    assert A not in registry.load(registry.current()).known_raters

    needles = {A, a_hash, *a_emails, *a_texts, *a_convs}
    # Every store table.
    snapshot = rt.store.snapshot()
    assert not [n for n in needles if n in snapshot]
    b_after = _rows_of(rt.store, B)  # B's rows as they were (their queue copy is refreshed by beat meanwhile)
    moving = ("rater_tasks", "model_versions")  # the versions: v1 (trained on B too) replaced by the retrain
    assert {t: rows for t, rows in b_after.items() if t not in moving} == \
        {t: rows for t, rows in b_rows.items() if t not in moving}
    assert len(b_after["rater_tasks"]) == len(b_rows["rater_tasks"])
    receipt = Withdrawals(rt.store).receipts()[0]
    assert receipt["rater_id"] is None and receipt["requested_by"] == "participant"
    assert receipt["counts"]["label_studio"]["tasks"] == len([c for c in convs if c.rater_id == A]) * 3 + 1
    assert receipt["counts"]["store"]["annotations"] == 2  # the two turns (the questionnaire became traits)
    # Label Studio's API: tasks, annotations, users.
    everything = [t for project in (rt.rating_project, rt.profile_project)
                  for t in rt.client.tasks.list(project=project, fields="all", page_size=1000)]
    dumped = json.dumps([{"data": t.data, "annotations": [dict(x) for x in (t.annotations or [])],
                          "predictions": [dict(x) for x in (t.predictions or [])]} for t in everything], default=str)
    assert not [n for n in needles if n in dumped]
    assert not {user_id(dict(x).get("completed_by")) for t in everything for x in (t.annotations or [])} & a_accounts
    users = json.dumps([{"email": u.email, "username": u.username, "id": u.id} for u in rt.client.users.list()])
    assert not [n for n in a_emails if n in users] and not {u.id for u in rt.client.users.list()} & a_accounts
    assert {t.id for t in _tasks(rt, B)} == b_tasks  # B's tasks untouched
    # The model directory and the logs of every process of this stack.
    for path in [p for p in Path(rt.settings.model_dir).rglob("*") if p.is_file()] + list(stack.tmp.rglob("*.log")):
        content = path.read_bytes()
        found = [n for n in needles if n.encode() in content]
        assert not found, (path, found)
    # B goes on rating.
    assert requests.get(links[B], timeout=30).status_code == 200
