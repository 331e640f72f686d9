"""The rater page attacked as a stranger (only the URL) and as rater A holding rater B's ids: every route
answers the same bare 404, and nothing of B's conversations ever appears in what A is served."""

from __future__ import annotations

import re

import pytest
import requests

from sense7.store.rater_page_tables import LinkBook, Outbox
from tests.support.rater_page import csrf_of, hidden

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def _texts(tasks) -> set[str]:
    """Every message text of these tasks (what must never leak to another rater)."""
    return {m["content"] for t in tasks for m in t.data["history"] + t.data["turn"] if len(m["content"]) > 20}


def _task_ids(html: str) -> set[int]:
    return {int(i) for i in re.findall(r"/task/(\d+)", html)}


def test_a_stranger_and_rater_a_get_404_for_everything_not_theirs(page_stack):
    from sense7.store.rater_page_tables import RaterQueue
    from sense7.tasks.delivery import refresh_queues

    s = page_stack
    a_tasks, b_tasks = s.rating_tasks("pg1"), s.rating_tasks("pg2")
    # Both queues are in the store before anything is probed (as after `raters invite`), and B has opened
    # their link: a lookup that forgot its rater filter would have B's tasks to hand out.
    assert refresh_queues(s.rt, ["pg1", "pg2"]) == 2
    assert {i.task_id for i in RaterQueue(s.rt.store).items("pg2")} >= {t.id for t in b_tasks}
    assert s.session_for("pg2").get(f"{s.url}/task/{b_tasks[0].id}", timeout=10).status_code == 200
    b_texts = _texts(b_tasks) - _texts(a_tasks)  # B's own texts (canned assistant replies are shared)
    assert len(b_texts) >= 6
    not_found = requests.get(f"{s.url}/no-such-page", timeout=10)
    assert not_found.status_code == 404

    # A stranger: no session, a guessed or malformed link, B's rater id in place of a link.
    stranger = requests.Session()
    for path in ["/", "/profile", "/done", f"/task/{a_tasks[0].id}", f"/task/{b_tasks[0].id}", "/r/pg2",
                 "/r/" + "A" * 43, "/r/", f"/r/{s.links['pg1'].rsplit('/', 1)[1][:-1]}x"]:
        response = stranger.get(s.url + path, timeout=10, allow_redirects=False)
        assert response.status_code == 404, path
        assert response.text == not_found.text, path  # the same page whatever exists
    assert stranger.post(f"{s.url}/task/{a_tasks[0].id}", data={"x": 1}, timeout=10).status_code in (400, 404)
    forged = requests.Session()
    forged.cookies.set("sense7_rater", "eyJsaW5rIjoiYWJjIn0.forged.signature", domain="127.0.0.1")
    assert forged.get(f"{s.url}/", timeout=10, allow_redirects=False).status_code == 404

    # Rater A, holding B's task ids (and ids nobody has).
    a = s.session_for("pg1")
    served = []
    profile = a.get(f"{s.url}/profile", timeout=10)
    assert profile.status_code == 200
    served.append(profile.text)
    token = csrf_of(profile.text)
    for task in a_tasks:
        page = a.get(f"{s.url}/task/{task.id}", timeout=10)
        assert page.status_code == 200
        served.append(page.text)
    highest = max(t.id for t in a_tasks + b_tasks)
    for task_id in [t.id for t in b_tasks] + [highest + 1, highest + 1000, 0]:
        for response in (a.get(f"{s.url}/task/{task_id}", timeout=10, allow_redirects=False),
                         a.post(f"{s.url}/task/{task_id}", data={"csrf_token": token, "revision": "1"},
                                timeout=10, allow_redirects=False)):
            assert response.status_code == 404, task_id
            assert response.text == not_found.text
    for path in ["/?rater_id=pg2", f"/task/{a_tasks[0].id}?rater_id=pg2", "/done?rater=pg2"]:
        response = a.get(s.url + path, timeout=10)
        served.append(response.text)
    served.append(a.get(f"{s.url}/done", timeout=10).text)
    everything = "\n".join(served)
    assert len([t for t in _texts(a_tasks) if t in everything]) >= 6  # A's own conversations are shown
    assert not any(text in everything for text in b_texts)
    assert _task_ids(everything) <= {t.id for t in a_tasks}
    assert "pg2" not in everything
    assert Outbox(s.rt.store).counts()["submissions"] == 0  # none of those posts stored anything


def test_forms_need_the_csrf_token_and_a_revoked_link_stops_at_once(page_stack):
    s = page_stack
    task = s.rating_tasks("pg1")[0]
    a = s.session_for("pg1")
    page = a.get(f"{s.url}/task/{task.id}", timeout=10)
    answer = {"revision": hidden(page.text, "revision"), "rendered_at": hidden(page.text, "rendered_at")}
    tax = s.rt.taxonomy
    answer.update({c: "3" for c in tax.controls})
    answer[tax.expectation_key] = tax.expectation_values[0]
    refused = a.post(f"{s.url}/task/{task.id}", data=answer, timeout=10, allow_redirects=False)
    assert refused.status_code == 400
    assert Outbox(s.rt.store).counts()["submissions"] == 0

    assert LinkBook(s.rt.store).revoke("pg1")
    assert a.get(f"{s.url}/task/{task.id}", timeout=10).status_code == 404  # the open session too
    assert requests.get(s.links["pg1"], timeout=10).status_code == 404
    # A new link for the rater works; the old one stays dead.
    fresh = LinkBook(s.rt.store).issue("pg1")
    assert requests.get(f"{s.url}/r/{fresh}", timeout=10).status_code == 200
    assert requests.get(s.links["pg1"], timeout=10).status_code == 404


def test_guessing_links_is_rate_limited_but_opening_ones_own_link_is_not(page_stack):
    s = page_stack
    # Successful openings are not counted: a rater who opens their link again and again is never blocked.
    assert {requests.get(s.links["pg2"], timeout=30).status_code for _ in range(35)} == {200}
    answers = [requests.get(f"{s.url}/r/guess{i:040d}", timeout=10).status_code for i in range(35)]
    assert answers[:30] == [404] * 30 and set(answers[30:]) == {429}
    assert "guess" not in requests.get(f"{s.url}/r/guess", timeout=10).text
