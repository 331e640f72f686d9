"""The crowd flow on the rater page (the Flask app in the test process, on a real store): entry with
Prolific's parameters, consent (a reservation only), the comprehension check (a seat and the slots, the
link and the tasks), the rater page, the finish; and every page
attacked as a stranger (made-up ids, another participant's platform id, a closed study, past the cap,
replayed forms after a lease expired, participant A's session with B's task ids): 4xx and nothing learned.

The worker's part (creating the tasks in Label Studio and copying the queue) is test_real_stack's; here
the queue copy is written as that job writes it, so that these tests need no Label Studio."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from sense7.crowd.lifecycle import assignments_of, expire_leases
from sense7.crowd.participants import Participants, Studies
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.store.tables import crowd_completions, crowd_participants, crowd_released, crowd_slots
from tests.support.crowd import Flow, PID_A, PID_B, TAX, answer_profile, answer_turn, csrf, dump_without_completions, enter_and_consent, entry_url, pass_check, rate_everything


def test_a_participant_consents_fails_once_passes_rates_and_returns_with_the_code(tmp_path):
    flow = Flow(tmp_path)
    client = flow.client()
    check = enter_and_consent(client, PID_A)
    code = re.search(r'id="resume-code">(\w+)<', check).group(1)
    assert "2 attempts left" not in check
    # Consent is a reservation only (issue 37): no slot, no link, no task until the check is passed.
    rater = flow.rater(PID_A)
    participants = Participants(flow.store, flow.study)
    assert participants.get(rater).state == "checking" and participants.get(rater).lease_until is not None
    assert assignments_of(flow.store, flow.study).of(rater) == [] and flow.prepared == []
    again = pass_check(client, check, right=False)
    assert again.status_code == 200 and "1 attempt left" in again.get_data(as_text=True)
    passed = pass_check(client, again.get_data(as_text=True))
    assert passed.headers["Location"].endswith("/s/pilot/wait")
    assert flow.prepared == [("pilot", rater)]  # the tasks asked for at the check, once
    assert len(assignments_of(flow.store, flow.study).of(rater)) == 2
    assert participants.get(rater).state == "rating"
    assert client.get("/s/pilot/wait").headers["Location"].endswith("/")
    rated = rate_everything(client)
    assert len(rated) == 2 * 2  # N=2 conversations of 2 turns
    finished = client.get("/done")
    assert finished.headers["Location"].endswith("/s/pilot/finish")
    final = client.get("/s/pilot/finish")
    # The page sends the browser on to the platform by itself (a meta refresh and a link, not an HTTP
    # redirect, which browsers refuse at the end of a form's redirect chain under form-action 'self').
    text = final.get_data(as_text=True)
    assert final.status_code == 200 and "DONE1234" in text
    assert 'content="0; url=https://app.prolific.com/submissions/complete?cc=DONE1234"' in text
    participants = Participants(flow.store, flow.study)
    assert participants.get(rater).state == "completed"
    assert [r["platform_id"] for r in participants.completions()] == [PID_A]
    assert participants.completions()[0]["outcome"] == "completed"
    # Coming back (same browser) with the same link: the finish again, never a second assignment.
    assert client.get(entry_url(PID_A)).headers["Location"].endswith("/s/pilot/finish")
    # The platform id is in the completions table and nowhere else in the store.
    assert PID_A not in dump_without_completions(flow.store)
    assert code not in dump_without_completions(flow.store)  # only the resume code's hash is kept


def test_decline_records_only_the_answer_and_ends_with_the_no_consent_code(tmp_path):
    flow = Flow(tmp_path)
    client = flow.client()
    page = client.get(entry_url(PID_B)).get_data(as_text=True)
    declined = client.post("/s/pilot/consent", data={"csrf_token": csrf(page), "consent": "decline"})
    assert declined.status_code == 200 and "NOCONS99" in declined.get_data(as_text=True)
    with flow.store.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(select(crowd_participants)).mappings()]
        assert conn.execute(select(crowd_completions)).all() == []
        assert conn.execute(select(crowd_slots)).all() == []  # a decline takes no slot
    assert len(rows) == 1 and rows[0]["consent"] == "declined" and rows[0]["seat"] is None
    assert rows[0]["consent_version"] == flow.study.consent_version and rows[0]["resume_hash"] is None
    assert PID_B not in dump_without_completions(flow.store)
    assert flow.prepared == []


def test_failing_the_check_twice_asks_to_return_the_submission_with_the_screen_out_code(tmp_path):
    flow = Flow(tmp_path)
    client = flow.client()
    check = enter_and_consent(client, PID_A)
    first = pass_check(client, check, right=False)
    second = pass_check(client, first.get_data(as_text=True), right=False)
    text = second.get_data(as_text=True)
    assert second.status_code == 200 and "SCREEN77" in text and "return your submission" in text
    assert "reject" in text  # "you will not be rejected"
    # Nothing was ever held (issue 37): no slot, no link, no task, no seat.
    rater = flow.rater(PID_A)
    assert assignments_of(flow.store, flow.study).of(rater) == [] and flow.prepared == []
    with flow.store.engine.connect() as conn:
        assert conn.execute(select(crowd_released)).all() == []
    assert rater not in LinkBook(flow.store).active() and Participants(flow.store, flow.study).get(rater).seat is None
    assert "SCREEN77" in client.get("/s/pilot/wait").get_data(as_text=True)
    for path in ["/", "/profile", "/task/1000", "/task/1001"]:
        assert client.get(path).status_code == 404, path
    # A replayed right answer after the screen-out changes nothing.
    replay = pass_check(client, check, right=True)
    assert "SCREEN77" in replay.get_data(as_text=True)
    participants = Participants(flow.store, flow.study)
    assert participants.counts()["screened_out"] == 1 and participants.completions()[0]["outcome"] == "screened_out"


def test_strangers_get_nothing(tmp_path):
    flow = Flow(tmp_path, cap=2)
    a = flow.client()
    check = enter_and_consent(a, PID_A)
    code = re.search(r'id="resume-code">(\w+)<', check).group(1)
    pass_check(a, check)
    rater_a = flow.prepared[0][1]
    a_tasks = [i.task_id for i in RaterQueue(flow.store).items(rater_a)]
    not_found = flow.client().get("/no-such-page").get_data(as_text=True)

    # Made-up and malformed platform ids: the same plain page.
    stranger = flow.client("10.0.0.9")
    for bad in ["", "x" * 65, "<script>", "a b", "ＡＢＣ", "abc;drop"]:
        response = stranger.get(entry_url(bad))
        assert response.status_code == 400 and "This link is not valid" in response.get_data(as_text=True)
    assert stranger.get("/s/pilot").status_code == 400
    assert stranger.get("/s/nostudy?PROLIFIC_PID=abc").get_data(as_text=True) == not_found
    # Another participant's platform id, without their session or resume code: the resume form only.
    other = stranger.get(entry_url(PID_A))
    text = other.get_data(as_text=True)
    assert other.status_code == 200 and "resume code" in text and "I agree" not in text
    for path in ["/", "/profile", "/done", "/s/pilot/check", "/s/pilot/wait", "/s/pilot/finish",
                 *[f"/task/{t}" for t in a_tasks]]:
        response = stranger.get(path)
        assert response.status_code == 404 and response.get_data(as_text=True) == not_found, path
    # A guessed resume code.
    html = stranger.get("/s/pilot/resume").get_data(as_text=True)
    wrong = stranger.post("/s/pilot/resume", data={"csrf_token": csrf(html), "code": "ABCDEFGHJK"})
    assert wrong.status_code == 404 and rater_a not in wrong.get_data(as_text=True)
    # Consent posted without an entry: 404.
    assert stranger.post("/s/pilot/consent", data={"csrf_token": csrf(html), "consent": "agree"}).status_code == 404

    # Participant B (the last seat), holding A's task ids.
    b = flow.client("10.0.0.2")
    pass_check(b, enter_and_consent(b, PID_B))
    rater_b = flow.prepared[1][1]
    assert b.get("/s/pilot/wait").status_code == 303
    b_queue = RaterQueue(flow.store).items(rater_b)
    assert b.get(f"/task/{b_queue[1].task_id}").status_code == 200
    for task_id in a_tasks:
        assert b.get(f"/task/{task_id}").status_code == 404
        assert b.post(f"/task/{task_id}", data={"csrf_token": csrf(html), "revision": "1"}).status_code in (400, 404)

    # Past the cap: a clear page, no seat, no slot.
    late = flow.client("10.0.0.3").get(entry_url("7" * 24))
    assert late.status_code == 403 and "full" in late.get_data(as_text=True)
    assert Participants(flow.store, flow.study).seated() == 2
    # A closed study.
    Studies(flow.store).set_open("pilot", False)
    closed = flow.client("10.0.0.4").get(entry_url("8" * 24))
    assert closed.status_code == 403 and "closed" in closed.get_data(as_text=True)
    Studies(flow.store).set_open("pilot", True)

    # The right resume code elsewhere continues A's visit (and only A's).
    elsewhere = flow.client("10.0.0.5")
    html = elsewhere.get("/s/pilot/resume").get_data(as_text=True)
    resumed = elsewhere.post("/s/pilot/resume", data={"csrf_token": csrf(html), "code": code.lower()})
    assert resumed.status_code == 303 and resumed.headers["Location"].endswith("/s/pilot/wait")
    assert elsewhere.get(f"/task/{a_tasks[1]}").status_code == 200
    assert elsewhere.get(f"/task/{b_queue[1].task_id}").status_code == 404
    # A's first browser lost its rater-page session (one device at a time).
    assert a.get(f"/task/{a_tasks[1]}").status_code == 404

    # Lease expired: A's forms replayed after it get 404, their conversations go back to the pool.
    page = elsewhere.get(f"/task/{a_tasks[1]}").get_data(as_text=True)
    later = datetime.now(timezone.utc) + timedelta(minutes=flow.study.lease_minutes + 1)
    assert expire_leases(flow.store, later).participants == 2
    form = {"csrf_token": csrf(page), "revision": "1", "rendered_at": "1",
            TAX.expectation_key: TAX.expectation_values[-1], **{c: "3" for c in TAX.controls}}
    assert elsewhere.post(f"/task/{a_tasks[1]}", data=form).status_code == 404
    assert elsewhere.get("/s/pilot/wait").status_code == 403
    assert "run out" in elsewhere.get(entry_url(PID_A), follow_redirects=True).get_data(as_text=True)


def test_entries_are_rate_limited_per_address(tmp_path):
    flow = Flow(tmp_path, cap=1000)
    client = flow.client("10.9.9.9")
    codes = [client.get(entry_url(f"{i:024x}")).status_code for i in range(40)]
    assert codes.count(200) == 30 and codes[-1] == 429  # SENSE7_RATER_PAGE_LINK_LIMIT: 30 per minute
    assert flow.client("10.9.9.8").get(entry_url("f" * 24)).status_code == 200  # others still enter


def test_a_participant_turned_away_as_full_sees_it_at_the_check_and_the_slots_go_to_the_next_one(tmp_path):
    flow = Flow(tmp_path, pool=2, k=1, n=2)  # one participant's assignment fills the pool
    a = flow.client("10.0.0.1")
    pass_check(a, enter_and_consent(a, PID_A))
    rater_a = flow.rater(PID_A)
    held = assignments_of(flow.store, flow.study).of(rater_a)
    assert len(held) == 2
    # A holds every slot: a new entry is told at once that the study is full (nothing to check for).
    b = flow.client("10.0.0.2")
    full = b.get(entry_url(PID_B))
    assert full.status_code == 403 and "full" in full.get_data(as_text=True)
    assert Participants(flow.store, flow.study).get(flow.rater(PID_B)) is None  # nothing stored
    # A walks away: the lease ends, A's slots go back, and the next participant gets them.
    later = datetime.now(timezone.utc) + timedelta(minutes=flow.study.lease_minutes + 1)
    assert expire_leases(flow.store, later).released == 2
    c = flow.client("10.0.0.3")
    check_c = enter_and_consent(c, "7" * 24)
    assert pass_check(c, check_c).headers["Location"].endswith("/s/pilot/wait")
    rater_c = flow.rater("7" * 24)
    assert assignments_of(flow.store, flow.study).of(rater_c) == held
    assert assignments_of(flow.store, flow.study).of(rater_a) == []
    assert assignments_of(flow.store, flow.study).coverage()["in_lease"] == 2
    assert len(rate_everything(c)) == 2 * 2


def test_a_participant_who_walks_away_during_the_check_holds_nothing_and_ends_with_the_reservation(tmp_path):
    flow = Flow(tmp_path)
    client = flow.client()
    check = enter_and_consent(client, PID_A)
    rater = flow.rater(PID_A)
    assert expire_leases(flow.store).participants == 0  # the reservation runs from consent
    later = datetime.now(timezone.utc) + timedelta(minutes=flow.study.check_minutes + 1)
    expired = expire_leases(flow.store, later)
    assert (expired.participants, expired.released) == (1, 0)  # it held nothing to give back
    assert Participants(flow.store, flow.study).get(rater).state == "abandoned"
    assert assignments_of(flow.store, flow.study).of(rater) == [] and flow.prepared == []
    assert pass_check(client, check).status_code == 403  # "run out"
    assert client.get("/s/pilot/wait").status_code == 403


def test_an_answer_sends_the_participant_straight_to_their_next_turn_and_the_last_one_to_the_finish(tmp_path):
    """The next turn is one request away after an answer (the redirect names it, as "/" would have chosen it);
    after the last turn the answer goes to "/", which decides (here: the finish)."""
    flow = Flow(tmp_path)
    client = flow.client()
    pass_check(client, enter_and_consent(client, PID_A))
    rater = flow.rater(PID_A)
    locations = []
    response = client.get("/")
    for _ in range(20):
        location = response.headers.get("Location", "")
        if "/profile" in location:
            response = answer_profile(client)
            assert response.status_code == 303
            response = client.get("/")
            continue
        if "/task/" not in location:
            break
        response = answer_turn(client, int(location.rsplit("/task/", 1)[1]))
        assert response.status_code == 303
        locations.append(response.headers["Location"])
    turns = [i.task_id for i in RaterQueue(flow.store).items(rater) if i.kind == "rating"]
    assert len(turns) == 4 and all(i.answer for i in RaterQueue(flow.store).items(rater))
    # Each answer but the last names the next turn itself; the last goes to "/", which sends on to the finish.
    assert [loc.rsplit("/task/", 1)[-1] for loc in locations[:-1]] == [str(t) for t in turns[1:]]
    assert locations[-1].endswith("/") and "/task/" not in locations[-1]
    assert client.get("/").headers["Location"].endswith("/done")
