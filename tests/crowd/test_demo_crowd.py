"""`sense7 demo --crowd N`'s crowd study through the real stack (Label Studio, Redis, the Celery worker with
beat, the ML backend receiving webhooks, the rater page under gunicorn), with a small N: the simulated
participants end as planned (one declines, one is screened out, one abandons, the rest complete), the
abandoner's lease ends and its unrated tasks are deleted, every answer reaches Label Studio and the store,
and the printed lines say so."""

from __future__ import annotations

import os

import pytest

from tests.support.rater_page import start_rating_services

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def test_the_crowd_demo_ends_with_the_expected_counts(job_stack, monkeypatch):
    from sense7.cli.demo import crowd_lines, run_crowd_study
    from sense7.synthetic import synth
    from sense7.model.bundle import train_bundle
    from sense7.model.registry import ModelRegistry

    stack = job_stack
    for key, value in stack.env.items():  # this process sends jobs to the stack's broker, as the demo does
        monkeypatch.setenv(key, value)
    rt = stack.runtime()
    from sense7.tasks.celery_app import configure

    configure(rt.settings, stack.redis.url)
    tax = rt.taxonomy
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    registry.add(train_bundle(synth.generate(30, 6, seed=2, taxonomy=tax).rating_data(), "v1", tax), "v1")
    registry.promote("v1")
    url, _ = start_rating_services(stack, rt)
    pool = synth.generate(8, 4, seed=5, taxonomy=tax).conversations

    result = run_crowd_study(rt.settings, rt.store, tax, url, 7, pool, seed=3)
    tally, counts = result["tally"], result["participants"]
    assert tally.errors == []
    assert result["kinds"] == {"decline": 1, "screen": 1, "abandon": 1, "complete": 4}
    assert tally.outcomes == {"declined": 1, "screened_out": 1, "abandoned": 1, "completed": 4}
    assert (counts["completed"], counts["declined"], counts["screened_out"], counts["abandoned"]) == (4, 1, 1, 1)
    assert counts["rating"] == counts["checking"] == 0 and result["expired"] == 1
    coverage = result["status"]["coverage"]
    # (The spread may exceed 1 here: slots given back after the last entry are not taken again.)
    assert coverage["in_lease"] == 0 and coverage["rated"] <= coverage["slots"]
    # The abandoner's (the screened-out participant never held a slot: slots come with a passed check).
    assert coverage["rated"] >= 8 and coverage["released"] >= 1
    assert result["tasks_cleared"] > 0
    lines = crowd_lines(result)
    assert any("4 completed" in line and "1 abandoned" in line and "1 declined" in line
               and "1 screened out" in line for line in lines)
    assert any("Live pre-fills" in line for line in lines)
    assert os.path.exists(rt.settings.home / "crowd-demo" / "study.yaml")
