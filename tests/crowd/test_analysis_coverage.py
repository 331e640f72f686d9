"""The study analysis (`sense7 analyze --study`: JSON, print and HTML report) says, per crowd study, how many
raters each conversation has so far and why it has that many (issue 41 item 5), from the store."""

from __future__ import annotations

from sense7.crowd.lifecycle import assignments_of
from sense7.research.study_analysis import analyze_study
from sense7.research.study_report import render_study_report
from tests.support.crowd import PID_A, TAX, Flow, enter_and_consent, pass_check, rate_everything


def test_the_study_analysis_reports_each_conversations_raters_so_far_and_why(tmp_path):
    flow = Flow(tmp_path, pool=6, k=2, n=2)
    client = flow.client()
    pass_check(client, enter_and_consent(client, PID_A))
    held = set(assignments_of(flow.store, flow.study).of(flow.rater(PID_A)))
    assert len(held) == 2

    (study,) = analyze_study(flow.store, TAX, n_boot=20)["crowd"]
    assert (study["study"], study["k"], study["policy"]) == ("pilot", 2, "least_covered")
    held_now = {cid: c for cid, c in study["conversations"].items() if c["k_so_far"]}
    assert set(held_now) == held and all((c["k_so_far"], c["rated"]) == (1, 0) for c in held_now.values())
    assert {cid: c["reason"] for cid, c in study["conversations"].items()} == \
        {cid: ("uncertain" if cid in held else "below_floor") for cid in study["conversations"]}
    assert sum(study["reasons"].values()) == len(study["conversations"])

    rate_everything(client)
    assert "DONE1234" in client.get("/s/pilot/finish").get_data(as_text=True)  # the slots are done at the finish
    result = analyze_study(flow.store, TAX, n_boot=20)
    rated = {cid: c["rated"] for cid, c in result["crowd"][0]["conversations"].items() if c["rated"]}
    assert rated == {cid: 1 for cid in held}
    html = render_study_report(result)
    assert "Crowd study pilot: raters per conversation" in html and all(cid in html for cid in held)
