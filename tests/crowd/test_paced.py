"""Conversations chosen as the participant goes (issue 41 item 2): at the check their first one and one ahead,
then one more each time they finish one, by the study's policy with their answers so far (their page
answers included), until their share is held or the pool has nothing left for them. On the rater page (the
Flask app in the test process, a real SQLite store; the worker's queue copy written as its job writes it,
new tasks added to the ones there: tests/crowd/test_flow.Flow) and on the store alone (the choosing).

Every money and consent invariant is attacked: no code before the whole share is rated, no slot without a
passed check, none beyond K, nothing for a withdrawn participant (even two requests racing), leases still
give back what was not rated, and least_covered's coverage is the all-at-once one."""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from sense7.crowd.assignment import Assignments
from sense7.crowd.lifecycle import (AHEAD, advance, assignments_of, expire_leases, install_study, start_rating,
                                    top_up, unprepared, waiting_for_tasks)
from sense7.crowd.participants import Participants, Studies
from sense7.labelstudio.protocol import rating_tasks
from sense7.privacy.participation import Withdrawals
from sense7.store.database import Store
from sense7.store.rater_page_tables import RaterQueue
from sense7.store.tables import crowd_released, crowd_slots
from sense7.crowd.lifecycle import conversations_for
from tests.support.crowd import PID_A, PID_B, TAX, Flow, csrf, enter_and_consent, pass_check, write_study
from tests.support.crowd import answer_crowd_profile as answer_profile
from tests.support.crowd import rate_turn as rate

CODE = "DONE1234"


class PacedFlow(Flow):
    """Flow whose worker adds the tasks of newly held conversations to the queue copy (the ones there keep
    their ids and answers, as the real job's idempotent import and copy do). `lazy`: asks are only recorded
    until `work()` runs (a worker that has not got to them yet)."""

    def __init__(self, tmp_path, lazy: bool = False, **kwargs):
        self.lazy = lazy
        super().__init__(tmp_path, **kwargs)

    def prepare(self, study_id: str, rater_id: str) -> None:
        self.prepared.append((study_id, rater_id))
        if not self.lazy:
            self.work(rater_id)

    def at_first_task(self, pid: str):
        """A client of participant `pid` past consent, check, waiting room and questionnaire; their rater id."""
        client = self.client()
        pass_check(client, enter_and_consent(client, pid))
        rater = self.rater(pid)
        client.get("/s/pilot/wait")
        answer_profile(client)
        return client, rater

    def work(self, rater_id: str) -> None:
        queue = RaterQueue(self.store)
        items = [{"task_id": i.task_id, "kind": i.kind, "position": i.position, "conversation_id": i.conversation_id,
                  "turn_index": i.turn_index, "data": i.data, "prediction": None, "answer": None}
                 for i in queue.items(rater_id, left_out=True)]
        for item in items:  # the questionnaire the page showed first (RaterQueue.provide) gets its task now
            if item["task_id"] < 0:
                item["task_id"] = self.next_id
                self.next_id += 1
        if not items:
            items.append({"task_id": self.next_id, "kind": "profile", "position": -1, "conversation_id": None,
                          "turn_index": None, "data": {"task_key": f"profile::{rater_id}"}, "prediction": None,
                          "answer": None})
            self.next_id += 1
        have = {i["conversation_id"] for i in items}
        for c in conversations_for(self.store, self.study, rater_id):
            if c.conversation_id in have:
                continue
            for task in rating_tasks(c):
                d = task["data"]
                items.append({"task_id": self.next_id, "kind": "rating", "position": len(items),
                              "conversation_id": d["conversation_id"], "turn_index": d["turn_index"],
                              "data": {"history": d["history"], "turn": d["turn"], "repeat": False,
                                       "instructed": None}, "prediction": None, "answer": None})
                self.next_id += 1
        queue.replace(rater_id, items)


def unanswered(store, rater):
    return [i for i in RaterQueue(store).items(rater) if i.kind == "rating" and i.answer is None]


def rate_conversation(client, store, rater) -> str:
    """Rate every turn of the first conversation with an unanswered turn; returns its id."""
    first = unanswered(store, rater)[0].conversation_id
    for item in [i for i in unanswered(store, rater) if i.conversation_id == first]:
        rate(client, item.task_id)
    return first


def no_code(client) -> None:
    for path in ("/s/pilot/finish", "/done"):
        assert CODE not in client.get(path, follow_redirects=True).get_data(as_text=True), path


def slots_per_conversation(store) -> dict[str, int]:
    with store.engine.connect() as conn:
        found: dict[str, int] = {}
        for row in conn.execute(select(crowd_slots.c.conversation_id)):
            found[row.conversation_id] = found.get(row.conversation_id, 0) + 1
    return found


# -- on the rater page -------------------------------------------------------------------------------------

def test_the_check_gives_the_first_conversation_and_one_ahead_then_one_per_finished_conversation(tmp_path):
    flow = PacedFlow(tmp_path, n=4)
    a = flow.client()
    pass_check(a, enter_and_consent(a, PID_A))
    rater = flow.rater(PID_A)
    owner = assignments_of(flow.store, flow.study)
    assert AHEAD == 1 and len(owner.of(rater)) == 2 and flow.prepared == [("pilot", rater)]
    assert a.get("/s/pilot/wait").status_code == 303
    answer_profile(a)
    done = []
    for step in range(4):
        no_code(a)  # the share (4 conversations) is not rated yet
        done.append(rate_conversation(a, flow.store, rater))
        held = owner.of(rater)
        assert len(held) == min(2 + step + 1, 4)  # the next one taken when one is finished, never beyond N
        assert set(done) <= set(held) and unprepared(flow.store, [rater]) == {}  # its tasks made at once here
    assert len(flow.prepared) == 3  # at the check, then after the first and the second conversation
    final = a.get("/s/pilot/finish").get_data(as_text=True)
    assert CODE in final and Participants(flow.store, flow.study).get(rater).state == "completed"
    assert owner.coverage()["rated"] == 4 and max(slots_per_conversation(flow.store).values()) <= 2


def test_no_code_while_the_next_conversation_is_being_prepared_and_the_page_waits_for_it(tmp_path):
    flow = PacedFlow(tmp_path, lazy=True, n=3)
    a = flow.client()
    pass_check(a, enter_and_consent(a, PID_A))
    rater = flow.rater(PID_A)
    # The worker has not run: the questionnaire first, from the store (RaterQueue.provide), then "preparing".
    assert a.get("/s/pilot/wait").status_code == 303
    answer_profile(a)
    assert a.get("/s/pilot/wait").status_code == 200 and unprepared(flow.store, [rater])
    flow.work(rater)
    assert a.get("/s/pilot/wait").status_code == 303
    assert [i.task_id > 0 and i.answer is not None for i in RaterQueue(flow.store).items(rater)
            if i.kind == "profile"] == [True]  # the answer moved to the questionnaire's task
    rate_conversation(a, flow.store, rater)
    third = set(unprepared(flow.store, [rater])[rater])
    assert len(third) == 1 and ("pilot", rater) in flow.prepared[1:]  # taken, and its tasks asked for
    assert waiting_for_tasks(flow.store) == [("pilot", rater)]
    rate_conversation(a, flow.store, rater)  # the one held ahead: every turn in the queue is now answered
    finish = a.get("/s/pilot/finish")
    assert finish.status_code == 303 and finish.headers["Location"].endswith("/s/pilot/wait")
    assert a.get("/s/pilot/wait").status_code == 200 and CODE not in a.get("/s/pilot/wait").get_data(as_text=True)
    assert Participants(flow.store, flow.study).get(rater).state == "rating"
    flow.work(rater)
    assert waiting_for_tasks(flow.store) == []
    assert a.get("/s/pilot/wait").status_code == 303
    assert rate_conversation(a, flow.store, rater) in third
    assert CODE in a.get("/s/pilot/finish").get_data(as_text=True)


def test_a_pool_with_nothing_left_for_them_ends_with_what_they_did(tmp_path):
    """Decided: a participant whose next conversation cannot be had (every open one at K, or one they had)
    finishes with what they rated rather than wait for other participants' leases."""
    flow = PacedFlow(tmp_path, pool=3, k=1, n=5)
    a, rater = flow.at_first_task(PID_A)
    for _ in range(3):
        no_code(a)
        rate_conversation(a, flow.store, rater)
    assert len(assignments_of(flow.store, flow.study).of(rater)) == 3  # the pool's 3, not 5
    assert CODE in a.get("/s/pilot/finish").get_data(as_text=True)


def test_rater_a_cannot_advance_on_rater_bs_tasks(tmp_path):
    flow = PacedFlow(tmp_path, n=4)
    a, b = flow.client(), flow.client("10.0.0.2")
    pass_check(a, enter_and_consent(a, PID_A))
    pass_check(b, enter_and_consent(b, PID_B))
    rater_b = flow.rater(PID_B)
    b.get("/s/pilot/wait")
    before = assignments_of(flow.store, flow.study).of(rater_b)
    html = a.get("/s/pilot/wait", follow_redirects=True).get_data(as_text=True)
    for item in unanswered(flow.store, rater_b):
        answer = a.post(f"/task/{item.task_id}", data={"csrf_token": csrf(html), **{c: "3" for c in TAX.controls},
                                                       TAX.expectation_key: TAX.expectation_values[-1]})
        assert answer.status_code == 404
    assert assignments_of(flow.store, flow.study).of(rater_b) == before and unanswered(flow.store, rater_b)
    assert flow.client("10.0.0.9").post(f"/task/{unanswered(flow.store, rater_b)[0].task_id}").status_code in (400, 404)


def test_a_learning_policy_reads_the_participants_own_page_answers_before_they_are_synced(tmp_path):
    flow = PacedFlow(tmp_path, pool=6, k=6, n=3, extra="assignment:\n  policy: learn_rater\n  floor: 0\n")
    a, rater = flow.at_first_task(PID_A)
    first = rate_conversation(a, flow.store, rater)
    owner = assignments_of(flow.store, flow.study)
    assert owner.answers(rater)[first] == {rater: 3.0}  # the page's answers, nothing synced into the store
    assert first not in owner.answers()
    assert len(owner.of(rater)) == 3


# -- the store alone ---------------------------------------------------------------------------------------

def _study(tmp_path, **kwargs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    study, _ = install_study(store, write_study(tmp_path / "s", **kwargs), TAX)
    Studies(store).set_open(study.study_id, True)
    return store, study


def _agree(store, study, rater):
    Participants(store, study).agree(rater, {"platform_id": f"P{rater}", "platform_study": None,
                                             "platform_session": None})


def test_no_slot_without_a_passed_check_and_none_for_a_withdrawn_participant(tmp_path):
    store, study = _study(tmp_path, pool=6, k=2, n=4, cap=10)
    owner = assignments_of(store, study)
    assert owner.assign_next("stranger", 2) == [] and top_up(store, study, "stranger") == []
    _agree(store, study, "r1")  # at the check: no seat yet
    assert owner.assign_next("r1", 2) == [] and owner.of("r1") == []
    assert advance(store, "r1") is None
    assert len(start_rating(store, study, "r1")) == 2
    Withdrawals(store).request("r1", "staff")  # asked for; the crowd's bookkeeping has not run yet
    assert owner.assign_next("r1", 1) == [] and len(owner.of("r1")) == 2
    expire_leases(store)
    assert owner.of("r1") == [] and advance(store, "r1") is None and top_up(store, study, "r1") == []


def test_a_late_arrival_cannot_take_the_conversations_an_earlier_participants_share_needs(tmp_path):
    """With slots taken as participants go, an earlier participant's share is promised, not held: a later
    one is admitted only when the free slots cover every promised share and theirs (else `full`, holding
    nothing), so nobody admitted finishes short for want of conversations."""
    store, study = _study(tmp_path, pool=4, k=1, n=3, cap=10)
    _agree(store, study, "early")
    assert len(start_rating(store, study, "early")) == 2  # 2 held, 1 promised; 2 slots free
    _agree(store, study, "late")
    assert start_rating(store, study, "late") is None
    assert Participants(store, study).get("late").state == "full" and assignments_of(store, study).of("late") == []
    assert not assignments_of(store, study).has_room("another")  # the entry page says full too
    assert len(assignments_of(store, study).assign_next("early", 1)) == 1  # the early share is there


def test_two_requests_of_one_participant_at_once_never_take_past_their_share(tmp_path):
    store, study = _study(tmp_path, pool=20, k=3, n=3, cap=10)
    _agree(store, study, "r1")
    assert len(start_rating(store, study, "r1")) == 2
    barrier, got = threading.Barrier(8), []

    def double_submit():
        barrier.wait()
        got.append(Assignments(store, study.study_id, study.policy()).assign_next("r1", 1))

    threads = [threading.Thread(target=double_submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(g) for g in got) == 1 and len(assignments_of(store, study).of("r1")) == 3


def test_a_slot_taken_by_their_other_request_between_the_read_and_the_write_is_seen(tmp_path):
    """The interleaving the race above can hit, made certain: request 2 read the participant's slots before
    request 1 committed its pick; its write must notice and choose again (here: nothing, the share is held)."""
    store, study = _study(tmp_path, pool=20, k=3, n=3, cap=10)
    _agree(store, study, "r1")
    before = start_rating(store, study, "r1")

    class ReadBeforeTheOtherCommitted(Assignments):
        stale = True

        def of(self, rater_id):
            if self.stale:
                self.stale = False
                return list(before)
            return super().of(rater_id)

    assert len(assignments_of(store, study).assign_next("r1", 1)) == 1  # request 1
    late = ReadBeforeTheOtherCommitted(store, study.study_id, study.policy())
    assert late.assign_next("r1", 1) == [] and len(assignments_of(store, study).of("r1")) == 3


def test_many_participants_racing_never_put_a_conversation_beyond_k(tmp_path):
    store, study = _study(tmp_path, pool=5, k=2, n=3, cap=40)
    raters = [f"r{i}" for i in range(12)]
    for r in raters:
        _agree(store, study, r)
    barrier = threading.Barrier(len(raters))

    def go(r):
        barrier.wait()
        start_rating(store, study, r)
        Assignments(store, study.study_id, study.policy()).assign_next(r, 1)

    threads = [threading.Thread(target=go, args=(r,)) for r in raters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per = slots_per_conversation(store)
    assert sum(per.values()) <= 10 and max(per.values()) <= 2  # 5 x K=2 at most, none beyond K
    inside = [r for r in raters if Participants(store, study).get(r).state == "rating"]
    # admissions go one at a time: exactly the three whole shares the 10 slots promise (N=3 each), none told
    # "full" while a share was still free (racing seats once left only 1-2 inside)
    assert len(inside) == 3 and all(len(assignments_of(store, study).of(r)) == 3 for r in inside)
    assert all(Participants(store, study).get(r).state == "full" for r in set(raters) - set(inside))


def test_an_expired_lease_keeps_the_finished_conversation_and_frees_the_one_ahead(tmp_path):
    flow = PacedFlow(tmp_path, n=4)
    a, rater = flow.at_first_task(PID_A)
    finished = rate_conversation(a, flow.store, rater)
    held = assignments_of(flow.store, flow.study).of(rater)
    assert len(held) == 3
    later = datetime.now(timezone.utc) + timedelta(minutes=flow.study.lease_minutes + 1)
    assert (expire_leases(flow.store, later).released) == 2
    with flow.store.engine.connect() as conn:
        kept = [(r.conversation_id, r.done_at is not None) for r in conn.execute(select(crowd_slots))]
        released = sorted(r.conversation_id for r in conn.execute(select(crowd_released)))
    assert kept == [(finished, True)] and released == sorted(set(held) - {finished})
    assert top_up(flow.store, flow.study, rater) == []  # abandoned: nothing more


def _coverage_upfront(tmp_path, raters, **kwargs) -> list[int]:
    store, study = _study(tmp_path, **kwargs)
    owner = assignments_of(store, study)
    for r in raters:
        owner.assign(r)
    return sorted(len(s) for s in owner.taken().values())


def _coverage_paced(tmp_path, raters, seed, **kwargs) -> list[int]:
    store, study = _study(tmp_path, **kwargs)
    owner = assignments_of(store, study)
    rng = random.Random(seed)
    for r in raters:  # each at the check (a seat, then the first and one ahead)
        _agree(store, study, r)
        assert Participants(store, study).take_seat(r) is not None
        owner.assign_next(r, 1 + AHEAD)
        held = [len(s) for s in owner.taken().values()]
        assert max(held) - min(held) <= 1
    going = list(raters)
    while going:  # they finish conversations in any interleaving: one more each time
        r = rng.choice(going)
        if not owner.assign_next(r, 1):
            going.remove(r)
        held = [len(s) for s in owner.taken().values()]
        assert max(held) - min(held) <= 1 and max(held) <= kwargs["k"]
    return sorted(len(s) for s in owner.taken().values())


def test_least_covered_paced_gives_the_coverage_of_the_all_at_once_assignment(tmp_path):
    for seed, (pool, k, n, people) in enumerate([(10, 3, 3, 8), (9, 3, 3, 9), (7, 2, 4, 5), (12, 3, 2, 20)]):
        raters = [f"r{i}" for i in range(people)]
        kwargs = {"pool": pool, "k": k, "n": n, "cap": 100}
        before = _coverage_upfront(tmp_path / f"u{seed}", raters, **kwargs)
        assert _coverage_paced(tmp_path / f"p{seed}", raters, seed, **kwargs) == before, (pool, k, n, people)


def test_a_turn_budget_is_held_conversation_by_conversation(tmp_path):
    store, study = _study(tmp_path, pool=6, turns=2, k=2, budget=5)
    _agree(store, study, "r1")
    owner = assignments_of(store, study)
    assert len(start_rating(store, study, "r1")) == 2  # 2 + 2 turns
    assert owner.assign_next("r1", 1) == []  # 1 turn left: no conversation of 2 fits
    assert sum(owner.turns()[c] for c in owner.of("r1")) == 4
