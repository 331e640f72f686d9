"""Instructed-response items (attention checks) defined in the taxonomy file (issue 15): the rater page asks
them on the turns the import chose, refuses a form without the answer (keeping nothing), keeps answers in
sense7's store only (never in Label Studio), and the quality checks flag the rater who does not follow them."""

from __future__ import annotations

import json

import pytest
import requests
import yaml

from sense7.settings import QualityPolicy
from sense7.store.rater_page_tables import InstructedAnswers, Outbox
from sense7.taxonomy import DEFAULT_TAXONOMY_PATH
from tests.support.jobs import wait_for
from tests.support.rater_page import csrf_of, hidden, import_randomized_study, serve_study

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

ITEMS = [{"key": "attention_two", "prompt": "To show you are reading carefully, choose 2 here.", "expected": 2},
         {"key": "attention_four", "prompt": "Please choose 4 on this question.", "expected": 4}]


def test_instructed_items_are_asked_kept_apart_and_flag_the_inattentive_rater(job_stack, tmp_path):

    from sense7.rater_page.simulate import RaterBehaviour, rate_through_page
    from sense7.research.study_analysis import analyze_study
    from tests.support.rater_page import study_ratings

    raw = yaml.safe_load(DEFAULT_TAXONOMY_PATH.read_text())
    raw["instructed"] = {"share": 0.5, "items": ITEMS}
    study_yaml = tmp_path / "study.yaml"
    study_yaml.write_text(yaml.safe_dump(raw))
    stack = job_stack
    stack.env["SENSE7_TAXONOMY"] = str(study_yaml)
    rt = stack.runtime()
    tax = rt.taxonomy
    assert [i.key for i in tax.instructed_items] == [i["key"] for i in ITEMS]
    raters, convs = import_randomized_study(stack, 2, "ia", per_rater=2, turns=4, repeat_share=0.0)
    ids = [r["rater_id"] for r in raters]
    url, links = serve_study(stack, ids)

    tasks = [t for t in rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=1000)]
    marked = {t.id: t.data.get("instructed") for t in tasks}
    assert 0 < sum(bool(k) for k in marked.values()) < len(tasks)
    session = requests.Session()
    assert session.get(links["ia1"], timeout=30).status_code == 200
    own = [t for t in tasks if t.data["rater_id"] == "ia1"]
    for task in own:
        page = session.get(f"{url}/task/{task.id}", timeout=30).text
        item = tax.instructed_item(marked[task.id])
        assert ('data-instructed="' in page) == (item is not None)
        if item:
            assert item.prompt in page and f'data-instructed="{item.key}"' in page
            block = page.split(f'data-instructed="{item.key}"')[1].split("</fieldset>")[0]
            assert " checked" not in block  # never pre-filled, whatever the arm

    # A form without the instructed answer is refused and nothing is kept.
    task = next(t for t in own if marked[t.id])
    page = session.get(f"{url}/task/{task.id}", timeout=30).text
    form = {"csrf_token": csrf_of(page), "revision": hidden(page, "revision"), "rendered_at": hidden(page, "rendered_at"),
            tax.expectation_key: tax.expectation_values[1], **{c: "3" for c in tax.controls}}
    refused = session.post(f"{url}/task/{task.id}", data=form, timeout=30, allow_redirects=False)
    assert refused.status_code == 422
    assert Outbox(rt.store).counts()["submissions"] == 0 and InstructedAnswers(rt.store).frame().empty

    traits = {r["rater_id"]: r["traits"] for r in raters}
    rated = rate_through_page(links, study_ratings(convs, tax), traits, tax, 1.0,
                              behaviours={"ia2": RaterBehaviour(attentive=False)}, seed=4)
    assert rated == 16
    wait_for(lambda: rt.store.counts()["annotations"] == 16, timeout=300, what="every rating in the store")

    answers = InstructedAnswers(rt.store).frame()
    assert sorted(answers["task_id"]) == sorted(t for t, k in marked.items() if k)
    result = analyze_study(rt.store, tax, QualityPolicy(), n_boot=50)
    flags = {r: [f["flag"] for f in q["flags"]] for r, q in result["quality"]["raters"].items()}
    assert flags == {"ia1": [], "ia2": ["failed_instructed"]}
    evidence = result["quality"]["raters"]["ia2"]["flags"][0]["evidence"]
    assert evidence["share_correct"] == 0.0 and evidence["items"] == int((answers["rater_id"] == "ia2").sum())
    # Label Studio never sees the attention checks.
    annotations = [a for t in rt.client.tasks.list(project=rt.rating_project, fields="all", page_size=1000)
                   for a in (dict(x) for x in t.annotations or [])]
    assert len(annotations) == 16
    assert not any(item["key"] in json.dumps(a["result"]) for a in annotations for item in ITEMS)
