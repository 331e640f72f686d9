"""Live pre-fills in a real browser (issue 25): a rater answers 3 turns with 5 on every control on the rater
page; the pre-fill of their next shown-arm turn has moved up from the served version's, and the prediction
recorded for it (before the page was sent) says `live`, 3 ratings. No retrain, no Label Studio round trip:
the worker is not even running, so none of the answers reached Label Studio."""

from __future__ import annotations

import pytest

from sense7.processes import free_port
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.store.study_design import SHOWN, StudyRecords, live_version
from tests.support.browser import ARTIFACTS, NEEDS_CHROMIUM, answer_questionnaire, chromium
from tests.support.rater_page import import_randomized_study, start_page

pytestmark = [pytest.mark.browser, pytest.mark.labelstudio, pytest.mark.slow, NEEDS_CHROMIUM]


def test_three_answers_of_five_move_the_next_prefill_up(job_stack):
    from sense7.tasks.delivery import refresh_queues

    stack = job_stack
    rt = stack.runtime()
    tax = rt.taxonomy
    raters, _ = import_randomized_study(stack, 1, "lv", per_rater=2, turns=4, repeat_share=0.0)
    traits = raters[0]["traits"]  # answered again on the page: the served prediction's traits
    rater = "lv1"
    port = free_port()
    start_page(stack, port)
    link = f"http://127.0.0.1:{port}/r/{LinkBook(rt.store).issue(rater)}"
    refresh_queues(rt, [rater])
    queue = [i for i in RaterQueue(rt.store).items(rater) if i.kind == "rating"]
    records = StudyRecords(rt.store)
    arms = dict(zip(*records.arms_frame()[["task_key", "arm"]].T.values))
    key = {i.task_id: f"{i.conversation_id}::{i.turn_index}::{rater}" for i in queue}
    later_shown = [i for i in queue[3:] if arms[key[i.task_id]] == SHOWN]
    assert later_shown, "the seed gives no shown-arm turn after the third"
    target = later_shown[0]
    static = records.recorded(key[target.task_id], "v1")["levels"]  # what the served version pre-fills
    assert target.prediction and target.prediction["values"] == static

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 2400})
        page.goto(link)
        answer_questionnaire(page, tax, traits)
        base = link.split("/r/")[0]
        for item in queue[:3]:
            page.goto(f"{base}/task/{item.task_id}")
            page.wait_for_selector("form.rating-form")
            for control in tax.controls:
                page.locator(f"fieldset[data-control={control}] input[value='{tax.levels}']").check()
            page.locator(f"fieldset[data-control={tax.expectation_key}] input[type=radio]").last.check()
            if page.locator("fieldset[data-instructed]").count():
                page.locator("fieldset[data-instructed] input[type=radio]").first.check()
            with page.expect_navigation():
                page.get_by_role("button", name="Save and continue").click()
        page.goto(f"{base}/task/{target.task_id}")
        page.wait_for_selector("form.rating-form")
        shown = {control: int(page.locator(f"fieldset[data-control={control}] input:checked").get_attribute("value"))
                 for control in tax.controls}
        assert page.locator("#prefill-note").count() == 1
        page.screenshot(path=str(ARTIFACTS / "live-prefill-rater-page.png"), full_page=True)
    assert sum(shown.values()) > sum(static.values()), (shown, static)  # moved up
    assert all(shown[c] >= static[c] for c in tax.controls), (shown, static)
    record = records.recorded(key[target.task_id], live_version("v1"))
    assert (record["kind"], record["own_ratings"], record["arm"]) == ("live", 3, SHOWN)
    assert record["levels"] == shown  # recorded is what the browser showed
