"""Given-back slots leave no orphan tasks in Label Studio (the real Label Studio, the rater page under
gunicorn; the jobs' functions run in this process): when a participant's lease ends, the tasks of their
unrated items are deleted and the ratings they gave stay; a participant screened out by the check never had
a task (issue 37: tasks are made once the check is passed); a second pass deletes nothing more."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sense7.crowd.lifecycle import expire_leases
from sense7.crowd.participants import Participants
from sense7.store.rater_page_tables import RaterQueue
from tests.support.crowd import open_study
from tests.support.crowd import consent_session
from tests.support.rater_page import start_page_url
from tests.support.crowd import csrf, participant_ids

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def _tasks(rt, project, rater) -> dict[int, dict]:
    return {t.id: {"conversation": t.data.get("conversation_id"), "annotations": t.total_annotations or 0}
            for t in rt.client.tasks.list(project=project, fields="task_only",
                                          include="id,data,total_annotations", page_size=1000)
            if t.data["rater_id"] == rater}


def test_an_abandoned_or_screened_out_participants_unrated_tasks_are_deleted(job_stack, tmp_path):
    from sense7.tasks.crowd_jobs import clear_released_tasks, prepare_waiting
    from sense7.tasks.delivery import deliver_outbox

    stack = job_stack
    rt = stack.runtime()
    tax = rt.taxonomy
    study = open_study(rt, tmp_path / "study", pool=6, turns=2, k=1, n=2)
    url = start_page_url(stack)
    participants = Participants(rt.store, study)

    # A consents and passes the check; their tasks are made; they answer the questionnaire, every turn of
    # their first conversation and the first turn of the second, then walk away.
    browser = consent_session(url, "d1b2c3d4e5f6a7b8c9d0e100")
    (walker,) = participant_ids(rt.store)
    assert prepare_waiting(rt)["participants"] == 1
    html = browser.get(f"{url}/profile", timeout=30).text
    profile = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
               **{f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in tax.profile_fields}}
    assert browser.post(f"{url}/profile", data=profile, timeout=30, allow_redirects=False).status_code == 303
    items = [i for i in RaterQueue(rt.store).items(walker) if i.kind == "rating" and not i.data.get("repeat")]
    first, second = sorted({i.conversation_id for i in items})
    answer = [i for i in items if i.conversation_id == first] + [
        min((i for i in items if i.conversation_id == second), key=lambda i: i.turn_index)]
    for item in answer:
        html = browser.get(f"{url}/task/{item.task_id}", timeout=30).text
        form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
                tax.expectation_key: tax.expectation_values[-1], **{c: "4" for c in tax.controls}}
        assert browser.post(f"{url}/task/{item.task_id}", data=form, timeout=30,
                            allow_redirects=False).status_code == 303
    # One answer reaches Label Studio now; the others are still in the outbox (not delivered yet).
    delivered_first = answer[0].task_id
    before = _tasks(rt, rt.rating_project, walker)
    assert len(before) >= 4 and all(t["annotations"] == 0 for t in before.values())

    expired = expire_leases(rt.store, datetime.now(timezone.utc) + timedelta(minutes=study.lease_minutes + 1))
    assert expired.participants == 1 and participants.get(walker).state == "abandoned"
    released = _released(rt.store, walker)
    assert second in released  # (the first too when the study design gave it a repeat left unanswered)
    answered = {i.task_id for i in answer}
    doomed = {tid for tid, t in before.items() if t["conversation"] in released and tid not in answered}
    assert doomed and clear_released_tasks(rt) == len(doomed)
    after = _tasks(rt, rt.rating_project, walker)
    # Kept: every answered task, and every task of a conversation kept as rated; gone: the rest.
    assert set(after) == set(before) - doomed and answered <= set(after)
    assert len(_tasks(rt, rt.profile_project, walker)) == 1  # the questionnaire was answered: it stays
    assert {i.task_id for i in RaterQueue(rt.store).items(walker, left_out=True)} >= set(after)
    # The undelivered answers are still delivered afterwards, to tasks that still exist.
    assert deliver_outbox(rt)["failed"] == 0
    assert all(t["annotations"] == 1 for t in _tasks(rt, rt.rating_project, walker).values()
               if t["conversation"] == second) and delivered_first in after
    assert clear_released_tasks(rt) == 0  # nothing left to clear: a second pass deletes nothing

    # B consents and fails the check twice: no task was ever made for them (none while at the check).
    browser = consent_session(url, "e1b2c3d4e5f6a7b8c9d0e100", passed=False)
    (failer,) = [r for r in participant_ids(rt.store) if r != walker]
    assert prepare_waiting(rt)["participants"] == 0
    for _ in range(2):
        check = browser.get(f"{url}/s/pilot/check", timeout=30)
        browser.post(f"{url}/s/pilot/check", data={"csrf_token": csrf(check.text), "q1": "2", "q2": "2"},
                     timeout=30)
    assert participants.get(failer).state == "screened_out"
    assert prepare_waiting(rt)["participants"] == 0 and clear_released_tasks(rt) == 0
    assert _tasks(rt, rt.rating_project, failer) == {} and _tasks(rt, rt.profile_project, failer) == {}
    # The walker's kept tasks are untouched by the second participant's clearing.
    assert set(_tasks(rt, rt.rating_project, walker)) == set(after)


def _released(store, rater) -> set[str]:
    from sqlalchemy import select

    from sense7.store.tables import crowd_released

    with store.engine.connect() as conn:
        return {r.conversation_id for r in conn.execute(
            select(crowd_released.c.conversation_id).where(crowd_released.c.rater_id == rater))}
