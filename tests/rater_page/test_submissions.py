"""Submissions on the rater page become Label Studio annotations credited to the rater's own attribution
account, reach the store through the sync, can be changed (one annotation per task, history kept), and
survive Label Studio being down: all delivered once it is back, none twice."""

from __future__ import annotations

import httpx
import pytest
import requests

from sense7.labelstudio.rater_accounts import account_email
from sense7.processes import free_port
from sense7.store.rater_page_tables import Outbox
from tests.support.jobs import TcpProxy, wait_for
from tests.support.rater_page import build
from tests.support.rater_page import answer_profile, label_studio_annotations, stored, stored_values, submit

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def test_answers_arrive_in_label_studio_and_the_store_as_the_rater_and_changes_keep_history(page_stack):
    s = page_stack
    rt, tax = s.rt, s.rt.taxonomy
    # The queue copy `raters invite` and the worker make (one pass over both projects) equals the one a
    # first visit makes for a single rater (a filtered query), and the page then needs no Label Studio.
    from sense7.tasks.delivery import refresh_queues

    from sense7.store.rater_page_tables import RaterQueue
    from sense7.labelstudio.rater_accounts import ensure_account, fetch_queue

    assert refresh_queues(rt, ["pg1", "pg2"]) == 2
    single = fetch_queue(rt.client, rt.rating_project, rt.profile_project, "pg1",
                         ensure_account(rt.client, rt.store, "pg1"), tax)
    copied = RaterQueue(rt.store).items("pg1")
    assert [(i.task_id, i.kind, i.position, i.data) for i in copied] == \
        [(i["task_id"], i["kind"], i["position"], i["data"]) for i in single]
    assert len(copied) == 1 + len(s.rating_tasks("pg1"))
    a = s.session_for("pg1")
    first = a.get(f"{s.url}/", timeout=30, allow_redirects=False)
    assert first.status_code == 303 and first.headers["Location"].endswith("/profile")  # questionnaire first
    traits = {f.key: (f.choices[0] if f.type == "choice" else f.max) for f in tax.profile_fields}
    answer_profile(a, s.url, tax, traits)
    tasks = s.rating_tasks("pg1")[:2]
    for task in tasks:
        assert submit(a, s.url, task.id, tax, 4).status_code == 303
    # Posting the same form twice (a double click) stores it once.
    again = a.get(f"{s.url}/task/{tasks[0].id}", timeout=30)
    assert 'value="2"' in again.text  # the next revision would be 2

    def arrived():
        found = [x for x in label_studio_annotations(rt, rt.rating_project) if x["task"] in {t.id for t in tasks}]
        return found if len(found) == 2 else None

    found = wait_for(arrived, timeout=120, what="two annotations in Label Studio")
    account = {x["completed_by"] if isinstance(x["completed_by"], int) else x["completed_by"]["id"] for x in found}
    assert len(account) == 1
    pg1_account = account.pop()
    email = rt.client.users.get(pg1_account).email
    assert email == account_email("pg1")  # never the rater's own email (pg1@raters.test)
    assert all(x["lead_time"] and x["lead_time"] > 0 for x in found)
    wait_for(lambda: {tid for tid, (rater, _) in stored(rt).items() if rater == "pg1"} >= {t.id for t in tasks},
             timeout=120, what="the store to have both, credited to pg1")
    wait_for(lambda: rt.store.raters_frame(["pg1"]).iloc[0].to_dict() == traits, timeout=120,
             what="the questionnaire answers as pg1's traits")

    # Going back and changing an answer updates the same annotation (history in the store).
    annotation_id = stored(rt)[tasks[0].id][1]
    assert submit(a, s.url, tasks[0].id, tax, 2).status_code == 303
    wait_for(lambda: stored_values(rt, annotation_id) == {c: 2 for c in tax.controls}, timeout=120,
             what="the changed answer in the store")
    assert len([x for x in label_studio_annotations(rt, rt.rating_project) if x["task"] == tasks[0].id]) == 1
    changes = [h["change"] for h in rt.store.history(annotation_id=annotation_id)]
    assert changes == ["created", "updated"]
    # Delivered answers say who wrote them: the rater page (as the rater's account), not a staff user.
    written = [(h["via"], h["changed_by"]) for h in rt.store.history(annotation_id=annotation_id)]
    assert written == [("rater page", pg1_account)] * 2 and rt.store.quarantined() == [] and rt.store.held() == []
    assert Outbox(rt.store).counts() == {"submissions": 4, "undelivered": 0, "provisional": 0}
    # Nothing of the conversations, the answers' comments or the link's secret in any process's log.
    logs = "\n".join(proc.log_file.read_text(errors="replace") for proc in s.stack.procs)
    secret = s.links["pg1"].rsplit("/r/", 1)[1]
    texts = {m["content"] for t in tasks for m in t.data["history"] + t.data["turn"] if len(m["content"]) > 15}
    assert texts and not any(text in logs for text in texts)
    assert secret not in logs and "level 4" not in logs


def test_label_studio_down_during_20_submissions_all_arrive_once_after(job_stack):
    ls = requests.utils.urlparse(job_stack.env["SENSE7_LS_URL"])
    proxy = TcpProxy(free_port(), ls.hostname, ls.port).start()
    via_proxy = {"SENSE7_LS_URL": f"http://127.0.0.1:{proxy.port}"}
    s = build(job_stack, per_rater=7, turns=3, worker_env=via_proxy, page_env=via_proxy)
    rt, tax = s.rt, s.rt.taxonomy
    a = s.session_for("pg1")  # opened while Label Studio is up: the queue is loaded
    tasks = s.rating_tasks("pg1")[:20]
    assert len(tasks) == 20
    proxy.stop()
    try:
        for i, task in enumerate(tasks):
            response = submit(a, s.url, task.id, tax, 1 + i % 5)
            assert response.status_code == 303  # "saved", though Label Studio is unreachable
        assert Outbox(rt.store).counts() == {"submissions": 20, "undelivered": 20, "provisional": 0}
        assert not label_studio_annotations(rt, rt.rating_project)
    finally:
        proxy.start()
    wait_for(lambda: Outbox(rt.store).counts()["undelivered"] == 0, timeout=180, what="every delivery")
    found = label_studio_annotations(rt, rt.rating_project)
    assert sorted(x["task"] for x in found) == sorted(t.id for t in tasks)  # each task once, none twice
    wait_for(lambda: len([r for r, _ in stored(rt).values() if r == "pg1"]) == 20, timeout=180,
             what="all 20 in the store")
    proxy.stop()


class CreatesThenFails:
    """The stack's real Label Studio client, except that creating an annotation succeeds and then the answer
    is lost (the connection drops after Label Studio has written it)."""

    def __init__(self, client):
        self._client = client
        self.annotations = _LostAnswers(client.annotations)

    def __getattr__(self, name):
        return getattr(self._client, name)


class _LostAnswers:
    def __init__(self, annotations):
        self._annotations = annotations
        self.created = 0

    def create(self, *args, **kwargs):
        self._annotations.create(*args, **kwargs)
        self.created += 1
        raise httpx.ReadError("connection dropped after the annotation was created")  # as the SDK raises it

    def __getattr__(self, name):
        return getattr(self._annotations, name)


def test_a_delivery_whose_answer_was_lost_is_not_created_twice(job_stack):
    """Label Studio created the annotation but the answer never came back: the retry finds it (it reads the
    task first) and does not create a second one; a later revision updates that same annotation."""
    from sense7.labelstudio.importer import import_conversations
    from sense7.labelstudio.protocol import rating_result
    from sense7.tasks.delivery import deliver_outbox
    from tests.support.jobs import make_conversations, make_raters

    rt = job_stack.runtime()
    tax = rt.taxonomy
    raters = make_raters(1, prefix="lost")
    rt.store.upsert_raters(raters)
    import_conversations(rt.client, rt.rating_project, make_conversations(["lost1"], per_rater=1, turns=3,
                                                                          prefix="lost"), rt.store, taxonomy=tax)
    tasks = [t for t in rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=100)
             if not t.data.get("repeat_of")][:3]
    outbox = Outbox(rt.store)

    def answer(level: int) -> tuple[dict, list]:
        values = {c: level for c in tax.controls}
        chosen = {"values": values, "expectation": tax.expectation_values[0], "comment": None}
        return chosen, rating_result(values, tax, chosen["expectation"], None)

    for task in tasks:
        chosen, result = answer(2)
        assert outbox.add_next("lost1", "rating", task.id, result, chosen, 12.0) == 1
    real = rt.client
    rt.client = CreatesThenFails(real)
    with pytest.raises(Exception):  # a transient error: the job is retried
        deliver_outbox(rt)
    assert rt.client.annotations.created == len(tasks)  # every one landed, no answer came back
    assert outbox.counts()["undelivered"] == len(tasks)
    rt.client = real
    assert deliver_outbox(rt) == {"delivered": len(tasks), "failed": 0}
    assert deliver_outbox(rt) == {"delivered": 0, "failed": 0}

    def per_task() -> dict[int, list]:
        found = label_studio_annotations(rt, rt.rating_project)
        return {t.id: [x for x in found if x["task"] == t.id] for t in tasks}

    assert {task: len(found) for task, found in per_task().items()} == {t.id: 1 for t in tasks}
    first = {task: found[0]["id"] for task, found in per_task().items()}
    chosen, result = answer(5)
    assert outbox.add_next("lost1", "rating", tasks[0].id, result, chosen, 3.0) == 2
    assert deliver_outbox(rt) == {"delivered": 1, "failed": 0}
    after = per_task()
    assert {task: [x["id"] for x in found] for task, found in after.items()} == {t: [a] for t, a in first.items()}
    ratings = {r["from_name"]: r["value"].get("rating") for r in after[tasks[0].id][0]["result"]}
    assert all(ratings[c] == 5 for c in tax.controls)
