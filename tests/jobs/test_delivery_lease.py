"""A delivery job that finds the delivery lock held (another job delivering, or one past its last look at the
outbox) does not sit in a worker process waiting for it: it asks for itself again a moment later, so the
worker's process runs other jobs meanwhile (here: a sync, on a worker with one process), and the submission is
still delivered, exactly once, as soon as the lock is free. No beat: nothing but that job delivers."""

from __future__ import annotations

import pytest
import redis

from sense7.labelstudio.importer import import_conversations
from sense7.labelstudio.protocol import rating_result
from sense7.store.rater_page_tables import Outbox
from sense7.tasks import delivery, names
from sense7.tasks.broker import take_lease
from tests.support.jobs import make_conversations, make_raters, wait_for
from tests.support.rater_page import label_studio_annotations

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def test_a_delivery_behind_a_held_lock_frees_the_worker_and_delivers_once(job_stack):
    rt = job_stack.runtime()
    tax = rt.taxonomy
    rt.store.upsert_raters(make_raters(1, prefix="held"))
    import_conversations(rt.client, rt.rating_project, make_conversations(["held1"], per_rater=1, turns=3,
                                                                          prefix="held"), rt.store, taxonomy=tax)
    tasks = [t for t in rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=100)
             if t.data.get("rater_id") == "held1" and not t.data.get("repeat_of")]
    outbox = Outbox(rt.store)
    values = {c: 4 for c in tax.controls}
    chosen = {"values": values, "expectation": tax.expectation_values[0], "comment": None}
    for task in tasks:
        assert outbox.add_next("held1", "rating", task.id, rating_result(values, tax, chosen["expectation"], None),
                               chosen, 5.0) == 1

    conn = redis.Redis.from_url(job_stack.redis.url)
    holder = take_lease(conn, delivery.LOCK_KEY, delivery.LOCK_TTL)  # a live holder: renewed until released
    assert holder is not None
    try:
        job_stack.start_worker(beat=False)  # one process, no periodic delivery
        job_stack.celery().send_task(names.DELIVER)
        wait_for(lambda: conn.llen("celery") == 0, what="the delivery job taken by the worker")
        # The worker's only process is free for other work while the lock is held (a job waiting for the
        # lock would hold it, and give up before the lock is free: the submissions would stay undelivered).
        assert job_stack.run(names.SYNC_PENDING, timeout=120)["seen"] == 0
        assert outbox.counts()["undelivered"] == len(tasks)  # nobody delivers without the lock
    finally:
        holder.release()
    wait_for(lambda: outbox.counts()["undelivered"] == 0, timeout=60, what="delivery once the lock is free")

    def annotated() -> list[int]:
        ids = {t.id for t in tasks}
        return sorted(a["task"] for a in label_studio_annotations(rt, rt.rating_project) if a["task"] in ids)

    assert annotated() == sorted(t.id for t in tasks)  # one annotation per task, once
    wait_for(lambda: not conn.exists(delivery.LOCK_KEY), what="the lock let go")  # every job done: still once
    assert outbox.counts()["undelivered"] == 0 and annotated() == sorted(t.id for t in tasks)
