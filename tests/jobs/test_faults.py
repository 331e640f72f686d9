"""Faults on real processes: broker down, duplicate webhooks, Label Studio down, worker killed."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
import requests
from sqlalchemy import select

from sense7.processes import free_port
from sense7.settings import Settings
from sense7.store.tables import annotations as annotations_table, ratings as ratings_table
from tests.support.jobs import TcpProxy, annotate, project_tasks, wait_for
from tests.support.jobs import seed, stored_raters

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def test_annotations_made_while_redis_is_down_arrive_after_reconciliation(job_stack):
    rt, raters, users = seed(job_stack, prefix="f")
    job_stack.env["SENSE7_SYNC_INTERVAL"] = "4"  # beat reconciles every 4 s in this test
    job_stack.start_backend()
    job_stack.start_worker(beat=True)
    # The first beat reconciliation registers the webhooks (and syncs nothing yet).
    wait_for(lambda: len(rt.client.webhooks.list(project=str(rt.rating_project))) == 1, what="webhook registered")

    # A reconciliation already running in the worker would still read Label Studio after Redis stops;
    # wait until the worker holds no job, so that what follows can only arrive through the webhooks.
    from sense7.tasks.celery_app import create_app

    control = create_app(Settings.from_env(job_stack.env)).control

    def worker_idle() -> bool:
        inspect = control.inspect(timeout=1.0)
        active, reserved = inspect.active(), inspect.reserved()
        return bool(active) and not any(active.values()) and not any((reserved or {}).values())

    wait_for(worker_idle, what="the worker to be idle")
    job_stack.redis.stop()
    tasks = project_tasks(rt.client, rt.rating_project)
    made = {}
    for i, task in enumerate(tasks[:20]):
        made[annotate(rt.client, task, users[task.data["rater_id"]], store=rt.store).id] = task.data["rater_id"]
    # Every webhook reached the backend, which could not enqueue: nothing can have been stored.
    assert stored_raters(rt.store) == {}
    assert "event handler failed" in (job_stack.tmp / "logs" / "backend.log").read_text()

    job_stack.redis.start()  # same port, same data directory
    wait_for(lambda: stored_raters(rt.store) == made, timeout=180, what="reconciliation after Redis came back")
    # The backend process enqueues again without a restart.
    body = {"action": "ANNOTATION_UPDATED", "annotation": {"id": next(iter(made))}}
    response = requests.post(f"{job_stack.backend_url}/webhook", json=body, auth=job_stack.backend_auth,
                             headers={"X-Sense7-Secret": rt.settings.webhook_secret}, timeout=5)
    assert response.status_code == 202, response.text


def test_same_webhook_three_times_gives_one_row(job_stack):
    """Replayed webhooks are coalesced: one drain job reads the annotation once; the store has one row."""
    rt, raters, users = seed(job_stack, prefix="d")
    job_stack.start_backend()
    job_stack.start_worker()
    task = next(t for t in project_tasks(rt.client, rt.rating_project) if t.data["rater_id"] == "d2")
    ann = annotate(rt.client, task, users["d2"], store=rt.store)
    body = {"action": "ANNOTATION_CREATED", "project": {"id": rt.rating_project},
            "annotation": {"id": ann.id, "task": task.id}}
    headers = {"X-Sense7-Secret": rt.settings.webhook_secret}
    for _ in range(3):
        response = requests.post(f"{job_stack.backend_url}/webhook", json=body, headers=headers,
                                 auth=job_stack.backend_auth, timeout=5)
        assert response.status_code == 202, response.text
    celery = job_stack.celery()

    def processed():
        stats = celery.control.inspect(timeout=1).stats() or {}
        totals = [s.get("total", {}) for s in stats.values()]
        return sum(t.get("sense7.sync_pending", 0) for t in totals) >= 1 and len(stored_raters(rt.store)) == 1

    wait_for(processed, what="the drain job to store the annotation")
    stats = celery.control.inspect(timeout=1).stats() or {}
    assert sum(s.get("total", {}).get("sense7.sync_pending", 0) for s in stats.values()) <= 3
    assert sum(s.get("total", {}).get("sense7.sync_annotation", 0) for s in stats.values()) == 0
    with rt.store.engine.connect() as conn:
        rows = conn.execute(select(annotations_table)).all()
        n_ratings = len(conn.execute(select(ratings_table)).all())
    assert len(rows) == 1 and rows[0].annotation_id == ann.id and rows[0].rater_id == "d2"
    assert n_ratings == len(rt.taxonomy.controls)
    # And the direct job: first run writes, replays change nothing.
    results = [job_stack.run("sense7.sync_annotation", annotation_id=ann.id) for _ in range(2)]
    assert [r["unchanged"] for r in results] == [1, 1] and all(r["upserted"] == 0 for r in results)


def test_label_studio_unreachable_job_retries_then_succeeds(job_stack):
    rt, raters, users = seed(job_stack, prefix="u")
    tasks = project_tasks(rt.client, rt.rating_project)
    made = {annotate(rt.client, t, users[t.data["rater_id"]], store=rt.store).id for t in tasks[:5]}
    ls = urlparse(rt.settings.ls_url)
    proxy = TcpProxy(free_port(), ls.hostname, ls.port)
    # The worker reaches Label Studio only through the proxy, which is down when the job starts.
    worker = job_stack.start_worker(extra_env={"SENSE7_LS_URL": f"http://127.0.0.1:{proxy.port}"})
    pending = job_stack.celery().send_task("sense7.reconcile")
    wait_for(lambda: "Retry in" in worker.log_file.read_text(errors="replace"),
             what="the job to fail and schedule a retry")
    assert set(stored_raters(rt.store)) == set()
    proxy.start()
    try:
        result = pending.get(timeout=120)
    finally:
        proxy.stop()
    assert result["retries"] >= 1 and result["upserted"] == 5
    assert set(stored_raters(rt.store)) == made


def _fill_store(store, n_conversations: int, raters: list[str], turns: int = 4, seed: int = 1) -> int:
    """Rated conversations written straight into the store (a retrain reads only the store)."""
    from sense7.labelstudio.protocol import parse_annotation
    from sense7.taxonomy import load_taxonomy
    from tests.support.jobs import make_conversations, rating_result

    tax = load_taxonomy()
    convs = make_conversations(raters, per_rater=n_conversations // len(raters), turns=turns, seed=seed,
                               prefix=f"k{seed}")
    store.upsert_conversations(convs)
    ann_id = max(store.annotation_versions(), default=0)
    for k, conv in enumerate(convs):
        for turn in conv.assistant_turns():
            ann_id += 1
            values, expectation, _ = parse_annotation(rating_result(conv.messages[turn].content, bias=k % 3 - 1), tax)
            store.upsert_annotation(ann_id, ann_id, conv.conversation_id, turn, conv.rater_id,
                                    "2026-01-01T00:00:00.000000Z", values, expectation)
    return ann_id


def _predict(backend_url: str, rt, task_data: dict) -> dict:
    config = rt.client.projects.get(rt.rating_project).label_config
    response = requests.post(f"{backend_url}/predict", json={"tasks": [{"id": 1, "data": task_data}],
                                                            "label_config": config},
                             auth=(rt.settings.backend_user, rt.settings.backend_password), timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["results"][0]


def test_worker_killed_during_retrain_leaves_the_served_version_intact(job_stack):
    import redis
    from sense7.tasks.training import LOCK_NAME

    from sense7.model.registry import MANIFEST_NAME, ModelRegistry

    rt = job_stack.runtime()
    raters = ["k1", "k2", "k3"]
    _fill_store(rt.store, 30, raters)
    # Redelivery of the killed job after 10 s; a dead worker's lock expires after 6 s.
    job_stack.env.update({"SENSE7_VISIBILITY_TIMEOUT": "10", "SENSE7_RETRAIN_LOCK_TTL": "6"})
    worker = job_stack.start_worker()
    assert job_stack.run("sense7.retrain", reason="first")["status"] == "promoted"
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    assert registry.current() == "v1"
    job_stack.start_backend()
    task_data = {"conversation_id": "k1-k1-0", "turn_index": 1, "rater_id": "k1", "position": "Response 1 of 4",
                 "history": [{"role": "user", "content": "I feel sad."}],
                 "turn": [{"role": "assistant", "content": "I hear how hard this has been for you."}]}
    before = _predict(job_stack.backend_url, rt, task_data)
    assert before["model_version"] == "v1" and before["result"]

    # Much more data, so the second retrain runs long enough to be killed in the middle.
    _fill_store(rt.store, 1500, raters, seed=2)
    job_stack.celery().send_task("sense7.retrain", kwargs={"reason": "to be killed"})
    conn = redis.Redis.from_url(job_stack.redis.url)
    wait_for(lambda: conn.exists(LOCK_NAME), what="the retrain to start")
    worker.kill()

    # Served version untouched and still answering; no partial version anywhere.
    assert registry.current() == "v1"
    assert [v.name for v in registry.list_versions()] == ["v1"]
    for path in rt.settings.model_dir.iterdir():  # this home's cache of the store's versions, and debris
        assert path.name == "cache" or path.name.startswith(".staging-"), path
    for path in (rt.settings.model_dir / "cache").iterdir():
        assert (path / MANIFEST_NAME).exists()
    after = _predict(job_stack.backend_url, rt, task_data)
    assert after["model_version"] == "v1" and after["result"] == before["result"]

    # A new worker gets the job again (late ack) and finishes it; the killed run's debris is gone.
    job_stack.start_worker(name="worker2")
    def finished() -> bool:  # v2 is added before it is promoted: wait for the whole job, not the folder
        if "v2" not in [v.name for v in registry.list_versions()]:
            return False
        return registry.current() == "v2" or not registry.metrics("v2")["promoted"]

    wait_for(finished, timeout=300, what="the redelivered retrain to finish (and promote) v2")
    assert not [p for p in rt.settings.model_dir.iterdir() if p.name.startswith(".staging-")]
    assert registry.current() == ("v2" if registry.metrics("v2")["promoted"] else "v1")
    wait_for(lambda: _predict(job_stack.backend_url, rt, task_data)["model_version"] == registry.current(),
             timeout=60, what="the backend to serve the current version")
