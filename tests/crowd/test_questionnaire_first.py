"""The first page after the comprehension check is served from the store, before the worker's round made any
Label Studio task (the real Label Studio, the rater page under gunicorn; the jobs' functions run in this
process, so the round runs exactly when the test says): the questionnaire is there at once, its answer is
kept but never delivered before its task exists, the participant waits for the turns only once it is
answered, and the round gives the answer its Label Studio task, where delivery writes it."""

from __future__ import annotations

import pytest

from sense7.labelstudio.protocol import parse_profile_annotation
from sense7.store.rater_page_tables import Outbox, RaterQueue
from tests.support.crowd import consent_session, csrf, open_study, participant_ids
from tests.support.rater_page import start_page_url

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def own_tasks(rt, project, rater) -> list:
    return [t for t in rt.client.tasks.list(project=project, fields="all", page_size=1000)
            if (t.data or {}).get("rater_id") == rater]


def test_the_questionnaire_is_answered_before_the_round_and_delivered_to_its_task_after_it(job_stack, tmp_path):
    from sense7.tasks.broker import redis_client
    from sense7.tasks.celery_app import configure
    from sense7.tasks.crowd_jobs import prepare_participant, prepare_waiting
    from sense7.tasks.delivery import SCHEDULED_KEY as DELIVERY_ASKED
    from sense7.tasks.delivery import deliver_outbox

    stack = job_stack
    rt = stack.runtime()
    configure(rt.settings, stack.redis.url)  # the round asks for delivery on the stack's broker (no worker takes it)
    broker = redis_client(stack.redis.url)
    tax = rt.taxonomy
    open_study(rt, tmp_path / "study", pool=4, turns=2, k=1, n=2)
    url = start_page_url(stack)
    browser = consent_session(url, "5e1f2a3b4c5d6e7f8091a2b3")  # passed the check; no worker runs
    (rater,) = participant_ids(rt.store)
    assert own_tasks(rt, rt.profile_project, rater) == [] and own_tasks(rt, rt.rating_project, rater) == []

    # No round yet, and still no "preparing": the questionnaire at once.
    assert browser.get(f"{url}/s/pilot/wait", timeout=30, allow_redirects=False).headers["Location"].endswith("/")
    assert browser.get(f"{url}/", timeout=30, allow_redirects=False).headers["Location"].endswith("/profile")
    html = browser.get(f"{url}/profile", timeout=30).text
    traits = {f.key: str(f.choices[-1] if f.type == "choice" else f.max) for f in tax.profile_fields}
    form = {"csrf_token": csrf(html), "revision": "1", "rendered_at": "1", **traits}
    assert browser.post(f"{url}/profile", data=form, timeout=30, allow_redirects=False).status_code == 303
    (kept,) = RaterQueue(rt.store).items(rater)
    assert kept.task_id < 0 and kept.answer is not None  # kept, under the provisional id
    assert deliver_outbox(rt) == {"delivered": 0, "failed": 0}  # nothing written to a task that does not exist
    # Now the participant waits for the turns (the redirect chain a browser follows ends on "preparing").
    waiting = browser.get(f"{url}/", timeout=30)
    assert waiting.url.endswith("/s/pilot/wait") and "csrf_token" not in waiting.text

    # The round gives the kept answer its task, so it asks for delivery (the page's own ask, made when the
    # answer was posted, is taken as done: a delivery job that found nothing to deliver).
    broker.delete(DELIVERY_ASKED)
    assert prepare_waiting(rt)["participants"] == 1
    assert broker.exists(DELIVERY_ASKED)
    (profile_task,) = own_tasks(rt, rt.profile_project, rater)
    items = RaterQueue(rt.store).items(rater)
    assert items[0].kind == "profile" and items[0].task_id == profile_task.id and items[0].answer == kept.answer
    assert [r["key"] for r in Outbox(rt.store).undelivered()] == [f"{rater}:profile:{profile_task.id}:1"]
    assert deliver_outbox(rt) == {"delivered": 1, "failed": 0}
    # A round that leaves nothing to deliver (its answers delivered already) asks for no delivery.
    broker.delete(DELIVERY_ASKED)
    assert prepare_participant(rt, "pilot", rater) > 0 and not broker.exists(DELIVERY_ASKED)
    (annotation,) = rt.client.tasks.get(profile_task.id).annotations
    assert {k: str(v) for k, v in parse_profile_annotation(dict(annotation)["result"], tax).items()} == traits

    # The questionnaire's form shown before the round still lands on its task (a change: revision 2).
    again = {**form, "revision": "2", tax.profile_fields[0].key: str(tax.profile_fields[0].choices[0])}
    assert browser.post(f"{url}/profile", data=again, timeout=30, allow_redirects=False).status_code == 303
    assert Outbox(rt.store).revision(rater, profile_task.id) == 2
    # And "preparing" sends the participant on to their first turn, a Label Studio task of theirs.
    assert browser.get(f"{url}/s/pilot/wait", timeout=30, allow_redirects=False).headers["Location"].endswith("/")
    first = browser.get(f"{url}/", timeout=30, allow_redirects=False).headers["Location"]
    assert "/task/" in first
    assert int(first.rsplit("/", 1)[1]) in {t.id for t in own_tasks(rt, rt.rating_project, rater)}
