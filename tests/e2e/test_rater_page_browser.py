"""A rater on the rater page in a real browser (Debian's chromium via Playwright), at phone width: they
open their private link, answer the questionnaire, rate two turns with the keyboard only, go back and
change one answer, finish and see the completion code. Label Studio then holds exactly those two
annotations, credited to that rater, with the changed answer; and so does sense7's store."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from sense7.store.tables import annotations as annotations_table, ratings as ratings_table
from tests.support.browser import ARTIFACTS, NEEDS_CHROMIUM, answer_questionnaire, chromium
from tests.support.jobs import wait_for
from tests.support.rater_page import build

pytestmark = [pytest.mark.browser, pytest.mark.labelstudio, pytest.mark.slow, NEEDS_CHROMIUM]


def rate_with_keyboard(page, tax, first_level: int) -> dict[str, int]:
    """Answer every control with digit keys (Tab between questions), then Enter. Returns the levels."""
    levels = {}
    page.wait_for_selector("fieldset.control input[type=radio]:focus")
    for i, control in enumerate(tax.controls):
        level = 1 + (first_level + i) % tax.levels
        page.keyboard.press(str(level))
        levels[control] = level
        page.keyboard.press("Tab")
    page.keyboard.press("2")  # the expectation question (also a row of choices)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    return levels


def test_rater_rates_with_the_keyboard_changes_an_answer_and_finishes(job_stack):

    s = build(job_stack, per_rater=1, turns=2, page_env={"SENSE7_COMPLETION_CODE": "C0DE-7431"})
    rt, tax = s.rt, s.rt.taxonomy
    tasks = sorted(s.rating_tasks("pg1"), key=lambda t: t.data["turn_index"])
    assert len(tasks) == 2
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 390, "height": 844})
        page.goto(s.links["pg1"])
        assert page.locator("h1").inner_text() == "About you"  # the questionnaire comes first
        answer_questionnaire(page, tax)

        # Turn 1: everything on the page, labelled for screen readers, and no sideways scrolling.
        assert page.locator("#progress").inner_text().startswith("Response 1 of 2 · conversation 1 of 1 · 0 of 2 done")
        assert page.get_by_text(tasks[0].data["turn"][0]["content"]).count() >= 1
        for dim in tax.dimensions:
            assert page.get_by_role("group", name=dim.title).count() == 1
        assert page.get_by_role("radio", name=f"1 {tax.scale[0]}").count() == len(tax.controls)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        first = rate_with_keyboard(page, tax, 0)
        assert page.locator("#progress").inner_text().startswith("Response 2 of 2")

        # Back to turn 1: the earlier answers are there; change the first one.
        with page.expect_navigation():
            page.locator("#previous").click()
        first_control = tax.controls[0]
        assert page.locator(f"input[name={first_control}][value='{first[first_control]}']").is_checked()
        page.locator(f"input[name={first_control}][value='{first[first_control]}']").focus()
        changed = 1 + first[first_control] % tax.levels
        page.keyboard.press(str(changed))
        with page.expect_navigation():
            page.keyboard.press("Enter")
        first[first_control] = changed

        second = rate_with_keyboard(page, tax, 3)  # back at the next open one: turn 2
        assert page.locator("#completion-code").inner_text() == "C0DE-7431"
        page.screenshot(path=str(ARTIFACTS / "rater-page-done.png"))

    expected = {tasks[0].id: first, tasks[1].id: second}

    def in_label_studio():
        found = {}
        for task in rt.client.tasks.list(project=rt.rating_project, fields="all", page_size=1000):
            for annotation in task.annotations or []:
                annotation = dict(annotation)
                found.setdefault(task.id, []).append(
                    {r["from_name"]: r["value"]["rating"] for r in annotation["result"] if r["type"] == "rating"})
        return found if found == {tid: [levels] for tid, levels in expected.items()} else None

    wait_for(in_label_studio, timeout=120, what="exactly the two annotations, with the change, in Label Studio")

    def in_store():
        with rt.store.engine.connect() as conn:
            rows = conn.execute(select(annotations_table.c.task_id, annotations_table.c.rater_id,
                                       ratings_table.c.control, ratings_table.c.value).join(
                ratings_table, ratings_table.c.annotation_id == annotations_table.c.annotation_id)).all()
        got = {}
        for task_id, rater, control, value in rows:
            got.setdefault(task_id, {})[control] = (rater, value)
        want = {tid: {c: ("pg1", v) for c, v in levels.items()} for tid, levels in expected.items()}
        return got == want

    wait_for(in_store, timeout=120, what="the same two annotations in the store, credited to pg1")
