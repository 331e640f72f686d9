"""The whole loop on real processes: Label Studio -> webhook -> ML backend -> Redis -> Celery worker ->
store; retrain -> registry; preannotate -> Label Studio."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from sense7.labelstudio.label_sync import LabelSync

from sense7.labelstudio.protocol import webhook_headers
from sense7.model.registry import ModelRegistry
from tests.support.jobs import annotate, project_tasks, wait_for
from tests.support.jobs import seed, stored_raters

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def test_webhook_sync_retrain_and_preannotate(job_stack):
    job_stack.env.update({"SENSE7_RETRAIN_EVERY": "30", "SENSE7_PREANNOTATE_AFTER_PROMOTE": "1"})
    rt, raters, users = seed(job_stack, prefix="p")
    job_stack.start_backend()
    job_stack.start_worker()
    url = f"{job_stack.backend_url}/webhook"
    hooks = LabelSync.from_runtime(rt).ensure_webhooks(url, webhook_headers(rt.settings))
    # Registering again must not add a second webhook per project.
    assert LabelSync.from_runtime(rt).ensure_webhooks(url, webhook_headers(rt.settings)) == hooks

    tasks = project_tasks(rt.client, rt.rating_project)
    assert len(tasks) == 54
    expected = {}
    # Each rater rates their own tasks; the rater comes from completed_by (user -> email -> rater).
    for i, task in enumerate(tasks[:30]):
        rater = task.data["rater_id"]
        ann = annotate(rt.client, task, users[rater], bias=i % 3 - 1, store=rt.store)
        expected[ann.id] = rater

    # Only the webhooks carry these: no reconciliation is scheduled in this test.
    wait_for(lambda: len(stored_raters(rt.store)) == 30, timeout=180, what="30 annotations via webhooks")
    assert stored_raters(rt.store) == expected
    assert rt.store.counts()["ratings"] == 30 * len(rt.taxonomy.controls)

    # The 30th new annotation (SENSE7_RETRAIN_EVERY=30) enqueued a retrain; its promotion enqueued a
    # preannotation of the remaining tasks.
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    wait_for(lambda: registry.current() == "v1", timeout=300, what="automatic retrain to promote v1")
    metrics = registry.metrics("v1")
    # (coalesced sync may credit a few more in the round that crosses the threshold)
    assert metrics["promoted"] and re.fullmatch(r"(3\d|4\d|5\d) new annotations", metrics["reason"]), metrics["reason"]
    assert metrics["n_train_items"] > 0 and metrics["holdout"]["n_items"] > 0 and "baseline_majority" in metrics
    labeled_ids = {t.id for t in tasks[:30]}

    def preannotated():
        after = project_tasks(rt.client, rt.rating_project)
        unlabeled = [t for t in after if t.id not in labeled_ids]
        return len(unlabeled) == 24 and all("v1" in (t.predictions_model_versions or "") for t in unlabeled)

    wait_for(preannotated, timeout=300, what="the 24 unlabeled tasks to get v1 predictions")
    assert not any(t.predictions_model_versions for t in project_tasks(rt.client, rt.rating_project)
                   if t.id in labeled_ids)
    # Idempotent: running it again finds nothing to do.
    again = job_stack.run("sense7.preannotate")
    assert again["version"] == "v1" and again["pushed"] == 0 and again["pending"] == 0

    # An explicit retrain adds v2 (promoted only if not worse on the same held-out slice).
    result = job_stack.run("sense7.retrain", reason="test")
    assert result["version"] == "v2" and result["status"] in ("promoted", "kept")
    assert registry.current() == ("v2" if result["status"] == "promoted" else "v1")
    listing = subprocess.run([str(Path(sys.executable).parent / "sense7"), "models", "list"], env=job_stack.env,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "v1" in listing.stdout and "v2" in listing.stdout, listing.stderr
