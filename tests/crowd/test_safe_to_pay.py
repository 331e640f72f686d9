"""A crowd study safe to pay for (issue 37), on the rater page (the Flask app in the test process, a real SQLite
store, no Label Studio: the worker's queue copy is written as tests/crowd/test_flow.Flow does): no completion
code without the work, no pool held hostage by entries that never pass the check, no step skipped, and no way
back after a withdrawal, before or after the erasure. Each test failed on the code before issue 37."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sense7.crowd.lifecycle import assignments_of, expire_leases, start_rating, status
from sense7.crowd.participants import AlreadyEntered, Participants
from sense7.privacy.participation import ConversationChoices, Withdrawals, erase_rater_rows
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.store.tables import (crowd_completions, crowd_participants, crowd_released, crowd_slots, rater_links,
                                 raters, submissions)
from tests.support.crowd import Flow, PID_A, PID_B, TAX, csrf, dump_without_completions, enter_and_consent, entry_url, pass_check, rate_everything
from tests.support.crowd import answer_crowd_profile as answer_profile
from tests.support.crowd import rate_turn as rate
from tests.support.crowd import table_rows as rows

PIDS = ["%024x" % (0xC0FFEE000 + i) for i in range(12)]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def resume(client, code: str):
    html = client.get("/s/pilot/resume").get_data(as_text=True)
    return client.post("/s/pilot/resume", data={"csrf_token": csrf(html), "code": code})


def resume_code(html: str) -> str:
    return re.search(r'id="resume-code">(\w+)<', html).group(1)


def rating_items(store, rater: str):
    return [i for i in RaterQueue(store).items(rater, left_out=True) if i.kind == "rating"]


# -- 1. completion needs the work ---------------------------------------------------------------------------

def test_a_pool_conversation_cannot_be_left_out_and_the_code_needs_every_assigned_turn(tmp_path):
    flow = Flow(tmp_path)
    a = flow.client()
    pass_check(a, enter_and_consent(a, PID_A))
    rater = flow.rater(PID_A)
    assert a.get("/s/pilot/wait").status_code == 303
    held = assignments_of(flow.store, flow.study).of(rater)
    # "Your conversations" lists a participant's own donated conversations: the pool's are the study's.
    page = a.get("/conversations").get_data(as_text=True)
    assert not any(c in page for c in held) and "pool 0 question" not in page
    for cid in held:
        refused = a.post("/conversations/choice", data={"csrf_token": csrf(page), "conversation": cid,
                                                         "study": "out", "release": "out"})
        assert refused.status_code == 404, cid
    assert ConversationChoices(flow.store).of(rater) == {}
    # A choice stored before this was refused (an older version took it): the conversation leaves the queue,
    # but not the work the code needs.
    ConversationChoices(flow.store).choose(rater, held[0], in_study=False, in_release=False)
    assert len(rate_everything(a)) == 2  # the other conversation's two turns: the queue shows nothing more
    final = a.get("/s/pilot/finish")
    assert "DONE1234" not in final.get_data(as_text=True) and "app.prolific.com" not in final.get_data(as_text=True)
    participants = Participants(flow.store, flow.study)
    assert participants.get(rater).state == "rating"
    assert [r["outcome"] for r in participants.completions()] == ["entered"]
    assert assignments_of(flow.store, flow.study).coverage()["rated"] == 0


def test_the_finish_page_opened_before_every_assigned_turn_is_rated_gives_no_code(tmp_path):
    flow = Flow(tmp_path)
    a = flow.client()
    pass_check(a, enter_and_consent(a, PID_A))
    rater = flow.rater(PID_A)
    participants = Participants(flow.store, flow.study)

    def no_code_yet():
        for path in ("/s/pilot/finish", "/done"):
            page = a.get(path, follow_redirects=True).get_data(as_text=True)
            assert "DONE1234" not in page and "platform-code" not in page, path
        assert participants.get(rater).state == "rating"
        assert [r["outcome"] for r in participants.completions()] == ["entered"]

    no_code_yet()  # before the questionnaire
    answer_profile(a)
    items = rating_items(flow.store, rater)
    assert len(items) == 4
    for item in items:
        no_code_yet()  # every turn but this one (and those after it) rated
        rate(a, item.task_id)
    final = a.get("/s/pilot/finish").get_data(as_text=True)
    assert "DONE1234" in final and participants.get(rater).state == "completed"
    assert assignments_of(flow.store, flow.study).coverage()["rated"] == 2


# -- 2. no hoarding -----------------------------------------------------------------------------------------

def test_an_entry_holds_no_seat_slot_link_or_task_until_the_check_is_passed(tmp_path):
    flow = Flow(tmp_path)
    a = flow.client()
    check = enter_and_consent(a, PID_A)
    rater = flow.rater(PID_A)
    participants = Participants(flow.store, flow.study)
    who = participants.get(rater)
    # A short reservation (check_minutes, 10 by default), nothing else.
    assert who.state == "checking" and _aware(who.lease_until) <= _now() + timedelta(minutes=10)
    assert participants.seated() == 0 and rows(flow.store, crowd_slots) == []
    assert rows(flow.store, rater_links) == [] and flow.prepared == []
    passed_at = _now()
    pass_check(a, check)
    who = participants.get(rater)
    # The check passed: a seat, the slots, the link, the tasks asked for, and the lease of lease_minutes.
    assert who.state == "rating" and who.seat == 0 and len(assignments_of(flow.store, flow.study).of(rater)) == 2
    assert rater in LinkBook(flow.store).active() and flow.prepared == [("pilot", rater)]
    lease = _aware(who.lease_until)
    assert passed_at + timedelta(minutes=flow.study.lease_minutes) <= lease
    # Never restarted: a replayed right answer, a resume elsewhere, the check passed again.
    assert pass_check(a, check).headers["Location"].endswith("/s/pilot/wait")
    assert resume(flow.client("10.0.0.7"), resume_code(check)).status_code == 303
    assert start_rating(flow.store, flow.study, rater) == assignments_of(flow.store, flow.study).of(rater)
    assert _aware(participants.get(rater).lease_until) == lease and len(flow.prepared) == 1


def test_a_flood_of_made_up_ids_holds_nothing_and_every_real_participant_gets_slots(tmp_path):
    # 60 made-up ids from 6 addresses behind the study's reverse proxy (each address under the entry limit),
    # against a pool with room for 6 participants (6 conversations x K=2, N=2 each).
    flow = Flow(tmp_path, pool=6, k=2, n=2, cap=50, env={"SENSE7_TRUSTED_PROXIES": "1"})
    flood = ["%024x" % (0xF100D0000 + i) for i in range(60)]
    for i, pid in enumerate(flood):
        fake = flow.client("10.0.0.254")
        fake.environ_base["HTTP_X_FORWARDED_FOR"] = f"203.0.113.{i % 6}"
        html = fake.get(entry_url(pid)).get_data(as_text=True)
        assert "I agree" in html, pid
        assert fake.post("/s/pilot/consent", data={"csrf_token": csrf(html), "consent": "agree"}).status_code == 303
    participants = Participants(flow.store, flow.study)
    assert participants.counts()["checking"] == 60
    assert rows(flow.store, crowd_slots) == [] and participants.seated() == 0
    assert rows(flow.store, rater_links) == [] and flow.prepared == []  # no task asked for an unchecked entry
    # Real participants, one after the other (the flood still at the check): every one gets their slots.
    for i, pid in enumerate(PIDS[:6]):
        real = flow.client(f"10.1.0.{i}")
        assert pass_check(real, enter_and_consent(real, pid)).headers["Location"].endswith("/s/pilot/wait")
        assert len(assignments_of(flow.store, flow.study).of(flow.rater(pid))) == 2
    assert len(flow.prepared) == 6 and {r for _, r in flow.prepared} == {flow.rater(p) for p in PIDS[:6]}
    # The flood's reservations end: abandoned, and nothing was ever held.
    expired = expire_leases(flow.store, _now() + timedelta(minutes=flow.study.check_minutes + 1))
    assert (expired.participants, expired.released) == (60, 0)
    assert participants.counts()["abandoned"] == 60 and participants.seated() == 6


def test_the_cap_counts_participants_inside_and_frees_the_seats_of_those_who_leave(tmp_path):
    flow = Flow(tmp_path, pool=12, k=3, n=1, cap=4)
    participants = Participants(flow.store, flow.study)
    # One of each way out without completing: screened out, walked away at the check, lease ended, withdrew.
    screened = flow.client("10.0.0.1")
    first = pass_check(screened, enter_and_consent(screened, PIDS[0]), right=False)
    pass_check(screened, first.get_data(as_text=True), right=False)
    walker = flow.client("10.0.0.2")
    enter_and_consent(walker, PIDS[1])
    late = flow.client("10.0.0.3")
    pass_check(late, enter_and_consent(late, PIDS[2]))
    leaver = flow.client("10.0.0.4")
    pass_check(leaver, enter_and_consent(leaver, PIDS[3]))
    leaver.get("/s/pilot/wait")
    form = leaver.get("/withdraw").get_data(as_text=True)
    assert leaver.post("/withdraw", data={"csrf_token": csrf(form)}).status_code == 200
    expire_leases(flow.store, _now() + timedelta(minutes=flow.study.lease_minutes + 1))
    states = {participants.get(flow.rater(p)).state for p in PIDS[:4]}
    assert states == {"screened_out", "abandoned", "withdrawn"} and participants.seated() == 0
    # Entries at the check hold no seat: six reach it with a cap of 4; the first four through it are seated
    # (lowest free numbers), the fifth and sixth are turned away as full with the full page.
    browsers = [flow.client(f"10.2.0.{i}") for i in range(6)]
    checks = [enter_and_consent(b, pid) for b, pid in zip(browsers, PIDS[4:10])]
    for b, html in zip(browsers[:4], checks[:4]):
        assert pass_check(b, html).headers["Location"].endswith("/s/pilot/wait")
    assert sorted(participants.get(flow.rater(p)).seat for p in PIDS[4:8]) == [0, 1, 2, 3]
    turned_away = pass_check(browsers[4], checks[4])
    assert turned_away.status_code == 403 and "full" in turned_away.get_data(as_text=True)
    assert participants.get(flow.rater(PIDS[8])).state == "full" and participants.get(flow.rater(PIDS[8])).seat is None
    # Every seat taken: a new entry is told so at once.
    entry = flow.client("10.3.0.1").get(entry_url(PIDS[10]))
    assert entry.status_code == 403 and "full" in entry.get_data(as_text=True)
    assert participants.get(flow.rater(PIDS[10])) is None


def test_a_participant_turned_away_as_full_sees_the_full_code_and_may_enter_again(tmp_path):
    flow = Flow(tmp_path, pool=2, k=1, n=2, codes="  full: FULL4242\n")
    participants = Participants(flow.store, flow.study)
    b = flow.client("10.0.0.2")
    check_b = enter_and_consent(b, PID_B)  # B reads the consent and the questions ...
    old_code = resume_code(check_b)
    a = flow.client("10.0.0.1")
    pass_check(a, enter_and_consent(a, PID_A))  # ... while A passes the check first and takes every slot
    turned_away = pass_check(b, check_b)
    text = turned_away.get_data(as_text=True)
    assert turned_away.status_code == 403 and "FULL4242" in text and "return your submission" in text
    rater_b = flow.rater(PID_B)
    assert participants.get(rater_b).state == "full" and participants.get(rater_b).seat is None
    assert assignments_of(flow.store, flow.study).of(rater_b) == [] and rater_b not in LinkBook(flow.store).active()
    # Another browser that took B's visit with the resume code (before B enters again).
    other = flow.client("10.0.0.9")
    assert "FULL4242" in resume(other, old_code).get_data(as_text=True)
    # While A holds the pool, B opening the study again is told it is full.
    assert "FULL4242" in b.get(entry_url(PID_B)).get_data(as_text=True)
    # A's lease ends: B enters again from the platform's URL (same browser), agrees, passes and gets the slots.
    expire_leases(flow.store, _now() + timedelta(minutes=flow.study.lease_minutes + 1))
    again = b.get(entry_url(PID_B))
    assert again.status_code == 200 and "I agree" in again.get_data(as_text=True)
    consent = b.post("/s/pilot/consent", data={"csrf_token": csrf(again.get_data(as_text=True)), "consent": "agree"})
    assert consent.headers["Location"].endswith("/s/pilot/check")
    new_check = b.get("/s/pilot/check").get_data(as_text=True)
    assert resume_code(new_check) != old_code
    assert pass_check(b, new_check).headers["Location"].endswith("/s/pilot/wait")
    assert len(assignments_of(flow.store, flow.study).of(rater_b)) == 2 and participants.get(rater_b).seat == 0
    # The earlier entry's session and resume code open nothing any more.
    assert other.get("/s/pilot/check").status_code == 404 and other.get("/s/pilot/wait").status_code == 404
    assert resume(flow.client("10.0.0.8"), old_code).status_code == 404
    assert len(rate_everything(b)) == 4 and "DONE1234" in b.get("/s/pilot/finish").get_data(as_text=True)
    assert [r["outcome"] for r in participants.completions() if r["platform_id"] == PID_B] == ["completed"]


# -- 3. the check cannot be skipped ------------------------------------------------------------------------

def test_nothing_answers_a_participant_before_the_check_and_nothing_they_send_is_credited(tmp_path):
    flow = Flow(tmp_path)
    flow.app.config["WTF_CSRF_ENABLED"] = False  # every refusal below is the page's own, not the CSRF check's
    a = flow.client()
    check = enter_and_consent(a, PID_A)
    rater = flow.rater(PID_A)
    flow.prepare("pilot", rater)  # even with a queue copy in the store (an older version made one at consent)
    task_ids = [i.task_id for i in RaterQueue(flow.store).items(rater)]
    form = {"csrf_token": csrf(check), "revision": "1", "rendered_at": "1", TAX.expectation_key:
            TAX.expectation_values[-1], **{c: "3" for c in TAX.controls},
            **{f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in TAX.profile_fields}}

    def nothing_answers(client):
        for path in ["/", "/profile", "/done", "/conversations", "/withdraw", *[f"/task/{t}" for t in task_ids]]:
            assert client.get(path).status_code == 404, path
        for path in ["/profile", *[f"/task/{t}" for t in task_ids]]:
            assert client.post(path, data=form).status_code == 404, path

    nothing_answers(a)
    # Defence in depth: a link that exists for a participant at the check (planted) answers nothing either.
    token = LinkBook(flow.store).issue(rater, rotate=True)
    planted = flow.client("10.0.0.5")
    assert planted.get(f"/r/{token}").status_code == 303
    nothing_answers(planted)
    # Failing the check twice changes nothing of that.
    pass_check(a, pass_check(a, check, right=False).get_data(as_text=True), right=False)
    nothing_answers(planted)
    assert rows(flow.store, submissions) == [] and rows(flow.store, raters) == []
    assert Participants(flow.store, flow.study).get(rater).state == "screened_out"


# -- 4. withdrawal is final --------------------------------------------------------------------------------

def test_withdrawal_is_final_for_the_link_the_cookies_and_the_resume_code_and_after_the_erasure(tmp_path):
    flow = Flow(tmp_path)
    participants = Participants(flow.store, flow.study)
    a = flow.client()
    check = enter_and_consent(a, PID_A)
    code = resume_code(check)
    pass_check(a, check)
    rater = flow.rater(PID_A)
    held = assignments_of(flow.store, flow.study).of(rater)
    a.get("/s/pilot/wait")
    answer_profile(a)
    rate(a, rating_items(flow.store, rater)[0].task_id)
    unrated = rating_items(flow.store, rater)[1].task_id
    second = flow.client("10.0.0.2")  # the same participant's other browser, through the resume code
    assert resume(second, code).headers["Location"].endswith("/s/pilot/wait")
    form = second.get("/withdraw").get_data(as_text=True)
    gone = second.post("/withdraw", data={"csrf_token": csrf(form)})
    assert gone.status_code == 200 and "return your submission" in gone.get_data(as_text=True)
    assert "DONE1234" not in gone.get_data(as_text=True)

    def nothing_opens():
        for browser in (a, second):
            for path in ("/", "/profile", f"/task/{unrated}", "/done"):
                assert browser.get(path).status_code == 404, path
            for path in ("/s/pilot/finish", "/s/pilot/wait", "/s/pilot/check"):
                page = browser.get(path, follow_redirects=True).get_data(as_text=True)
                assert "DONE1234" not in page and "I agree" not in page, path
        fresh = flow.client("10.0.0.3")
        resumed = resume(fresh, code)  # the rotation used to un-revoke the link here
        assert "DONE1234" not in resumed.get_data(as_text=True)
        assert fresh.get("/").status_code == 404 and rater not in LinkBook(flow.store).active()
        assert LinkBook(flow.store).issue(rater, rotate=True) is None
        entry = flow.client("10.0.0.4").get(entry_url(PID_A))
        assert "I agree" not in entry.get_data(as_text=True)

    nothing_opens()
    # The participant's slots went back to the pool at once, their seat is free; no completion.
    assert assignments_of(flow.store, flow.study).of(rater) == [] and participants.seated() == 0
    assert sorted(r["conversation_id"] for r in rows(flow.store, crowd_released)) == sorted(held)
    assert participants.get(rater).state == "withdrawn"
    assert [r["outcome"] for r in participants.completions()] == ["withdrawn"]
    # Erased: no row of theirs, no platform id left; still nothing opens, and the platform id is never seated.
    erase_rater_rows(flow.store, rater, confirmed_by="staff")
    assert rows(flow.store, crowd_participants) == [] and rows(flow.store, crowd_completions) == []
    dump = dump_without_completions(flow.store)
    assert rater not in dump and PID_A not in dump
    nothing_opens()
    try:
        participants.agree(rater, {"platform_id": PID_A, "platform_study": None, "platform_session": None})
        raise AssertionError("an erased participant was seated again")
    except AlreadyEntered:
        pass
    assert rows(flow.store, crowd_participants) == [] and participants.seated() == 0
    assert Withdrawals(flow.store).receipts()[0]["counts"]["store"]["crowd_withdrawn_kept"] == 1


def test_a_staff_withdrawal_gives_the_slots_back_and_stops_the_resume_code(tmp_path):
    """`sense7 raters withdraw ID` records the withdrawal (Withdrawals.request, which the CLI calls before the
    erasure, which needs Label Studio): from then on the participant is withdrawn, and beat's pass settles
    their slots and seat if the command did not get to it."""
    flow = Flow(tmp_path)
    a = flow.client()
    check = enter_and_consent(a, PID_A)
    pass_check(a, check)
    rater = flow.rater(PID_A)
    Withdrawals(flow.store).request(rater, "staff")
    assert a.get("/").status_code == 404
    assert "DONE1234" not in resume(flow.client("10.0.0.3"), resume_code(check)).get_data(as_text=True)
    assert rater not in LinkBook(flow.store).active()
    assert expire_leases(flow.store).withdrawn == 1
    assert assignments_of(flow.store, flow.study).of(rater) == [] and Participants(flow.store, flow.study).seated() == 0


# -- the spot-check's gaps ---------------------------------------------------------------------------------

def test_a_half_rated_conversations_lease_expiry_keeps_the_rated_one_and_gives_back_the_other(tmp_path):
    flow = Flow(tmp_path)
    a = flow.client()
    pass_check(a, enter_and_consent(a, PID_A))
    rater = flow.rater(PID_A)
    a.get("/s/pilot/wait")
    answer_profile(a)
    items = rating_items(flow.store, rater)
    first, second = sorted({i.conversation_id for i in items})
    for item in [i for i in items if i.conversation_id == first] + [next(i for i in items if i.conversation_id == second)]:
        rate(a, item.task_id)
    expired = expire_leases(flow.store, _now() + timedelta(minutes=flow.study.lease_minutes + 1))
    assert (expired.participants, expired.released) == (1, 1)
    assert Participants(flow.store, flow.study).get(rater).state == "abandoned"
    slots = rows(flow.store, crowd_slots)
    assert [(s["conversation_id"], s["done_at"] is not None) for s in slots] == [(first, True)]
    assert [r["conversation_id"] for r in rows(flow.store, crowd_released)] == [second]
    coverage = assignments_of(flow.store, flow.study).coverage()
    assert (coverage["rated"], coverage["in_lease"], coverage["released"]) == (1, 0, 1)
    assert len([s for s in rows(flow.store, submissions) if s["kind"] == "rating"]) == 3  # the answers stay


# -- monitoring reads one document -------------------------------------------------------------------------

@pytest.mark.slow
def test_the_crowd_status_carries_each_pool_conversations_coverage(tmp_path):
    import os
    import sys

    flow = Flow(tmp_path, pool=3, k=2, n=2)
    a = flow.client()
    pass_check(a, enter_and_consent(a, PID_A))
    rater = flow.rater(PID_A)
    held = assignments_of(flow.store, flow.study).of(rater)
    (row,) = status(flow.store)
    per = row["coverage"]["per_conversation"]
    # each conversation's K so far and why (the default policy, least_covered, with a floor of 1)
    assert per == {c: {"rated": 0, "in_lease": int(c in held), "k": int(c in held),
                       "reason": "uncertain" if c in held else "below_floor", "level_sd": None}
                   for c in ("pool000", "pool001", "pool002")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")}
    env.update({"SENSE7_HOME": str(flow.settings.home), "SENSE7_STORE_URL": flow.store_url})
    done = subprocess.run([str(Path(sys.executable).parent / "sense7"), "crowd", "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["coverage"]["per_conversation"] == per


def test_the_prepare_job_never_works_for_an_entry_at_the_check(tmp_path):
    """Who the worker's prepare job makes Label Studio tasks for (sense7.tasks.crowd_jobs reads this list from the
    store): participants rating only, never an entry at the check, even one holding slots an older version
    took at consent."""
    from sense7.crowd.lifecycle import waiting_for_tasks

    flow = Flow(tmp_path)
    for i, pid in enumerate(PIDS[:3]):
        enter_and_consent(flow.client(f"10.0.0.{i}"), pid)
    assignments_of(flow.store, flow.study).assign(flow.rater(PIDS[2]))  # slots held at the check (planted)
    assert waiting_for_tasks(flow.store) == []
    assert start_rating(flow.store, flow.study, flow.rater(PIDS[1]))  # passed the check; no queue copy yet
    assert waiting_for_tasks(flow.store) == [("pilot", flow.rater(PIDS[1]))]


def test_check_minutes_and_the_full_code_are_validated_like_the_other_settings(tmp_path):
    import pytest

    from sense7.crowd.study import load_study
    from sense7.readers.formats import FormatError
    from tests.support.crowd import write_study

    assert load_study(write_study(tmp_path / "default")).check_minutes == 10
    assert load_study(write_study(tmp_path / "five", extra="check_minutes: 5\n")).check_minutes == 5
    study = load_study(write_study(tmp_path / "full", codes="  full: FULL4242\n  full_url: https://x.example/f\n"))
    assert study.redirect_for("full") == ("FULL4242", "https://x.example/f")
    for extra, codes, wanted in [("check_minutes: 0\n", "", ":20: check_minutes: must be a whole number from 1 to 1440"),
                                 ("check_minutes: soon\n", "", ":20: check_minutes: must be a whole number"),
                                 ("", "  full_url: ftp://x\n", ":19: codes.full_url: must be an http(s) URL")]:
        path = write_study(tmp_path / f"bad{len(extra)}{len(codes)}", extra=extra, codes=codes)
        with pytest.raises(FormatError) as error:
            load_study(path)
        assert f"{path}{wanted}" in str(error.value), str(error.value)
