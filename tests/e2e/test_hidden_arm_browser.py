"""The study's hidden arm in a real browser (issue 15): a hidden-arm task shows no prediction anywhere a rater
could see it, neither on the rater page nor in Label Studio's editor (with the ML backend connected, so the
editor may ask it), while a shown-arm task shows its pre-fill in both."""

from __future__ import annotations

import pytest

from sense7.labelstudio.protocol import connect_backend
from sense7.processes import free_port
from sense7.store.rater_page_tables import LinkBook
from sense7.store.study_design import HIDDEN, SHOWN
from tests.support.browser import ARTIFACTS, NEEDS_CHROMIUM, answer_questionnaire, chromium
from tests.support.rater_page import import_randomized_study, start_page

pytestmark = [pytest.mark.browser, pytest.mark.labelstudio, pytest.mark.slow, NEEDS_CHROMIUM]


def test_hidden_arm_tasks_show_no_prediction_on_the_page_or_in_label_studio(job_stack):
    from sense7.tasks.delivery import refresh_queues

    stack = job_stack
    rt = stack.runtime()
    tax = rt.taxonomy
    import_randomized_study(stack, 1, "hb", per_rater=2, turns=4, repeat_share=0.0)
    stack.start_backend()
    connect_backend(rt.client, rt.rating_project, rt.settings, url=stack.backend_url)
    port = free_port()
    start_page(stack, port)
    link = f"http://127.0.0.1:{port}/r/{LinkBook(rt.store).issue('hb1')}"
    refresh_queues(rt, ["hb1"])
    tasks = list(rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=1000))
    by_arm = {arm: [t for t in tasks if t.data["prefill"] == arm] for arm in (SHOWN, HIDDEN)}
    assert by_arm[SHOWN] and by_arm[HIDDEN]

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 2600})
        page.goto(link)
        answer_questionnaire(page, tax)
        base = link.split("/r/")[0]
        for arm, expected in ((HIDDEN, 0), (SHOWN, len(tax.controls))):
            page.goto(f"{base}/task/{by_arm[arm][0].id}")
            page.wait_for_selector("form.rating-form")
            checked = page.locator("fieldset.control input[type=radio]:checked").count()
            assert checked == expected, (arm, checked)  # expectation question: never pre-filled
            assert page.locator("#prefill-note").count() == (arm == SHOWN)
        page.screenshot(path=str(ARTIFACTS / "hidden-arm-rater-page.png"), full_page=True)

        page.goto(f"{rt.settings.ls_url}/user/login/")
        page.fill('input[name="email"]', rt.settings.ls_admin_email)
        page.fill('input[name="password"]', rt.settings.ls_admin_password)
        page.click('button[type="submit"], input[type="submit"]')
        page.wait_for_load_state("networkidle")
        for arm in (HIDDEN, SHOWN):
            task = by_arm[arm][0]
            page.goto(f"{rt.settings.ls_url}/projects/{rt.rating_project}/data?task={task.id}")
            page.wait_for_selector("ul.ant-rate", timeout=60_000)
            page.wait_for_timeout(2000)  # let a prediction (if any) fill the stars
            stars = page.locator("ul.ant-rate")
            full = sum(stars.nth(i).locator("li.ant-rate-star-full").count() for i in range(stars.count()))
            page.screenshot(path=str(ARTIFACTS / f"hidden-arm-label-studio-{arm}.png"), full_page=True)
            assert (full == 0) == (arm == HIDDEN), (arm, full)
    # Label Studio holds no prediction with a result for the hidden task, even after its editor opened it.
    hidden_predictions = rt.client.predictions.list(task=by_arm[HIDDEN][0].id)
    assert all(not p.result for p in hidden_predictions)
