"""The stack with Label Studio *and* our store on PostgreSQL (127.0.0.1:5432, trust auth, user postgres):
fresh databases for this run, dropped afterwards. Webhooks, an update and a deletion end up in the store."""

from __future__ import annotations

import os
import secrets

import pytest

from sense7.processes import free_port
from sense7.settings import BACKEND_HOST, Settings
from tests.support.stack import JobStack, RedisHandle
from tests.support.jobs import annotate, project_tasks, rating_result, wait_for
from tests.support.jobs import seed, stored_raters
from tests.support.jobs import PG

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


@pytest.fixture
def pg_stack(pg_databases, tmp_path, monkeypatch):
    from label_studio_sdk import LabelStudio

    from sense7.labelstudio.label_studio_process import LabelStudioServer

    home = tmp_path / "home"
    port = free_port()
    settings = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_LS_PORT": str(port),
                                  "SENSE7_LS_DATABASE_URL": f"{PG}/{pg_databases['ls']}"})
    server = LabelStudioServer(settings)
    server.start()
    # The premise of every test here: Label Studio's own tables are in PostgreSQL, not in a SQLite file.
    import sqlalchemy
    ls_db = f"{PG}/{pg_databases['ls']}".replace("postgresql://", "postgresql+psycopg2://")
    try:
        with sqlalchemy.create_engine(ls_db).connect() as conn:
            assert conn.scalar(sqlalchemy.text("select count(*) from information_schema.tables "
                                               "where table_name = 'project'")) == 1
        assert not (home / "label-studio" / "label_studio.sqlite3").exists()
    except BaseException:
        server.stop()  # the teardown below is not reached from here
        raise
    redis = RedisHandle(tmp_path / "redis", free_port())
    redis.start()
    backend_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env.update({
        "SENSE7_HOME": str(home), "SENSE7_LS_PORT": str(port), "SENSE7_LS_URL": settings.ls_url,
        "SENSE7_LS_TOKEN": settings.ls_token,
        "SENSE7_STORE_URL": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{pg_databases['store']}",
        "SENSE7_MODEL_DIR": str(tmp_path / "models"), "SENSE7_REDIS_URL": redis.url,
        "SENSE7_BACKEND_PORT": str(backend_port), "SENSE7_BACKEND_URL": f"http://{BACKEND_HOST}:{backend_port}",
        "SENSE7_BACKEND_USER": "sense7-test", "SENSE7_BACKEND_PASSWORD": secrets.token_hex(12),
        "SENSE7_SYNC_INTERVAL": "3600", "SENSE7_RETRAIN_EVERY": "0", "SENSE7_PREANNOTATE_AFTER_PROMOTE": "0",
        "SENSE7_RETRY_BACKOFF": "1", "SENSE7_RETRY_BACKOFF_MAX": "4", "PYTHONUNBUFFERED": "1",
    })
    stack = JobStack(env, tmp_path, redis)
    try:
        assert LabelStudio(base_url=settings.ls_url, api_key=settings.ls_token).users.whoami().id
        yield stack
    finally:
        stack.close()
        redis.stop()
        server.stop()


def test_label_studio_and_store_on_postgresql(pg_stack):
    from sqlalchemy import inspect

    rt, raters, users = seed(pg_stack, prefix="g")
    assert rt.store.engine.dialect.name == "postgresql"
    assert "annotations" in inspect(rt.store.engine).get_table_names()
    pg_stack.start_backend()
    pg_stack.start_worker()
    from sense7.labelstudio.label_sync import LabelSync

    from sense7.labelstudio.protocol import webhook_headers

    LabelSync.from_runtime(rt).ensure_webhooks(f"{pg_stack.backend_url}/webhook", webhook_headers(rt.settings))
    tasks = project_tasks(rt.client, rt.rating_project)
    made = {}
    for i, task in enumerate(tasks[:12]):
        rater = task.data["rater_id"]
        made[annotate(rt.client, task, users[rater], store=rt.store).id] = rater
    wait_for(lambda: stored_raters(rt.store) == made, timeout=180, what="12 annotations via webhooks")

    # A staff update and a deletion in Label Studio, delivered by webhooks only: the update is held (kept,
    # not counted as the rater's), the rater's delivered rating stays.
    first, second = list(made)[:2]
    rt.client.annotations.update(first, result=rating_result("changed", bias=3))
    rt.client.annotations.delete(second)
    del made[second]

    def caught_up():
        frame = rt.store.ratings_frame()
        return stored_raters(rt.store) == made and len(frame) == 11 * len(rt.taxonomy.controls) \
            and [row["annotation_id"] for row in rt.store.held()] == [first]

    wait_for(caught_up, timeout=120, what="update and deletion via webhooks")
    # The reconciliation agrees with what the webhooks produced.
    result = pg_stack.run("sense7.reconcile")
    assert result["upserted"] == 0 and result["deleted"] == 0 and result["unchanged"] == 11
