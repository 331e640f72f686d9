"""The crowd flow under a non-default assignment policy (issue 41): slots still only after a passed check, never
beyond K, the answers synced into the store steer learn_rater and settle_items, and the status says each
conversation's K so far and why. The rater page in the test process on a real SQLite store, as test_flow."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from sense7.cli.crowd import status_lines
from sense7.crowd.lifecycle import assignments_of, status
from sense7.crowd.participants import Participants
from sense7.store.rater_page_tables import LinkBook
from sense7.store.tables import annotations, crowd_slots, rater_links, ratings
from tests.support.crowd import TAX, Flow, enter_and_consent, entry_url, pass_check

PIDS = ["%024x" % (0xA5516E000 + i) for i in range(8)]


def synced(store, rater: str, conversation: str, value: int, first_id: int) -> None:
    """What the sync leaves in the store for a rating of every control of a conversation's turn 1."""
    now = datetime.now(timezone.utc).isoformat()
    with store.engine.begin() as conn:
        conn.execute(annotations.insert(), [{"annotation_id": first_id, "task_id": first_id, "conversation_id": conversation,
                                             "turn_index": 1, "rater_id": rater, "updated_at": now, "deleted": False}])
        conn.execute(ratings.insert(), [{"annotation_id": first_id, "control": c, "value": value} for c in TAX.controls])


@pytest.mark.parametrize("policy", ["random", "learn_rater", "settle_items"])
def test_a_non_default_policy_gives_slots_only_after_the_check_and_never_beyond_k(tmp_path, policy):
    flow = Flow(tmp_path, pool=4, k=2, n=2, extra=f"assignment: {policy}\n")
    assert flow.study.policy().name == policy
    a = flow.client()
    check = enter_and_consent(a, PIDS[0])
    rater = flow.rater(PIDS[0])
    assert Participants(flow.store, flow.study).get(rater).state == "checking"
    with flow.store.engine.connect() as conn:
        assert conn.execute(select(crowd_slots)).all() == [] and conn.execute(select(rater_links)).all() == []
    assert flow.prepared == []
    pass_check(a, check)
    assert len(assignments_of(flow.store, flow.study).of(rater)) == 2 and rater in LinkBook(flow.store).active()
    for i, pid in enumerate(PIDS[1:4], start=1):
        b = flow.client(f"10.0.1.{i}")
        pass_check(b, enter_and_consent(b, pid))
        assert len(assignments_of(flow.store, flow.study).of(flow.rater(pid))) == 2
    coverage = assignments_of(flow.store, flow.study).coverage()
    # 4 conversations x K=2 = 8 slots for 4 participants of N=2 (no answer synced yet: nothing settled)
    per = coverage["per_conversation"]
    assert coverage["policy"] == policy and coverage["in_lease"] == 8
    assert {(c["k"], c["reason"]) for c in per.values()} == {(2, "capped")}
    assert flow.client("10.0.1.9").get(entry_url(PIDS[5])).status_code == 403  # full: no slot left


def test_learn_rater_in_the_study_hands_a_conversation_others_settled_first(tmp_path):
    """Ratings synced for pool000 (four raters agree at 1), pool001 (four agree at 5) and pool002 (one rater);
    pool003 nobody rated. Under learn_rater (floor 0) a new participant gets one of the settled ones, which
    teach most about them; least_covered would give the unrated pool003."""
    flow = Flow(tmp_path, pool=4, k=6, n=1, extra="assignment:\n  policy: learn_rater\n  floor: 0\n")
    for i, rater in enumerate(["x1", "x2", "x3", "x4"]):
        synced(flow.store, rater, "pool000", 1, 100 + i)
        synced(flow.store, rater, "pool001", 5, 200 + i)
    synced(flow.store, "x1", "pool002", 3, 110)
    answers = assignments_of(flow.store, flow.study).answers()
    assert answers["pool000"] == {"x1": 1.0, "x2": 1.0, "x3": 1.0, "x4": 1.0} and answers["pool002"] == {"x1": 3.0}
    a = flow.client()
    pass_check(a, enter_and_consent(a, PIDS[0]))
    assert assignments_of(flow.store, flow.study).of(flow.rater(PIDS[0])) in (["pool000"], ["pool001"])


def test_settle_items_status_says_which_conversations_are_settled_and_why(tmp_path):
    flow = Flow(tmp_path, pool=3, k=6, n=1, extra="assignment:\n  policy: settle_items\n  floor: 2\n  settled_sd: 0.5\n")
    for i in range(5):
        synced(flow.store, f"s{i}", "pool000", 2, 200 + i)  # five raters agree: settled
    for i, value in enumerate([1, 5, 1, 5, 1]):
        synced(flow.store, f"s{i}", "pool001", value, 300 + i)  # five raters split: uncertain
    owner = assignments_of(flow.store, flow.study)
    with flow.store.engine.begin() as conn:  # their slots, as the flow would have left them
        conn.execute(crowd_slots.insert(), [
            {"study_id": "pilot", "conversation_id": c, "slot": i, "rater_id": f"s{i}",
             "taken_at": datetime.now(timezone.utc), "done_at": datetime.now(timezone.utc)}
            for c in ("pool000", "pool001") for i in range(5)])
    (row,) = status(flow.store)
    per = row["coverage"]["per_conversation"]
    assert (per["pool000"]["k"], per["pool000"]["reason"]) == (5, "settled")
    assert (per["pool001"]["k"], per["pool001"]["reason"]) == (5, "uncertain")
    assert (per["pool002"]["k"], per["pool002"]["reason"]) == (0, "below_floor")
    assert row["coverage"]["reasons"] == {"below_floor": 1, "settled": 1, "uncertain": 1}
    assert per["pool001"]["level_sd"] > per["pool000"]["level_sd"]
    (line,) = status_lines([row])  # what `sense7 crowd status` prints
    assert "assignment settle_items (floor 2): 1 below floor, 1 settled, 1 uncertain;" in line
    # the next two participants: pool002 (below the floor) first, then the uncertain one; never the settled one
    got = []
    for i, pid in enumerate(PIDS[:3]):
        b = flow.client(f"10.0.2.{i}")
        pass_check(b, enter_and_consent(b, pid))
        got += owner.of(flow.rater(pid))
    assert got[:2] == ["pool002", "pool002"] and "pool000" not in got
