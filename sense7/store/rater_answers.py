"""The rater page's answers as model input, shared by the rater page's live pre-fills and the ML backend.

`queue_task_datas` turns a rater's queue into the Label Studio task data the model reads (so both read a
rated turn the same way); `answer_watermarks` is the cheap "who has answered since" check the backend runs
at most once a second: one aggregate over the outbox (`submissions`), the per-rater grouping only when
anything changed.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import func, select

from sense7.data.conversations import task_key
from sense7.store.database import Store
from sense7.store.rater_page_tables import QueueItem
from sense7.store.tables import submissions

RATING = "rating"


def is_repeat(item: QueueItem) -> bool:
    return bool((item.data or {}).get("repeat"))


def queue_task_datas(rater_id: str, items: list[QueueItem]) -> dict[int, dict]:
    """task id -> the Label Studio task data of each original rating turn of the queue (what the model
    reads: ids, texts and "Response n of m" within the conversation)."""
    turns = defaultdict(list)
    for item in items:
        if item.kind == RATING and not is_repeat(item):
            turns[item.conversation_id].append(item)
    out = {}
    for conversation, group in turns.items():
        group = sorted(group, key=lambda i: int(i.turn_index))
        for number, item in enumerate(group, start=1):
            out[item.task_id] = {"task_key": task_key(conversation, int(item.turn_index), rater_id),
                                 "conversation_id": conversation, "turn_index": int(item.turn_index),
                                 "rater_id": rater_id, "position": f"Response {number} of {len(group)}",
                                 "history": (item.data or {}).get("history") or [],
                                 "turn": (item.data or {}).get("turn") or []}
    return out


def rated_items(datas: dict[int, dict], items: list[QueueItem]) -> list[QueueItem]:
    """The queue's original rating turns that hold an answer with values (the rater's own ratings)."""
    return [i for i in items if i.task_id in datas and (i.answer or {}).get("values")]


def submissions_stamp(store: Store) -> tuple:
    """(rating submissions, the latest one's time): changes whenever a rater page stores an answer."""
    with store.engine.connect() as conn:
        row = conn.execute(select(func.count(), func.max(submissions.c.submitted_at))
                           .where(submissions.c.kind == RATING)).one()
    return int(row[0]), row[1]


def answer_watermarks(store: Store) -> dict[str, tuple]:
    """rater id -> (their rating submissions, the latest one's time), for every rater who has any."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(submissions.c.rater_id, func.count(), func.max(submissions.c.submitted_at))
                            .where(submissions.c.kind == RATING).group_by(submissions.c.rater_id))
        return {str(r[0]): (int(r[1]), r[2]) for r in rows}
