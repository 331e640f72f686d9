"""Re-import never diverges silently: changed text is an error that writes nothing; --replace updates
Label Studio and the store together for turns nobody rated, and refuses (writing nothing) where
ratings exist. Against the real Label Studio."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.labelstudio import client as ls_client
from sense7.store.database import Store

pytestmark = pytest.mark.labelstudio


def _conversation(cid: str, rater: str, last_reply: str) -> dict:
    return {"conversation_id": cid, "rater_id": rater, "context": {},
            "messages": [{"role": "user", "content": "I lost my job today."},
                         {"role": "assistant", "content": "I'm so sorry. How are you holding up?"},
                         {"role": "user", "content": "Not great, honestly."},
                         {"role": "assistant", "content": last_reply}]}


def _write(path, conversations) -> str:
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    return str(path)


@pytest.fixture
def env(label_studio, monkeypatch, tmp_path):
    values = {**label_studio.settings_env(), "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
              "SENSE7_RATING_PROJECT_TITLE": f"reimport {os.getpid()} {tmp_path.name[-12:]}",
              "SENSE7_PROFILE_PROJECT_TITLE": f"reimport p {os.getpid()} {tmp_path.name[-12:]}",
              # One task per turn: a test-retest repeat of a changed turn would be replaced with it (and counted).
              "SENSE7_REPEAT_SHARE": "0"}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def _state(label_studio, env):
    """Everything an import could change: Label Studio's tasks (ids and data) and the store."""
    client = label_studio.client
    project = ls_client.find_project(client, env["SENSE7_RATING_PROJECT_TITLE"])
    tasks = sorted((t.id, json.dumps(t.data, sort_keys=True)) for t in
                   client.tasks.list(project=project, include="id,data", page_size=1000))
    return tasks, Store(env["SENSE7_STORE_URL"]).snapshot()


def test_changed_text_is_an_error_and_replace_updates_only_unrated_turns(label_studio, env, tmp_path):
    runner = CliRunner()
    first = _write(tmp_path / "v1.jsonl", [_conversation("ri-a", "ri-r1", "That must be hard."),
                                           _conversation("ri-b", "ri-r2", "Do you want to talk about it?")])
    done = runner.invoke(app, ["import", first])
    assert done.exit_code == 0, (done.output, str(getattr(done.exception, "body", done.exception)))
    before = _state(label_studio, env)

    # Line 2's last reply was edited: an error naming file:line and the message, nothing written.
    edited = _write(tmp_path / "v2.jsonl", [_conversation("ri-a", "ri-r1", "That must be hard."),
                                            _conversation("ri-b", "ri-r2", "EDITED reply.")])
    refused = runner.invoke(app, ["import", edited])
    assert refused.exit_code == 2
    assert f"{edited}:2: conversation ri-b, message 3" in refused.output and "--replace" in refused.output
    assert _state(label_studio, env) == before

    # --replace: the unrated turn is re-created with the new text, Label Studio and the store agree.
    replaced = runner.invoke(app, ["import", edited, "--replace"])
    assert replaced.exit_code == 0, replaced.output
    assert "1 replaced" in replaced.output
    client = label_studio.client
    project = ls_client.find_project(client, env["SENSE7_RATING_PROJECT_TITLE"])
    texts = {(t.data["conversation_id"], t.data["turn_index"]): t.data["turn"][0]["content"]
             for t in client.tasks.list(project=project, include="id,data", page_size=1000)}
    assert texts[("ri-b", 3)] == "EDITED reply." and texts[("ri-a", 3)] == "That must be hard."
    assert len(texts) == 4  # no stale task left behind
    assert Store(env["SENSE7_STORE_URL"]).conversations_by_id()["ri-b"][3].content == "EDITED reply."

    # Once the turn is rated, --replace refuses and writes nothing.
    rated = next(t for t in client.tasks.list(project=project, include="id,data", page_size=1000)
                 if t.data["conversation_id"] == "ri-b" and t.data["turn_index"] == 3)
    client.annotations.create(rated.id, result=[{"from_name": "overall", "to_name": "turn", "type": "rating",
                                                  "value": {"rating": 4}}])
    after_rating = _state(label_studio, env)
    again = _write(tmp_path / "v3.jsonl", [_conversation("ri-b", "ri-r2", "Edited a second time.")])
    refused = runner.invoke(app, ["import", again, "--replace"])
    assert refused.exit_code == 2
    assert f"{again}:1: conversation ri-b, message 3: its turns from there on have ratings" in refused.output
    assert _state(label_studio, env) == after_rating
