"""A burst of crowd participants prepared by one job through the real stack (Label Studio, Redis, the Celery
worker, the rater page under gunicorn): everyone who passed the check at once gets their tasks from one bulk
import (not one job and 8-10 requests each), each exactly their assigned items, and a job that died
after the import but before the queue copy creates nothing twice when it runs again."""

from __future__ import annotations

import ast
import re

import pytest

from sense7.crowd.lifecycle import install_study, waiting_for_tasks
from sense7.crowd.participants import Studies
from sense7.labelstudio.rater_accounts import account_email
from sense7.store.account_ids import AccountIds
from sense7.store.rater_page_tables import RaterQueue
from tests.support.crowd import write_study
from tests.support.crowd import participant_ids, participants_conversations, until
from tests.support.crowd import consent_session
from tests.support.rater_page import start_page_url

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


class ImportCalls:
    """Counts Label Studio bulk-import requests made by this process (the real call goes through)."""

    def __init__(self, client):
        self.calls: list[int] = []
        real = client.projects.import_tasks

        def counted(project_id, request, **kwargs):
            self.calls.append(len(request))
            return real(project_id, request=request, **kwargs)
        client.projects.import_tasks = counted


def _tasks_by_rater(rt, project) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for task in rt.client.tasks.list(project=project, include="id,data", page_size=1000):
        found.setdefault(task.data["rater_id"], []).append(task.data["task_key"])
    return found


def _assert_exactly_assigned(rt, raters) -> None:
    rating = _tasks_by_rater(rt, rt.rating_project)
    profile = _tasks_by_rater(rt, rt.profile_project)
    for rater in raters:
        keys = rating.get(rater, [])
        assert len(keys) == len(set(keys)), f"{rater}: a task created twice"
        assigned = set(participants_conversations(rt.store, rater))
        assert len(assigned) == 2
        assert {k.split("::")[0] for k in keys} == assigned, rater  # task_key: conversation::turn::rater
        assert profile.get(rater) == [f"profile::{rater}"]
        queued = {i.task_id for i in RaterQueue(rt.store).items(rater) if i.kind == "rating"}
        assert len(queued) == len(keys)


def test_a_burst_of_participants_is_prepared_by_one_bulk_import(job_stack, tmp_path):
    stack = job_stack
    rt = stack.runtime()
    study, _ = install_study(rt.store, write_study(tmp_path / "study", pool=12, turns=2, k=2, n=2), rt.taxonomy)
    Studies(rt.store).set_open(study.study_id, True)
    port_url = start_page_url(stack)

    # 1. Four participants pass the check at once; one prepare pass (in this process, counting requests) makes
    #    all their tasks in one rating import and one questionnaire import.
    for i in range(4):
        consent_session(port_url, f"a1b2c3d4e5f6a7b8c9d0e1{i:02d}")
    first = participant_ids(rt.store)
    assert sorted(r for _, r in waiting_for_tasks(rt.store)) == sorted(first)
    from sense7.tasks.crowd_jobs import prepare_waiting

    imports = ImportCalls(rt.client)
    result = prepare_waiting(rt)
    assert result["rounds"] == 1 and result["participants"] == 4
    assert len(imports.calls) == 2  # the rating tasks of all four, then their four questionnaires
    assert waiting_for_tasks(rt.store) == []
    _assert_exactly_assigned(rt, first)
    # No Label Studio user was made for them: their first turns never wait on that (delivery makes each account
    # with the participant's first answer).
    emails = {(u.email or "").lower() for u in rt.client.users.list()}
    assert not {account_email(r) for r in first} & emails and AccountIds(rt.store).of(first) == {}

    # 2. A job that died after Label Studio took the import but before the queue copy (two queue copies
    #    gone), with two new arrivals: the next pass imports the new ones' tasks only, nothing twice.
    for rater in first[:2]:
        RaterQueue(rt.store).replace(rater, [])
    for i in range(2):
        consent_session(port_url, f"b1b2c3d4e5f6a7b8c9d0e1{i:02d}")
    second = [r for r in participant_ids(rt.store) if r not in first]
    imports.calls.clear()
    result = prepare_waiting(rt)
    assert result["rounds"] == 1 and result["participants"] == 4
    assert sum(imports.calls) == sum(len(t) for r, t in _tasks_by_rater(rt, rt.rating_project).items()
                                     if r in second) + 2  # + their two questionnaires
    _assert_exactly_assigned(rt, first + second)

    # 3. Through the worker: four pass the check while no worker runs (their pages ask for the job: one is
    #    queued, the flag set), and the queued job is lost with its worker (the flag stays, as a killed
    #    worker leaves it: new asks queue nothing). A starting worker resumes: the four in one round.
    for i in range(4):
        consent_session(port_url, f"c1b2c3d4e5f6a7b8c9d0e1{i:02d}")
    third = [r for r in participant_ids(rt.store) if r not in first + second]
    assert len(third) == 4
    import redis

    from sense7.tasks.crowd_jobs import SCHEDULED_KEY

    broker = redis.Redis.from_url(stack.redis.url)
    assert broker.llen("sense7.crowd") == 1 and broker.exists(SCHEDULED_KEY)
    broker.delete("sense7.crowd")  # the job is gone; only the worker's start-up can bring it back
    worker = stack.start_worker()
    until(lambda: not waiting_for_tasks(rt.store), what="the burst's tasks")
    _assert_exactly_assigned(rt, first + second + third)
    until(lambda: _prepare_results(worker.log_file.read_text(errors="replace")), what="the job's result line")
    results = _prepare_results(worker.log_file.read_text(errors="replace"))
    assert sum(r["participants"] for r in results) == 4
    assert sum(r["rounds"] for r in results) == 1  # one bulk import for the four (a second job finds nobody)


def _prepare_results(log: str) -> list[dict]:
    return [ast.literal_eval(m.group(1)) for m in
            re.finditer(r"sense7\.crowd_prepare\[[^\]]+\] succeeded in [^:]+: (\{.*?\})\s*$", log, re.M)]
