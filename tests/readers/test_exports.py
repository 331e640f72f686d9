"""Participants' donated exports (ChatGPT, Claude, ShareGPT): the path the user saw, markers for what is not
text, selection, and a malformed export refused whole with file, conversation and field."""

from __future__ import annotations

import json
import zipfile

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.readers.exports import parse_when, read_export
from sense7.readers.formats import FormatError
from sense7.store.database import Store
from tests.support.exports import (BASE_TIME, CLAUDE_USERS, chatgpt_conversation, claude_conversation,
                                        sharegpt_conversation, write_chatgpt_zip, write_json)

runner = CliRunner()
EXCHANGES = [("How do I sort a list?", "Use sorted(xs).\n\n```python\nsorted([3, 1])\n```"),
             ("And in reverse?", "sorted(xs, reverse=True)")]


def test_chatgpt_follows_current_node_skips_branches_system_and_tools_and_keeps_the_model(tmp_path):
    conv = chatgpt_conversation("c1", EXCHANGES, title="Sorting", image_in_first=True, tool_call=True,
                                model="gpt-4o")
    export = read_export(write_chatgpt_zip(tmp_path / "export.zip", [conv]), rater="r1")
    (got,) = export.conversations
    assert [m.role for m in got.messages] == ["user", "assistant", "user", "assistant"]
    text = "\n".join(m.content for m in got.messages)
    assert "BRANCH" not in text and "You are ChatGPT" not in text  # branches and the hidden system message
    assert "print(1)" not in text  # the call to a tool is not what the user was shown
    assert got.messages[0].content.startswith("[image]") and "[attachment]" in got.messages[0].content
    assert "```python" in got.messages[1].content  # code blocks kept as written
    assert got.context["assistant_id"] == "gpt-4o" and got.context["assistant_ids"] == {"1": "gpt-4o", "3": "gpt-4o"}
    assert got.context["title"] == "Sorting" and got.context["created"].startswith("2025-01-01")
    assert got.rater_id == "r1" and got.conversation_id == "c1"
    assert export.account.emails == ("jane.doe@mailbox.example",) and export.account.phones == ("+14155550132",)
    assert export.account.names == ("jane doe",)  # user.json has no name: the e-mail's local part stands for it


def test_chatgpt_conversations_json_alone_and_an_empty_conversation_is_left_out(tmp_path):
    empty = chatgpt_conversation("c-empty", [], title="nothing")
    path = write_json(tmp_path / "conversations.json", [chatgpt_conversation("c1", EXCHANGES), empty])
    export = read_export(path, rater="r1")
    assert [c.conversation_id for c in export.conversations] == ["c1"]
    assert export.skipped["no assistant reply (empty)"] == 1


def test_claude_blocks_and_plain_text_and_its_users_file(tmp_path):
    convs = [claude_conversation("k1", EXCHANGES), claude_conversation("k2", EXCHANGES, blocks=False)]
    convs[0]["chat_messages"][0]["content"].append({"type": "image", "source": {}})
    convs[0]["chat_messages"][0]["files"] = [{"file_name": "jane_cv.pdf"}]
    path = write_json(tmp_path / "conversations.json", convs)
    write_json(tmp_path / "users.json", CLAUDE_USERS)
    export = read_export(path, rater="r2")
    assert [c.conversation_id for c in export.conversations] == ["k1", "k2"]
    first = export.conversations[0].messages[0].content
    assert "[image]" in first and "[attachment]" in first and "jane_cv" not in first
    assert export.conversations[1].messages[1].content == EXCHANGES[0][1]
    assert export.account.names == ("Jane Doe",)


def test_sharegpt_list_and_jsonl(tmp_path):
    convs = [sharegpt_conversation("s1", EXCHANGES), sharegpt_conversation("s2", EXCHANGES[:1])]
    listed = read_export(write_json(tmp_path / "sg.json", convs), rater="r3")
    lines = tmp_path / "sg.jsonl"
    lines.write_text("\n".join(json.dumps(c) for c in convs))
    assert [c.conversation_id for c in listed.conversations] == ["s1", "s2"]
    as_lines = read_export(lines, rater="r3", fmt="sharegpt")
    assert [c.messages for c in as_lines.conversations] == [c.messages for c in listed.conversations]


def test_select_since_and_until(tmp_path):
    day = 86_400
    convs = [chatgpt_conversation(f"c{i}", EXCHANGES, created=BASE_TIME + i * 31 * day) for i in range(4)]
    path = write_chatgpt_zip(tmp_path / "e.zip", convs)
    assert [c.conversation_id for c in read_export(path, "r1", select={"c1", "c3"}).conversations] == ["c1", "c3"]
    window = read_export(path, "r1", since=parse_when("2025-02-01", "--since"), until=parse_when("2025-04-01", "--until"))
    assert [c.conversation_id for c in window.conversations] == ["c1", "c2"]
    with pytest.raises(FormatError, match="--select: not in the export: nope"):
        read_export(path, "r1", select={"c1", "nope"})
    with pytest.raises(ValueError, match="--since"):
        parse_when("last tuesday", "--since")


def test_malformed_export_names_file_conversation_and_field(tmp_path):
    good = chatgpt_conversation("c1", EXCHANGES)
    broken = chatgpt_conversation("c2", EXCHANGES)
    node = next(k for k, n in broken["mapping"].items() if n["message"] and n["message"]["author"]["role"] == "user")
    broken["mapping"][node]["parent"] = "no-such-node"
    path = write_json(tmp_path / "conversations.json", [good, broken])
    with pytest.raises(FormatError) as info:
        read_export(path, "r1")
    assert str(info.value) == f"{path}: conversation c2: mapping.no-such-node: a parent named here is missing from the mapping"
    claude = claude_conversation("k1", EXCHANGES)
    claude["chat_messages"][1]["sender"] = "robot"
    with pytest.raises(FormatError, match=r"conversation k1: chat_messages\[1\]\.sender: unknown sender 'robot'"):
        read_export(write_json(tmp_path / "c.json", [claude]), "r1")
    (tmp_path / "bad.json").write_text('[{"mapping": {}, ')
    with pytest.raises(FormatError, match=r"bad\.json: bad\.json: malformed JSON"):
        read_export(tmp_path / "bad.json", "r1")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("notes.txt", "hi")
    with pytest.raises(FormatError, match="conversations.json: not in the ZIP"):
        read_export(tmp_path / "other.zip", "r1")
    with pytest.raises(FormatError, match="--rater"):
        read_export(path, "")


def test_ten_megabyte_export_reads_whole(tmp_path):
    long_answer = "A long answer. " * 700  # ~10 kB a turn
    convs = [chatgpt_conversation(f"c{i}", [(f"question {i}", long_answer)] * 3) for i in range(340)]
    path = write_chatgpt_zip(tmp_path / "big.zip", convs)
    assert len(json.dumps(convs)) > 10_000_000
    export = read_export(path, "r1")
    assert len(export.conversations) == 340
    assert all(len(c.assistant_turns()) == 3 for c in export.conversations)


# -- the command, as a stranger would use it (no Label Studio needed: everything fails before it) -----------
@pytest.fixture
def home(tmp_path, monkeypatch):
    for name in ("SENSE7_STORE_URL", "SENSE7_MODEL_DIR", "SENSE7_LS_URL", "SENSE7_LS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SENSE7_LS_PORT", "9")  # nothing listens there: a command that got that far would fail
    return tmp_path / "home"


def _one_error(result, code=2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("error: ")
    return result.output


@pytest.mark.parametrize("args, expected", [
    (["--rater", "r1"], "conversation c2: mapping.no-such-node"),
    ([], "--rater: an export names no rater id"),
    (["--rater", "r1", "--select", "missing-id"], "--select: not in the export: missing-id"),
    (["--rater", "r1", "--since", "yesterday"], "--since: expected a date"),
    (["--rater", "a::b"], "--rater"),
])
def test_import_command_refuses_bad_exports_and_writes_nothing(home, tmp_path, args, expected):
    broken = chatgpt_conversation("c2", EXCHANGES)
    node = next(iter(k for k, n in broken["mapping"].items() if n["parent"] is not None))
    if "--select" not in args and "--since" not in args and args != [] and args[1] != "a::b":
        broken["mapping"][node]["parent"] = "no-such-node"
    path = write_chatgpt_zip(tmp_path / "export.zip", [chatgpt_conversation("c1", EXCHANGES), broken])
    out = _one_error(runner.invoke(app, ["import", str(path), *args]))
    assert expected in out
    store = home / "store.sqlite"
    assert not store.exists() or not json.loads(Store(f"sqlite:///{store}").snapshot())["conversations"]


def test_select_on_a_native_file_is_one_line(home, tmp_path):
    native = tmp_path / "c.jsonl"
    native.write_text(json.dumps({"conversation_id": "x", "rater_id": "r1", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
    out = _one_error(runner.invoke(app, ["import", str(native), "--since", "2025-01-01"]))
    assert "apply to assistants' data exports" in out


def test_unreadable_identifier_list_is_one_line(home, tmp_path):
    path = write_chatgpt_zip(tmp_path / "export.zip", [chatgpt_conversation("c1", EXCHANGES)])
    ids = tmp_path / "ids.txt"
    ids.write_text("Jane Doe\nemployer: Acme\n")
    out = _one_error(runner.invoke(app, ["import", str(path), "--rater", "r1", "--identifiers", str(ids)]))
    assert f"{ids}:2: entry: unknown kind 'employer'" in out


def test_claude_zip_and_an_overlong_message_is_cut_with_a_marker(tmp_path):
    from sense7.readers.exports import TRUNCATED
    from sense7.readers.formats import MAX_CONTENT_CHARS

    conv = claude_conversation("k1", [("q", "x" * (MAX_CONTENT_CHARS + 10))])
    path = tmp_path / "claude.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data-2025/conversations.json", json.dumps([conv]))
        archive.writestr("data-2025/users.json", json.dumps(CLAUDE_USERS))
    export = read_export(path, "r1")
    answer = export.conversations[0].messages[1].content
    assert len(answer) == MAX_CONTENT_CHARS and answer.endswith(TRUNCATED)
    assert export.account.names == ("Jane Doe",) and export.conversations[0].context["source"] == "claude"
