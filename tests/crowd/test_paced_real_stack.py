"""Conversations chosen as the participant goes (issue 41 item 2) through the real stack: Label Studio, Redis,
the Celery worker (crowd_prepare, delivery), the ML backend and the rater page under gunicorn. The check
gives the first conversation and one ahead; each one finished takes the next, whose tasks the real prepare
job makes in Label Studio (added to the participant's queue copy, their answers kept); the code comes once
the share is rated, and Label Studio holds tasks for exactly the conversations held."""

from __future__ import annotations

import pytest

from sense7.crowd.lifecycle import assignments_of
from sense7.crowd.participants import Participants
from tests.support.crowd import csrf, enter_and_pass, open_study, participant_ids, until
from tests.support.rater_page import start_rating_services

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

PID = "7b2c3d4e5f60718293a4b5c6"


def test_each_next_conversation_is_taken_when_one_is_finished_and_prepared_by_the_real_job(job_stack, tmp_path):
    rt = job_stack.runtime()
    tax = rt.taxonomy
    study = open_study(rt, tmp_path / "study", pool=5, turns=1, k=2, n=3, study="pilot")
    url, _ = start_rating_services(job_stack, rt)
    browser, waiting = enter_and_pass(url, PID)
    assert waiting.headers["Location"].endswith("/s/pilot/wait")
    (rater,) = participant_ids(rt.store)
    owner = assignments_of(rt.store, study)
    assert len(owner.of(rater)) == 2  # the first conversation and one ahead
    held_after = []

    def follow(location: str):
        return browser.get(location if location.startswith("http") else f"{url}{location}", timeout=30,
                           allow_redirects=False)

    response = follow("/s/pilot/wait")
    final = None
    for _ in range(80):
        location = response.headers.get("Location", "")
        if response.status_code == 200 and "/wait" in response.url:  # "preparing"
            until(lambda: follow("/s/pilot/wait").status_code == 303, what="the next conversation's tasks")
            response = follow("/s/pilot/wait")
            continue
        if location.endswith("/profile"):
            html = follow("/profile").text
            form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
                    **{f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in tax.profile_fields}}
            response = browser.post(f"{url}/profile", data=form, timeout=30, allow_redirects=False)
        elif "/task/" in location:
            task_id = int(location.rsplit("/", 1)[1])
            html = follow(f"/task/{task_id}").text
            form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1",
                    tax.expectation_key: tax.expectation_values[-1], **{c: "4" for c in tax.controls}}
            response = browser.post(f"{url}/task/{task_id}", data=form, timeout=30, allow_redirects=False)
            held_after.append(len(owner.of(rater)))
        elif location:
            response = follow(location)
            continue
        else:
            final = response
            break
        assert response.status_code == 303
        response = follow("/")
    assert final is not None and "DONE1234" in final.text
    assert Participants(rt.store, study).get(rater).state == "completed"
    # Each answer finished a conversation (one turn each): the next was taken then, up to N = 3.
    assert held_after[:3] == [3, 3, 3] and len(owner.of(rater)) == 3
    mine = [t for t in rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=1000)
            if t.data["rater_id"] == rater]
    assert {t.data["conversation_id"] for t in mine} == set(owner.of(rater))
    assert max(len(s) for s in owner.taken().values()) <= 2
