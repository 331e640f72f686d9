"""Property: any corrupted batch file (NUL bytes, ids a spreadsheet would run and JSON nested past Python's
recursion limit included) ends in a clean error naming the corrupted line, never a traceback, and Label
Studio holds exactly the tasks it held before."""

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sense7.cli import app
from sense7.labelstudio import client as ls_client
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = pytest.mark.labelstudio
runner = CliRunner()

BASE = [c.to_json() for c in synth.generate(6, 3, seed=11, taxonomy=TAXONOMY).conversations]
for i, row in enumerate(BASE):
    row["conversation_id"] = f"fuzz-{i}"  # never imported: a partial import would change the count


def _set(key, value):
    def mutate(row):
        row[key] = value
        return json.dumps(row).encode()
    return mutate


def _message(field, value):
    def mutate(row):
        row["messages"][0][field] = value
        return json.dumps(row).encode()
    return mutate


def _drop(key):
    def mutate(row):
        row.pop(key)
        return json.dumps(row).encode()
    return mutate


def _no_assistant(row):
    row["messages"] = [m for m in row["messages"] if m["role"] != "assistant"] or [{"role": "user", "content": "x"}]
    return json.dumps(row).encode()


# Each corruption makes its line invalid whatever the random choices: the test then demands that line.
CORRUPTIONS = {
    "drop id": st.sampled_from(["conversation_id", "rater_id", "messages"]).map(_drop),
    "bad id": st.sampled_from([None, "", "   ", [], {}, True, "a::b", "x" * 300, "=cmd|' /C calc'!A0", "+1+1", "-2+3",
                               "@SUM(A1)", "a\x00b", "a\ud800b"]).flatmap(
        lambda v: st.sampled_from(["conversation_id", "rater_id"]).map(lambda k: _set(k, v))),
    "bad role": st.text(min_size=0, max_size=8).filter(lambda r: r not in ("user", "assistant", "system")).map(
        lambda r: _message("role", r)),
    "bad content": st.sampled_from([None, "", " \n ", 5, ["x"], "y" * 50_001, "I feel\x00 stuck", "I feel \udc00"]).map(
        lambda v: _message("content", v)),
    "empty messages": st.sampled_from([[], None, "hello", {}]).map(lambda v: _set("messages", v)),
    "no assistant": st.just(_no_assistant),
    "bad context": st.sampled_from([{"emotional_state": 0}, {"empathy_wanted": "lots"}, {"task_type": "gossip"},
                                    {"weather": 1}, "calm", [1]]).map(lambda v: _set("context", v)),
}


@st.composite
def corrupted_files(draw):
    n = len(BASE)
    targets = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
    lines = [json.dumps(row).encode() for row in BASE]
    must_name = []  # per corruption: the lines any one of which the error must name
    for t in targets:
        kind = draw(st.sampled_from(sorted(CORRUPTIONS) + ["truncate", "bad utf-8", "duplicate", "not an object",
                                                           "too deep"]))
        acceptable = {t + 1}
        if kind == "truncate":  # any strict prefix of a JSON object is malformed
            lines[t] = lines[t][:draw(st.integers(1, len(lines[t]) - 1))]
        elif kind == "bad utf-8":
            at = draw(st.integers(0, len(lines[t])))
            lines[t] = lines[t][:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"])) + lines[t][at:]
        elif kind == "duplicate":  # the reader names the later of the two lines
            other = (t + 1) % n
            lines[t] = json.dumps({**BASE[t], "conversation_id": BASE[other]["conversation_id"]}).encode()
            acceptable = {t + 1, other + 1}
            if other in targets:  # the partner is corrupted too and may no longer pair; its own
                acceptable = set(range(1, n + 1))  # corruption is then what gets named, wherever it lands
        elif kind == "too deep":  # nested far past Python's recursion limit, inside the object or as the line
            depth = draw(st.sampled_from([65, 1_000, 100_000]))
            nested = "[" * depth + "]" * depth
            lines[t] = draw(st.sampled_from([nested, json.dumps({**BASE[t], "context": "@"})
                                             .replace('"@"', nested)])).encode()
        elif kind == "not an object":
            lines[t] = draw(st.sampled_from([b"[]", b"42", b'"text"', b"null"]))
        else:
            lines[t] = draw(CORRUPTIONS[kind])(json.loads(json.dumps(BASE[t])))
        must_name.append(acceptable)
    return b"\n".join(lines) + b"\n", must_name


@pytest.fixture(scope="module")
def project(label_studio):
    project_id, _ = ls_client.ensure_projects(label_studio.client, label_studio.settings, TAXONOMY)
    return project_id


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=corrupted_files())
def test_corrupted_batches_fail_cleanly_and_change_nothing(label_studio, project, tmp_path, monkeypatch, case):
    for key, value in label_studio.settings_env().items():
        monkeypatch.setenv(key, value)
    content, must_name = case
    before = ls_client.count_tasks(label_studio.client, project)
    path = tmp_path / "batch.jsonl"
    path.write_bytes(content)
    result = runner.invoke(app, ["import", str(path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    reported = {int(line) for line in re.findall(rf"{path.name}:(\d+):", output)}
    for acceptable in must_name:
        assert reported & acceptable, f"none of lines {acceptable} named in: {output[:500]}"
    assert ls_client.count_tasks(label_studio.client, project) == before
