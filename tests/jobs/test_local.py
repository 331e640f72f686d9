"""Pieces that need no Label Studio: the private Redis, the Celery configuration, on_event's routing,
the CLI's refusal of bad configuration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from urllib.parse import urlparse

import pytest
import redis
from sense7.retraining import holdout_conversations
from sense7.tasks.celery_app import celery_config
from sense7.tasks.redis_local import ensure_redis, running_local_url, stop_local_redis

from sense7.settings import JobSettings, Settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_private_redis_is_started_once_per_home_and_stopped(tmp_path):
    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path)})
    url = ensure_redis(settings)
    try:
        assert redis.Redis.from_url(url).ping()
        assert ensure_redis(settings) == url == running_local_url(settings)  # reused, not a second server
        assert (tmp_path / "redis" / "url").read_text() == url
    finally:
        assert stop_local_redis(settings)
    assert running_local_url(settings) is None and not stop_local_redis(settings)


def test_configured_redis_url_wins_and_nothing_is_started(tmp_path):
    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_REDIS_URL": "redis://example.invalid:1/0"})
    assert ensure_redis(settings) == "redis://example.invalid:1/0"
    assert not (tmp_path / "redis").exists()


def test_celery_config_is_reliable_by_default():
    jobs = JobSettings.from_env({})
    conf = celery_config("redis://127.0.0.1:1/0", jobs)
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"] and conf["worker_prefetch_multiplier"] == 1
    assert conf["broker_url"] == conf["result_backend"] == "redis://127.0.0.1:1/0"
    assert conf["broker_transport_options"]["visibility_timeout"] > jobs.retrain_soft_limit + 120
    assert conf["beat_schedule"]["reconcile-labels"]["schedule"] == jobs.sync_interval
    assert JobSettings.from_env({"SENSE7_SYNC_INTERVAL": "7.5", "SENSE7_RETRAIN_EVERY": "30"}).retrain_every == 30


@pytest.mark.slow  # a `sense7` command in a process of its own
def test_bad_job_setting_is_named_and_the_cli_changes_nothing(tmp_path):
    with pytest.raises(ValueError, match="SENSE7_RETRAIN_EVERY"):
        JobSettings.from_env({"SENSE7_RETRAIN_EVERY": "often"})
    env = {**os.environ, "SENSE7_HOME": str(tmp_path), "SENSE7_RETRAIN_EVERY": "often"}
    env.pop("SENSE7_REDIS_URL", None)
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "sense7"), "retrain"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 1
    assert "SENSE7_RETRAIN_EVERY" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "redis").exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize("variable, value, expected", [
    ("SENSE7_MODEL_RATER_RIDGE", "lots", "expected cv, cv_rater, cv_rater_1se or a penalty, got 'lots'"),
    ("SENSE7_MODEL_ALPHA", "-1", "a penalty must be a finite number above 0, got '-1'"),
    ("SENSE7_MODEL_TEXT_ENCODER", "bert", "expected one of static, ngrams, minilm, got 'bert'"),
])
@pytest.mark.slow
def test_a_bad_served_model_option_is_named_and_the_cli_changes_nothing(tmp_path, variable, value, expected):
    env = {**os.environ, "SENSE7_HOME": str(tmp_path), variable: value}
    env.pop("SENSE7_REDIS_URL", None)
    for command, code in (("retrain", 1), ("worker", 1), ("demo", 2)):
        done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "sense7"), command], env=env,
                              capture_output=True, text=True, cwd=REPO, timeout=300)
        assert done.returncode == code, (command, done.stderr)
        assert f"{variable}: {expected}" in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["secrets"], command  # nothing started or made


@pytest.mark.slow
def test_sense7_retrain_fits_the_served_model_options(tmp_path, redis_server):
    """`sense7 retrain` (the retrain job's own code, sense7.tasks.training.run_retrain, under its Redis lock)
    fits a version with SENSE7_MODEL_RATER_RIDGE and records it."""
    from sense7.synthetic import synth
    from sense7.readers.formats import read_conversations, read_raters, read_ratings
    from sense7.store.database import Store
    from sense7.model.registry import ModelRegistry
    from sense7.taxonomy import load_taxonomy

    tax = load_taxonomy()
    synth.write(synth.generate(40, 6, seed=5, taxonomy=tax), tmp_path / "data")
    home = tmp_path / "home"
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.upsert_raters(read_raters(tmp_path / "data" / "raters.csv", tax))
    store.upsert_conversations(read_conversations(tmp_path / "data" / "conversations.jsonl", taxonomy=tax))
    store.import_ratings(read_ratings(tmp_path / "data" / "ratings.csv", tax))
    env = {**os.environ, "SENSE7_HOME": str(home), "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
           "SENSE7_REDIS_URL": redis_server.url, "SENSE7_MODEL_RATER_RIDGE": "30"}
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "sense7"), "retrain"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    registry = ModelRegistry(home / "models", store)
    served = registry.load(registry.current())
    assert served.metrics["personalized_params"] == {"rater_ridge": 30.0, "rater_ridge_from": "text"}
    assert [r.alpha_ for r in served.personalized.rater_ridges_] == [30.0] * len(served.controls)


def test_holdout_is_stable_and_never_empty_or_everything():
    ids = [f"c{i}" for i in range(200)]
    held = holdout_conversations(ids)
    assert held == holdout_conversations(list(reversed(ids)))  # order does not matter
    assert 20 <= len(held) <= 60
    # Adding conversations never moves an old one in or out of the slice.
    assert holdout_conversations(ids + [f"n{i}" for i in range(50)]) & set(ids) == held
    assert len(holdout_conversations(["a", "b"])) == 1 and holdout_conversations(["a"]) == set()


@pytest.mark.slow  # the hook in a process of its own, with Redis
def test_on_event_enqueues_only_what_each_action_needs(tmp_path, redis_server):
    """In a fresh interpreter (the backend's situation): annotation events are noted in Redis and one
    drain job is queued for any number of them (forged or replayed events cost at most a re-read);
    deletions are noted for checking; START_TRAINING queues a retrain; a malformed payload is refused
    with MalformedEvent (the webhook's 400)."""
    code = """
import json
from sense7.labelstudio.protocol import MalformedEvent
from sense7.tasks.sync import on_event
out = [on_event("ANNOTATION_CREATED", {"project": {"id": 1}, "annotation": {"id": 7, "task": 3}}),
       on_event("ANNOTATION_UPDATED", {"project": {"id": 1}, "annotation": {"id": 7, "task": 3}}),
       *[on_event("ANNOTATION_CREATED", {"project": 1, "annotation": {"id": 100 + i, "task": 50 + i}})
         for i in range(50)],
       on_event("ANNOTATIONS_DELETED", {"project": {"id": 1}, "annotations": [{"id": 8}, {"id": 9}]}),
       on_event("START_TRAINING", {"project": {"id": 1}}),
       on_event("PROJECT_UPDATED", {"project": {"id": 1}})]
bad = []
for payload in ({"nothing": 1}, {"annotation": {"id": "x"}}, {"annotation": 5}):
    try:
        on_event("ANNOTATION_CREATED", payload)
    except MalformedEvent:
        bad.append(True)
print(json.dumps({"out": out, "bad": bad}))
"""
    env = {**os.environ, "SENSE7_HOME": str(tmp_path), "SENSE7_REDIS_URL": redis_server.url}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert answers["bad"] == [True, True, True]
    assert [a["enqueued"] for a in answers["out"]] == [["sense7.sync_pending"]] + [[]] * 52 + [
        ["sense7.retrain"], []]
    conn = redis.Redis.from_url(redis_server.url)
    queued = {q: [json.loads(m)["headers"]["task"] for m in conn.lrange(q, 0, -1)]
              for q in ("sense7.sync", "sense7.train", "celery")}
    assert queued == {"sense7.sync": ["sense7.sync_pending"], "sense7.train": ["sense7.retrain"], "celery": []}
    pending = {m.decode() for m in conn.smembers("sense7:sync:pending")}
    assert pending == {"1:3:7"} | {f"1:{50 + i}:{100 + i}" for i in range(50)}
    assert {m.decode() for m in conn.smembers("sense7:sync:deleted")} == {"8", "9"}


@pytest.mark.slow  # the hook in a process of its own
def test_on_event_without_redis_fails_clearly(tmp_path):
    code = "from sense7.tasks.sync import on_event\non_event('ANNOTATION_CREATED', {'annotation': {'id': 1}})"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env["SENSE7_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode != 0 and "RedisUnavailable" in done.stderr and "SENSE7_REDIS_URL" in done.stderr


@pytest.mark.slow
def test_sense7_worker_on_a_fresh_machine_starts_its_own_redis(tmp_path):
    """No SENSE7_REDIS_URL: `sense7 worker` starts a private redis-server under SENSE7_HOME and serves jobs."""
    import signal

    from celery import Celery

    from tests.support.jobs import wait_for

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env.update({"SENSE7_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"})
    settings = Settings.from_env(env)
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "sense7"), "worker", "--no-beat"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    try:
        url = wait_for(lambda: running_local_url(settings), timeout=60, what="the private redis-server")
        # It wants the generated password: a client with only the address is refused.
        parsed = urlparse(url)
        assert parsed.hostname == "127.0.0.1" and parsed.password
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=parsed.hostname, port=parsed.port, socket_timeout=5).ping()
        assert stat.S_IMODE((tmp_path / "redis" / "url").stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "secrets" / "redis_password").stat().st_mode) == 0o600
        assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
        app = Celery("probe", broker=url, backend=url)
        wait_for(lambda: app.control.ping(timeout=0.5), timeout=90, what="the worker to answer")
        # A job runs on it: a retrain with an empty store is skipped with a reason, not an error.
        answer = app.send_task("sense7.retrain", kwargs={"reason": "probe"}).get(timeout=120)
        assert answer["status"] == "skipped" and "no ratings" in answer["reason"]
        app.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
        stop_local_redis(settings)


def test_giving_up_on_a_job_names_it_the_queue_depths_the_backlog_and_the_log(tmp_path, redis_server):
    """No worker consumes: waiting for a reconciliation gives up with what it waited for, every queue's
    depth (the reconciliation and a retrain queued), the sync backlog, that nothing runs, and the log."""
    from sense7.tasks.celery_app import configure
    from sense7.tasks.sync import PENDING_KEY
    from sense7.tasks.waiting import JobWaitTimeout, queue_depths, wait_for_job

    app = configure(Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_REDIS_URL": redis_server.url}))
    redis.Redis.from_url(redis_server.url).sadd(PENDING_KEY, "1:2:3", "1:2:4", "1:5:6")
    app.send_task("sense7.retrain", kwargs={"reason": "test"})
    result = app.send_task("sense7.reconcile")
    try:
        assert queue_depths(app) == {"celery": 0, "sense7.crowd": 0, "sense7.deliver": 0, "sense7.embed": 0,
                                     "sense7.preannotate": 0,
                                     "sense7.reconcile": 1, "sense7.sync": 0, "sense7.train": 1}
        with pytest.raises(JobWaitTimeout) as caught:
            wait_for_job(result, "the reconciliation", 1, "/var/log/worker.log")
        message = str(caught.value)
        assert message.startswith("gave up after 1 s waiting for the reconciliation")
        assert result.id in message and "sense7.reconcile 1" in message and "sense7.train 1" in message
        assert "sense7.sync 0" in message and "3 annotations named by webhooks" in message
        assert "is a worker up?" in message and message.endswith("read /var/log/worker.log")
    finally:
        # The timed-out get() leaves the result among the app's backend's waiters, subscribed on this Redis, until
        # its job finishes (never here). Dropped while the Redis is up; else the process-wide app outlives the
        # Redis, and when a later configure() replaces it, the result's __del__ unsubscribes from a stopped
        # server: "Retry limit exceeded ... Celery result store" as an unraisable warning in some later test.
        result.forget()
