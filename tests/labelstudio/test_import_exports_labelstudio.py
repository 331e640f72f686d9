"""A donated ChatGPT export imported into a real Label Studio: only scrubbed text reaches task data and the
store, the model that answered is kept, the redaction report counts without values; --no-scrub is logged."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.labelstudio import client as ls_client
from sense7.store.database import Store
from tests.support.exports import chatgpt_conversation, write_chatgpt_zip

pytestmark = pytest.mark.labelstudio
runner = CliRunner()

PRIVATE = ["jane.doe@mailbox.example", "Jane", "Doe", "415", "0132", "DE89370400440532013000", "203.0.113.7",
           "https://intranet.acme.example/hr", "Acme"]


def leaked(text: str) -> list[str]:
    """The private values that appear in text as whole tokens: a port (49415), a hash or a timestamp can hold
    "415" or "0132" inside a longer run of digits or letters by chance, a leak never does."""
    return [value for value in PRIVATE if re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text)]


@pytest.fixture
def cli_env(label_studio, monkeypatch, tmp_path):
    """The CLI on the session's Label Studio, with its own store and its own projects (other tests count
    every task of the default projects)."""
    env = label_studio.settings_env()
    env["SENSE7_STORE_URL"] = f"sqlite:///{tmp_path / 'store.sqlite'}"
    env["SENSE7_RATING_PROJECT_TITLE"] = "sense7 exports test: ratings"
    env["SENSE7_PROFILE_PROJECT_TITLE"] = "sense7 exports test: profiles"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _export(tmp_path, cid):
    exchanges = [("Hi, I'm Jane Doe. Draft a note to HR (https://intranet.acme.example/hr) saying my IBAN is "
                  "DE89370400440532013000 and my phone (415) 555-0132.", "Sure, Jane: here is a draft for Acme HR."),
                 ("Also mention my laptop's IP 203.0.113.7 and mail jane.doe@mailbox.example.",
                  "Done. Doe, Jane: I added both.")]
    return write_chatgpt_zip(tmp_path / f"{cid}.zip", [chatgpt_conversation(cid, exchanges, title="Note for Jane",
                                                                             model="gpt-4o")])


def test_export_reaches_label_studio_and_the_store_scrubbed(label_studio, cli_env, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("term: Acme\n")
    result = runner.invoke(app, ["import", str(_export(tmp_path, "gpt-conv-1")), "--rater", "p-exp-1",
                                 "--identifiers", str(ids), "--no-predictions"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "Redaction: 1 of 1 conversation(s) had personal details replaced" in output
    assert leaked(output) == []

    project = ls_client.find_project(label_studio.client, cli_env["SENSE7_RATING_PROJECT_TITLE"])
    tasks = [t.data for t in ls_client.iter_tasks(label_studio.client, project) if t.data["rater_id"] == "p-exp-1"]
    assert {t["turn_index"] for t in tasks} >= {1, 3}
    blob = json.dumps(tasks)
    assert leaked(blob) == []
    last = next(t for t in tasks if t["turn_index"] == 3 and not t.get("repeat_of"))
    assert last["turn"][0]["content"] == "Done. [PERSON_1]: I added both."
    assert "[IBAN_1]" in blob and "[PHONE_1]" in blob and "[URL_1]" in blob and "[TERM_1]" in blob

    store = Store(cli_env["SENSE7_STORE_URL"])
    stored = json.dumps(store.conversations_by_id()["gpt-conv-1"], default=str)
    context = store.contexts_for([("gpt-conv-1", "p-exp-1")])[("gpt-conv-1", "p-exp-1")]
    assert leaked(stored + json.dumps(context)) == []
    assert context["assistant_id"] == "gpt-4o" and context["title"] == "Note for [PERSON_1]"
    entry = store.staff_entries()[-1]
    assert entry["action"] == "import redaction" and entry["detail"]["replaced"]["PERSON"] >= 4
    assert leaked(json.dumps(entry, default=str)) == []


def test_no_scrub_is_explicit_and_logged(label_studio, cli_env, tmp_path):
    result = runner.invoke(app, ["import", str(_export(tmp_path, "gpt-conv-2")), "--rater", "p-exp-2", "--no-scrub",
                                 "--no-predictions"])
    assert result.exit_code == 0, result.output
    assert "--no-scrub" in result.output
    store = Store(cli_env["SENSE7_STORE_URL"])
    assert [e["action"] for e in store.staff_entries()] == ["import --no-scrub"]
    assert "jane.doe@mailbox.example" in json.dumps(store.conversations_by_id()["gpt-conv-2"], default=str)
