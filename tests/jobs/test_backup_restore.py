"""A study backed up while it runs and restored into a new home goes on there (issue 40 item 3), on the real stack:
Label Studio, Redis, the Celery worker, the ML backend and the rater page.

Home A: two raters with links, one answered the questionnaire and two turns (delivered to Label Studio, synced
into the store), a served model v1. `sense7 backup` while it runs, A's services stopped, `sense7 restore` into a
fresh home B, and B's own Label Studio (on the restored database), Redis, worker, backend and rater page started:
the links open, the rater's queue shows the earlier answers (and takes a new one, delivered and synced in B),
and B's backend predicts what A's did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from sense7.labelstudio.label_studio_process import LabelStudioServer
from sense7.processes import free_port
from sense7.settings import BACKEND_HOST, Settings
from sense7.store.migrations import head_revision
from tests.support.jobs import serve_synthetic_model, wait_for
from tests.support.stack import JobStack, RedisHandle
from tests.support.rater_page import answer_profile, build, hidden, start_rating_services, stored, submit

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

SENSE7 = str(Path(sys.executable).parent / "sense7")
# What belongs to one home (or one machine's ports): the rest of A's environment is the operator's settings,
# carried over to B as they would be in B's deployment.
HOME_SPECIFIC = ("SENSE7_HOME", "SENSE7_LS_PORT", "SENSE7_LS_URL", "SENSE7_LS_TOKEN", "SENSE7_STORE_URL",
                 "SENSE7_MODEL_DIR", "SENSE7_REDIS_URL", "SENSE7_BACKEND_PORT", "SENSE7_BACKEND_URL")


def predictions(backend_url: str, auth, body: dict) -> list[dict]:
    answer = requests.post(f"{backend_url}/predict", json=body, auth=auth, timeout=120)
    assert answer.status_code == 200, answer.text
    return [{k: v for k, v in result.items() if k != "score"} | {"score": round(result["score"], 9)}
            for result in answer.json()["results"]]


def test_a_study_restored_into_a_new_home_goes_on(job_stack, tmp_path):
    stack = job_stack
    rt = stack.runtime()
    tax = rt.taxonomy
    serve_synthetic_model(rt, "v1")
    s = build(stack)
    a = s.session_for("pg1")
    traits = {f.key: (f.choices[0] if f.type == "choice" else f.max) for f in tax.profile_fields}
    answer_profile(a, s.url, tax, traits)
    answered = s.rating_tasks("pg1")[:2]
    for task in answered:
        assert submit(a, s.url, task.id, tax, 4).status_code == 303
    wait_for(lambda: {tid for tid, (rater, _) in stored(rt).items() if rater == "pg1"} >= {t.id for t in answered},
             timeout=180, what="both answers delivered and synced, credited to pg1")
    label_config = rt.client.projects.get(rt.rating_project).label_config
    body = {"tasks": [{"id": t.id, "data": t.data} for t in s.rating_tasks("pg2")], "label_config": label_config}
    served_in_a = predictions(stack.backend_url, stack.backend_auth, body)
    assert served_in_a and all(r["model_version"].startswith("v1") for r in served_in_a)

    archive = tmp_path / "study.tar.gz"
    made = subprocess.run([SENSE7, "backup", "--out", str(archive), "--json"], env=stack.env, capture_output=True,
                          text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["current_model"] == "v1" and archive.stat().st_mode & 0o777 == 0o600
    stack.close()  # A's worker, backend and page stop (the session's Label Studio serves other tests on)

    home = tmp_path / "home-b"
    redis = RedisHandle(tmp_path / "redis-b", free_port())
    backend_port = free_port()
    env = {k: v for k, v in stack.env.items() if k not in HOME_SPECIFIC}
    env.update({"SENSE7_HOME": str(home), "SENSE7_LS_PORT": str(free_port()), "SENSE7_REDIS_URL": redis.url,
                "SENSE7_BACKEND_PORT": str(backend_port),
                "SENSE7_BACKEND_URL": f"http://{BACKEND_HOST}:{backend_port}"})
    restored = subprocess.run([SENSE7, "restore", str(archive)], env=env, capture_output=True, text=True,
                              timeout=600)
    assert restored.returncode == 0, restored.stderr
    label_studio = LabelStudioServer(Settings.from_env(env))
    stack_b = JobStack(env, tmp_path / "b", redis)
    (tmp_path / "b").mkdir()
    try:
        label_studio.start()
        redis.start()
        rt_b = stack_b.runtime()
        assert rt_b.settings.ls_token == rt.settings.ls_token  # from B's restored secrets, not the environment
        url, _ = start_rating_services(stack_b, rt_b)

        # The links open; pg1's queue has the questionnaire and the two turns answered: it goes to the next turn.
        browser = requests.Session()
        opened = browser.get(s.links["pg1"].replace(s.url, url), timeout=60)
        assert opened.status_code == 200
        assert "/task/" in opened.url, opened.url
        following = int(opened.url.rsplit("/task/", 1)[1])
        assert following in {t.id for t in s.rating_tasks("pg1")} - {t.id for t in answered}
        for task in answered:  # the earlier answers are there: their comment, and the next revision is 2
            page = browser.get(f"{url}/task/{task.id}", timeout=60)
            assert page.status_code == 200 and "level 4" in page.text and hidden(page.text, "revision") == "2"
        other = requests.Session().get(s.links["pg2"].replace(s.url, url), timeout=60)
        assert other.status_code == 200 and other.url.endswith("/profile")
        # The study goes on: a new answer in B reaches B's Label Studio and store, credited to pg1.
        assert submit(browser, url, following, tax, 3).status_code == 303
        wait_for(lambda: stored(rt_b).get(following, (None,))[0] == "pg1", timeout=180,
                 what="the new answer synced in B")
        # B serves the same version, predicting what A did.
        assert predictions(stack_b.backend_url, stack_b.backend_auth, body) == served_in_a
        status = subprocess.run([SENSE7, "status", "--json"], env=env, capture_output=True, text=True, timeout=300)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["store"] == {"revision": head_revision(), "head": head_revision(),
                                                      "up_to_date": True}
        assert [e["action"] for e in rt_b.store.staff_entries()].count("restore") == 1
    finally:
        stack_b.close()
        redis.stop()
        label_studio.stop()
