"""Issue 15 on the real stack: a randomized study rated through the rater page by simulated raters, two of
whom are planted bad ones (rushing, straight-lining). The hidden arm shows no pre-fill, the quality checks
flag exactly the two planted raters, live metrics use hidden-arm ratings only, and `sense7 status --json`
counts what the store holds."""

from __future__ import annotations

import json
import subprocess

import pytest
from sqlalchemy import func, select

from sense7.settings import QualityPolicy
from sense7.store.study_design import HIDDEN, SHOWN, StudyRecords
from sense7.store.tables import annotations
from tests.support.stack import VENV_BIN
from tests.support.jobs import wait_for
from tests.support.rater_page import import_randomized_study, serve_study
from tests.support.rater_page import study_ratings

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

RUSHING, STRAIGHT = "qs1", "qs2"


def test_a_randomized_study_hides_pre_fills_flags_the_planted_raters_and_reports_status(job_stack):

    from sense7.model.registry import ModelRegistry
    from sense7.rater_page.simulate import RaterBehaviour, rate_through_page
    from sense7.research.study_analysis import analyze_study

    stack = job_stack
    rt = stack.runtime()
    tax = rt.taxonomy
    raters, convs = import_randomized_study(stack, 6, "qs", per_rater=3, turns=4, repeat_share=0.2)
    ids = [r["rater_id"] for r in raters]
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    url, links = serve_study(stack, ids)

    # Before anyone rates: a hidden-arm turn shows no pre-fill on the page, a shown-arm turn does.
    arms = dict(zip(*StudyRecords(rt.store).arms_frame()[["task_key", "arm"]].T.values))
    tasks = [t for t in rt.client.tasks.list(project=rt.rating_project, include="id,data", page_size=1000)
             if t.data["rater_id"] == "qs3"]
    session = __import__("requests").Session()
    assert session.get(links["qs3"], timeout=30).status_code == 200
    seen = set()
    for task in tasks:
        page = session.get(f"{url}/task/{task.id}", timeout=30).text
        arm = arms[task.data["task_key"]]
        seen.add(arm)
        assert ('id="prefill-note"' in page) == (arm == SHOWN), task.data["task_key"]
        if arm == HIDDEN:
            assert " checked>" not in page.split('name="' + tax.expectation_key)[0]
    assert seen == {SHOWN, HIDDEN}

    behaviours = {RUSHING: RaterBehaviour(seconds=(1.0, 2.0)), STRAIGHT: RaterBehaviour(straight_line=3)}
    traits = {r["rater_id"]: r["traits"] for r in raters}
    rated = rate_through_page(links, study_ratings(convs, tax), traits, tax, 1.0, behaviours=behaviours,
                              default=RaterBehaviour(copy_probability=0.5), seed=1)
    assigned = 6 * 12 + 6 * 3  # 12 turns each, plus ceil(0.2 x 12) = 3 repeats each
    assert rated == assigned

    def credited() -> int:
        with rt.store.engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(annotations).where(
                annotations.c.deleted.is_(False), annotations.c.rater_id.is_not(None),
                annotations.c.quarantine.is_(None)))

    wait_for(lambda: credited() == assigned, timeout=300, what="every rating in the store")

    result = analyze_study(rt.store, tax, QualityPolicy(), n_boot=200)
    json.dumps(result, allow_nan=False)
    quality = result["quality"]["raters"]
    assert result["quality"]["flagged"] == [RUSHING, STRAIGHT]
    assert [f["flag"] for f in quality[RUSHING]["flags"]] == ["too_fast"]
    assert quality[RUSHING]["flags"][0]["evidence"]["median_seconds"] < 2.5
    assert [f["flag"] for f in quality[STRAIGHT]["flags"]] == ["straight_lining"]
    for rater in set(ids) - {RUSHING, STRAIGHT}:
        assert quality[rater]["flags"] == [] and quality[rater]["retest"]["pairs"] == 3
        assert 8 <= quality[rater]["median_seconds"] <= 40

    # Live metrics come from hidden-arm ratings only (repeats excluded): one rated turn each.
    hidden_turns = sum(1 for key, arm in arms.items() if arm == HIDDEN and "::repeat" not in key)
    assert result["live"]["all"]["n_ratings"] == hidden_turns
    assert result["anchoring"]["arms"]["shown"]["n_tasks"] + result["anchoring"]["arms"]["hidden"]["n_tasks"] == 6 * 12

    # Retraining leaves the flagged raters out.
    from sense7.retraining import Retrainer

    retrained = Retrainer(rt.store, registry, tax, quality=QualityPolicy()).run("test")
    assert retrained.metrics["excluded_raters"] == 2

    # The project manager's view, through the CLI: done adds up to the store's credited annotations.
    out = subprocess.run([str(VENV_BIN / "sense7"), "status", "--json"], env=stack.env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert sum(r["done"] for r in status["raters"]) == credited() == status["totals"]["done"]
    assert {r["rater_id"]: r["assigned"] for r in status["raters"]} == {r: 15 for r in ids}
    assert {r["rater_id"] for r in status["raters"] if r["flags"]} == {RUSHING, STRAIGHT}
    assert status["arms"]["shown"]["done"] + status["arms"]["hidden"]["done"] == 6 * 12

    # The researcher's view: the same analysis through `sense7 analyze --study`, with JSON and an HTML report,
    # and the live metrics per version in `sense7 models list`.
    out_json, out_html = stack.tmp / "study.json", stack.tmp / "study.html"
    out = subprocess.run([str(VENV_BIN / "sense7"), "analyze", "--study", "--boot", "50", "--json", str(out_json),
                          "--report", str(out_html)], env=stack.env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"{RUSHING}: too_fast" in out.stdout and f"{STRAIGHT}: straight_lining" in out.stdout
    assert {oct(f.stat().st_mode & 0o777) for f in (out_json, out_html)} == {"0o600"}  # rater ids and flags
    analysed = json.loads(out_json.read_text())
    assert analysed["quality"]["flagged"] == [RUSHING, STRAIGHT]
    assert analysed["live"]["all"]["n_ratings"] == hidden_turns
    html = out_html.read_text()
    assert "Live evaluation (hidden arm)" in html and "too_fast: median_seconds=" in html
    assert not any(m.content in html for c in convs for m in c.messages)  # no conversation text in the report
    out = subprocess.run([str(VENV_BIN / "sense7"), "models", "list"], env={**stack.env, "COLUMNS": "250"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"({hidden_turns})" in out.stdout  # v1's live cell: n = the hidden-arm turns it predicted
