"""A crowd participant in a real browser (Debian's chromium via Playwright) on the real stack: they enter
with Prolific's parameters, consent (a reservation only), fail the comprehension check once and pass it
(their tasks are asked for now), continue from "preparing" once the worker is done, answer the
questionnaire, rate their assigned turns and are redirected to Prolific's
completion URL with the code. A participant who declines and one who fails the check twice end with the
right codes, and nothing of theirs is recorded but the consent answer (and the screen-out outcome: the
screened-out one never held a slot)."""

from __future__ import annotations

import pytest

from sense7.crowd.participants import Participants
from tests.support.crowd import open_study
from tests.support.browser import ARTIFACTS, NEEDS_CHROMIUM, answer_questionnaire, chromium
from tests.support.rater_page import start_rating_services

pytestmark = [pytest.mark.browser, pytest.mark.labelstudio, pytest.mark.slow, NEEDS_CHROMIUM]

COMPLETE = "https://app.prolific.com/submissions/complete?cc=DONE1234"


def _answer_check(page, right: bool) -> None:
    page.locator("fieldset[data-control=q1] input[type=radio]").nth(0 if right else 1).check()
    page.locator("fieldset[data-control=q2] input[type=radio]").nth(1).check()
    with page.expect_navigation():
        page.get_by_role("button", name="Check my answers").click()


def test_participant_consents_fails_once_passes_rates_and_is_sent_back_with_the_code(job_stack, tmp_path):

    stack = job_stack
    rt = stack.runtime()
    tax = rt.taxonomy
    # Room for two shares of N=2: a second participant is offered the study only while a whole share is free.
    study = open_study(rt, tmp_path / "study", pool=4, turns=1, k=1, n=2)
    url, _ = start_rating_services(stack, rt)
    entry = f"{url}/s/pilot?PROLIFIC_PID={{}}&STUDY_ID=65aa11bb22cc33dd44ee55ff&SESSION_ID=x1"
    participants = Participants(rt.store, study)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 390, "height": 844})
        sent_back = []
        page.route("https://app.prolific.com/**",
                   lambda route: (sent_back.append(route.request.url), route.fulfill(body="back on Prolific")))
        page.goto(entry.format("aaaaaaaaaaaaaaaaaaaaaaa1"))
        assert page.get_by_text("You will rate replies of an AI assistant").count() == 1
        with page.expect_navigation():
            page.get_by_role("button", name="I agree to take part").click()
        assert len(page.locator("#resume-code").inner_text()) == 10
        _answer_check(page, right=False)
        assert "1 attempt left" in page.locator("[role=alert]").inner_text()
        _answer_check(page, right=True)
        # The questionnaire at once (from the store: RaterQueue.provide), then "preparing" until the worker has
        # made the turns' tasks (if it has not yet), then the first turn by itself.
        page.wait_for_selector("text=About you", timeout=180_000)
        answer_questionnaire(page, tax)
        page.wait_for_url("**/task/*", timeout=180_000)
        rated = 0
        while "/task/" in page.url:
            for control in tax.controls:
                page.locator(f"fieldset[data-control={control}] input[type=radio]").nth(2).check()
            page.locator(f"fieldset[data-control={tax.expectation_key}] input[type=radio]").last.check()
            with page.expect_navigation():
                page.get_by_role("button", name="Save and continue").click()
            rated += 1
        page.screenshot(path=str(ARTIFACTS / "crowd-finish.png"), full_page=True)
        assert rated >= 2 and sent_back[-1] == COMPLETE

        # A participant who declines: the no-consent code, nothing else kept.
        declining = browser.new_page()
        declining.goto(entry.format("bbbbbbbbbbbbbbbbbbbbbbb2"))
        with declining.expect_navigation():
            declining.get_by_role("button", name="I do not agree").click()
        assert declining.locator("#platform-code").inner_text() == "NOCONS99"

        # A participant who fails twice: asked to return the submission with the screen-out code.
        failing = browser.new_page()
        failing.goto(entry.format("ccccccccccccccccccccccc3"))
        with failing.expect_navigation():
            failing.get_by_role("button", name="I agree to take part").click()
        _answer_check(failing, right=False)
        _answer_check(failing, right=False)
        assert failing.locator("#platform-code").inner_text() == "SCREEN77"
        assert "return your submission" in failing.content()
    counts = participants.counts()
    assert (counts["completed"], counts["declined"], counts["screened_out"]) == (1, 1, 1)
    outcomes = {r["platform_id"]: r["outcome"] for r in participants.completions()}
    assert outcomes == {"aaaaaaaaaaaaaaaaaaaaaaa1": "completed", "ccccccccccccccccccccccc3": "screened_out"}
    from tests.support.crowd import participants_conversations
    from sense7.crowd.participants import pseudonymous_id, study_secret

    secret = study_secret(rt.settings, study.study_id)
    completer = pseudonymous_id(secret, study.study_id, "aaaaaaaaaaaaaaaaaaaaaaa1")
    screened = pseudonymous_id(secret, study.study_id, "ccccccccccccccccccccccc3")
    assert participants_conversations(rt.store, screened) == []  # never held: slots come with a passed check
    tasks = [t for t in rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=100)
             if t.data["rater_id"] == completer]
    assert len([t for t in tasks if not t.data.get("repeat_of")]) == 2  # N=2 conversations of one turn each
    assert rated == len(tasks)  # every assigned turn (repeats included) was rated
