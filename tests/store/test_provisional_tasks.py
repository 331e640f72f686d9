"""Tasks the rater page shows before Label Studio has them (RaterQueue.provide: a crowd participant's
questionnaire at the check): kept under a provisional id until the queue copy finds the task in Label
Studio by its key, then the queue, the answers (the outbox's keys) and instructed answers take Label
Studio's id in one go; nothing under a provisional id is ever delivered, and a form shown before the copy
still lands on the real task."""

from __future__ import annotations

from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, Outbox, RaterQueue

RATER = "p-0001"


def profile_row(key: str = f"profile::{RATER}") -> dict:
    return {"kind": "profile", "position": -1, "conversation_id": None, "turn_index": None,
            "data": {"task_key": key}, "prediction": None}


def copied(task_id: int, key: str = f"profile::{RATER}", kind: str = "profile", **extra) -> dict:
    """A queue row as the queue copy makes it from a Label Studio task."""
    return {"task_id": task_id, "kind": kind, "position": extra.pop("position", -1),
            "conversation_id": extra.pop("conversation_id", None), "turn_index": extra.pop("turn_index", None),
            "data": {"task_key": key, **extra}, "prediction": None, "answer": None}


def test_a_provided_task_is_kept_by_copies_without_it_and_rekeyed_with_its_answers_when_found(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    queue, outbox = RaterQueue(store), Outbox(store)
    (provisional,) = queue.provide(RATER, [profile_row()])
    assert provisional < 0 and queue.provide(RATER, [profile_row()]) == [provisional]  # idempotent
    assert [(i.task_id, i.kind, i.answer) for i in queue.items(RATER)] == [(provisional, "profile", None)]

    answer = {"traits": {"age_band": "25-34"}}
    assert outbox.add_next(RATER, "profile", provisional, [{"r": 1}], answer, 12.5) == 1
    InstructedAnswers(store).record(RATER, provisional, "attention", 2, 2)
    # Not deliverable yet: Label Studio has no task under that id.
    assert outbox.undelivered() == [] and outbox.counts() == {"submissions": 1, "undelivered": 0, "provisional": 1}
    assert outbox.has_deliverable() is False
    assert queue.items(RATER)[0].answer == answer

    # A queue copy made before the round created the task (beat's refresh, say) keeps the provided row.
    queue.replace(RATER, [copied(501, key="c1::1::" + RATER, kind="rating", position=0, conversation_id="c1",
                                 turn_index=1)])
    assert [(i.task_id, i.kind) for i in queue.items(RATER)] == [(provisional, "profile"), (501, "rating")]

    # The copy that finds it: the row, the answer and its outbox key take Label Studio's id.
    queue.replace(RATER, [copied(77), copied(501, key="c1::1::" + RATER, kind="rating", position=0,
                                            conversation_id="c1", turn_index=1)])
    assert [(i.task_id, i.answer) for i in queue.items(RATER)] == [(77, answer), (501, None)]
    (row,) = outbox.undelivered()
    assert (row["key"], row["task_id"], row["revision"], row["lead_time"]) == (f"{RATER}:profile:77:1", 77, 1, 12.5)
    assert outbox.counts() == {"submissions": 1, "undelivered": 1, "provisional": 0} and outbox.has_deliverable()
    assert InstructedAnswers(store).frame()[["task_id", "answered"]].values.tolist() == [[77, 2]]

    # A form shown before the copy (it names the provisional id) lands on the real task as the next revision.
    changed = {"traits": {"age_band": "35-44"}}
    assert outbox.add_next(RATER, "profile", provisional, [{"r": 2}], changed, 3.0) == 2
    assert outbox.revision(RATER, 77) == 2 and outbox.revision(RATER, provisional) == 0
    assert queue.items(RATER)[0].answer == changed
    # Providing it again now gives the real id and adds no row; later copies never bring it back.
    assert queue.provide(RATER, [profile_row()]) == [77]
    queue.replace(RATER, [copied(77)])
    assert [i.task_id for i in queue.items(RATER)] == [77]
    # Delivered (both revisions): nothing left to deliver, though the outbox keeps them.
    assert outbox.has_deliverable()
    outbox.mark_delivered(RATER, 77, 2, annotation_id=900)
    assert not outbox.has_deliverable() and outbox.counts()["submissions"] == 2


def test_raters_provided_tasks_are_their_own(tmp_path):
    """Another rater's copy never takes or moves this rater's provided task, whatever its items say."""
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    queue, outbox = RaterQueue(store), Outbox(store)
    (mine,) = queue.provide(RATER, [profile_row()])
    outbox.add_next(RATER, "profile", mine, [], {"traits": {}}, None)
    queue.replace("p-0002", [copied(90)])  # (a copy naming this rater's key under another rater)
    assert [i.task_id for i in queue.items(RATER)] == [mine]
    assert outbox.counts()["provisional"] == 1 and [i.task_id for i in queue.items("p-0002")] == [90]


def test_the_questionnaire_is_provided_once_and_never_beside_a_copied_one(tmp_path):
    """What the rater page does when a participant passes the check (RaterQueue.provide_questionnaire): their
    questionnaire under a provisional id with the key its Label Studio task will have, once however often the
    page asks; a queue that holds the questionnaire already (copied from Label Studio) gets no second one."""
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    queue = RaterQueue(store)
    queue.provide_questionnaire(RATER)
    queue.provide_questionnaire(RATER)
    (item,) = queue.items(RATER)
    assert (item.kind, item.position, item.conversation_id, item.turn_index) == ("profile", -1, None, None)
    assert item.task_id < 0 and item.data == {"task_key": f"profile::{RATER}"} and item.answer is None
    # The copy finds it by that key: it takes Label Studio's id, and asking again adds nothing.
    queue.replace(RATER, [copied(77)])
    queue.provide_questionnaire(RATER)
    assert [(i.task_id, i.kind) for i in queue.items(RATER)] == [(77, "profile")]

    # A participant whose queue was copied from Label Studio before the page asked: no provisional twin.
    queue.replace("p-0002", [copied(90, key="profile::p-0002")])
    queue.provide_questionnaire("p-0002")
    assert [(i.task_id, i.kind) for i in queue.items("p-0002")] == [(90, "profile")]
