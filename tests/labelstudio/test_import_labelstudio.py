"""Importing batches into a real Label Studio: one task per (assistant turn, rater), idempotent,
and a bad file changes nothing."""

import json
import math
from collections import Counter

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.labelstudio import client as ls_client
from sense7.readers.formats import read_conversations
from sense7.store.database import Store
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy, render_rating_config

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = pytest.mark.labelstudio
runner = CliRunner()


@pytest.fixture
def cli_env(label_studio, monkeypatch, tmp_path):
    """The CLI pointed at the session's Label Studio, with its own store and project titles."""
    env = label_studio.settings_env()
    env["SENSE7_STORE_URL"] = f"sqlite:///{tmp_path / 'store.sqlite'}"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture(scope="module")
def batch50(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth50")
    synth.write(synth.generate(50, 12, seed=7, taxonomy=TAXONOMY), out)
    return out


def invoke(*args):
    return runner.invoke(app, list(map(str, args)))


def rating_project_id(label_studio):
    return ls_client.find_project(label_studio.client, label_studio.settings.rating_project_title)


def test_project_create_is_accepted_by_the_server_and_idempotent(label_studio, cli_env):
    first = invoke("project", "create")
    assert first.exit_code == 0, first.output
    second = invoke("project", "create")
    assert second.exit_code == 0
    titles = [p.title for p in label_studio.client.projects.list()]
    assert titles.count(label_studio.settings.rating_project_title) == 1
    project = label_studio.client.projects.get(rating_project_id(label_studio))
    assert project.label_config.strip() == render_rating_config(load_taxonomy()).strip()


def test_import_50_conversations_one_task_per_assistant_turn_and_rater_then_reimport_creates_none(
        label_studio, cli_env, batch50):
    conversations = read_conversations(batch50 / "conversations.jsonl", TAXONOMY)
    expected = {(c.conversation_id, i, c.rater_id) for c in conversations for i in c.assistant_turns()}
    assert len(conversations) == 50

    result = invoke("import", batch50 / "conversations.jsonl")
    assert result.exit_code == 0, result.output
    project_id = rating_project_id(label_studio)
    tasks = list(ls_client.iter_tasks(label_studio.client, project_id))
    got = [(t.data["conversation_id"], t.data["turn_index"], t.data["rater_id"]) for t in tasks
           if not t.data.get("repeat_of")]
    assert sorted(got) == sorted(expected)  # exactly one per turn and rater, none missing, none twice
    # The default study design: every task drew a pre-fill arm, and each rater has ceil(5%) of their turns
    # again as hidden repeats (issue 15).
    assert {t.data["prefill"] for t in tasks} == {"shown", "hidden"}
    repeats = [t.data for t in tasks if t.data.get("repeat_of")]
    per_rater = Counter(rater for _, _, rater in expected)
    assert Counter(d["rater_id"] for d in repeats) == {r: math.ceil(0.05 * n) for r, n in per_rater.items()}
    assert all(d["prefill"] == "hidden" for d in repeats)
    assert f"incl. {len(repeats)} repeat(s)" in " ".join(result.output.split())

    again = invoke("import", batch50 / "conversations.jsonl")
    assert again.exit_code == 0 and "0 created" in again.output
    assert ls_client.count_tasks(label_studio.client, project_id) == len(expected) + len(repeats)


def test_task_data_carries_the_turn_and_its_history_but_no_traits_or_context(label_studio, cli_env, batch50):
    assert invoke("import", batch50 / "conversations.jsonl").exit_code == 0
    conv = read_conversations(batch50 / "conversations.jsonl", TAXONOMY)[0]
    turn = conv.assistant_turns()[1]
    keys = ls_client.task_keys(label_studio.client, rating_project_id(label_studio))
    task = label_studio.client.tasks.get(keys[f"{conv.conversation_id}::{turn}::{conv.rater_id}"])
    assert task.data["turn"] == [{"role": "assistant", "content": conv.messages[turn].content}]
    assert [m["content"] for m in task.data["history"]] == [m.content for m in conv.messages[:turn]]
    assert task.data["position"] == "Response 2 of %d" % len(conv.assistant_turns())
    private = {f.key for f in load_taxonomy().profile_fields} | {f.key for f in load_taxonomy().context_fields}
    blob = json.dumps(task.data)
    assert not private & set(task.data) and "emotional_state" not in blob and "@example.org" not in blob


def test_assignments_fan_out_a_conversation_to_more_raters(label_studio, cli_env, tmp_path, batch50):
    conv = read_conversations(batch50 / "conversations.jsonl", TAXONOMY)[3]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(conv.to_json()) + "\n")
    assign = tmp_path / "assign.csv"
    assign.write_text(f"conversation_id,rater_id\n{conv.conversation_id},extra-1\n{conv.conversation_id},extra-2\n")
    result = invoke("import", one, "--assignments", assign)
    assert result.exit_code == 0, result.output
    keys = ls_client.task_keys(label_studio.client, rating_project_id(label_studio))
    for rater in ("extra-1", "extra-2"):
        mine = [k for k in keys if k.startswith(conv.conversation_id + "::") and k.endswith("::" + rater)]
        assert len(mine) == len(conv.assistant_turns())


def test_malformed_file_creates_nothing_and_names_the_line(label_studio, cli_env, tmp_path, batch50):
    assert invoke("project", "create").exit_code == 0
    project_id = rating_project_id(label_studio)
    before = ls_client.count_tasks(label_studio.client, project_id)
    store = Store(cli_env["SENSE7_STORE_URL"])
    store_before = store.snapshot()
    lines = (batch50 / "conversations.jsonl").read_text().splitlines()
    fresh = [json.loads(line) for line in lines[:5]]
    for i, row in enumerate(fresh):
        row["conversation_id"] = f"fresh-{i}"  # new conversations: a partial import would show up
    fresh[3]["messages"][0]["role"] = "narrator"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in fresh) + "\n")
    result = invoke("import", bad)
    assert result.exit_code == 2
    assert f"{bad}:4: messages[0].role: unknown role 'narrator'" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert ls_client.count_tasks(label_studio.client, project_id) == before
    assert store.snapshot() == store_before


def test_raters_import_validates_and_updates_idempotently(cli_env, tmp_path, batch50):
    store = Store(cli_env["SENSE7_STORE_URL"])
    ok = invoke("raters", "import", batch50 / "raters.csv")
    assert ok.exit_code == 0, ok.output
    assert "12 new" in ok.output
    snapshot = store.snapshot()
    assert "0 new, 0 updated" in invoke("raters", "import", batch50 / "raters.csv").output
    assert store.snapshot() == snapshot
    text = (batch50 / "raters.csv").read_text().splitlines()
    header = text[0].split(",")
    row = text[3].split(",")
    row[header.index("tipi_3")] = "11"
    bad = tmp_path / "raters.csv"
    bad.write_text("\n".join([text[0], text[1], text[2], ",".join(row)]) + "\n")
    result = invoke("raters", "import", bad)
    assert result.exit_code == 2 and f"{bad}:4: tipi_3: 11 is outside 1-7" in " ".join(result.output.split())
    assert store.snapshot() == snapshot


def test_traits_of_raters_imported_first_never_reach_task_data(label_studio, cli_env, monkeypatch, tmp_path):
    """The raters (with every trait) are in the store before their conversations are imported: a line
    merging a rater's profile into the task data would show here (the test above imports before any rater
    has traits). Its own projects, so that every task is created by this import."""
    import secrets

    title = f"traits first {secrets.token_hex(4)}"  # (Label Studio's titles are at most 50 characters)
    monkeypatch.setenv("SENSE7_RATING_PROJECT_TITLE", f"{title} rating")
    monkeypatch.setenv("SENSE7_PROFILE_PROJECT_TITLE", f"{title} profile")
    data = synth.generate(8, 4, seed=11, taxonomy=TAXONOMY)
    paths = synth.write(data, tmp_path / "batch")
    imported = invoke("raters", "import", paths["raters.csv"])
    assert imported.exit_code == 0, (imported.output, repr(imported.exception))
    store = Store(cli_env["SENSE7_STORE_URL"])
    raters = store.raters_frame()
    profile = [f for f in TAXONOMY.profile_fields]
    assert len(raters) == 4  # the raters and their traits are known before the import
    result = invoke("import", paths["conversations.jsonl"])
    assert result.exit_code == 0, (result.output, repr(result.exception))
    project = ls_client.find_project(label_studio.client, f"{title} rating")
    tasks = list(ls_client.iter_tasks(label_studio.client, project))
    assert len(tasks) >= sum(len(c.assistant_turns()) for c in data.conversations)

    def keys(value) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {k for v in value.values() for k in keys(v)}
        if isinstance(value, list):
            return {k for v in value for k in keys(v)}
        return set()

    conversations_text = paths["conversations.jsonl"].read_text()
    # Trait values that cannot occur in task data by chance (not in any conversation, not a bare number).
    telling = {str(v) for f in profile if f.type == "choice" for v in raters[f.key].dropna()
               if str(v) not in conversations_text and len(str(v)) >= 4}
    import pandas as pd

    emails = {e for e in pd.read_csv(paths["raters.csv"]).get("email", pd.Series(dtype=str)).dropna() if e}
    private = {f.key for f in profile} | {f.key for f in TAXONOMY.context_fields} | {"traits", "email"}
    assert telling
    for task in tasks:
        blob = json.dumps(task.data)
        assert not private & keys(task.data), (task.id, private & keys(task.data))
        assert not [v for v in telling | emails if v in blob], task.id


def test_import_queues_the_embed_job_for_its_conversations_when_an_encoder_reads_them(
        label_studio, cli_env, batch50, redis_server, tmp_path):
    """With a text encoder (SENSE7_MODEL_TEXT_ENCODER) `sense7 import` queues sense7.embed_texts for the
    conversations it stored (sense7.tasks.embedding); with n-grams only it queues nothing."""
    import base64
    import os
    import subprocess
    import sys

    import redis

    sense7 = os.path.join(os.path.dirname(sys.executable), "sense7")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env.update(cli_env, SENSE7_HOME=str(tmp_path / "home"), SENSE7_REDIS_URL=redis_server.url)
    broker = redis.Redis.from_url(redis_server.url)
    done = subprocess.run([sense7, "import", str(batch50 / "conversations.jsonl")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert broker.llen("sense7.embed") == 0  # n-grams only: nothing to embed
    done = subprocess.run([sense7, "import", str(batch50 / "conversations.jsonl")],
                          env={**env, "SENSE7_MODEL_TEXT_ENCODER": "static"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert broker.llen("sense7.embed") == 1
    message = json.loads(broker.lindex("sense7.embed", 0))
    assert message["headers"]["task"] == "sense7.embed_texts"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    expected = sorted(c.conversation_id for c in read_conversations(batch50 / "conversations.jsonl", TAXONOMY))
    assert kwargs == {"conversation_ids": expected}
