"""The validating readers: every problem names file, line, field; nothing partial is returned."""

import json

import pandas as pd
import pytest

from sense7.readers.formats import (FormatError, raters_frame, read_assignments, read_conversations, read_raters,
                                    read_ratings)
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

GOOD = {"conversation_id": "c1", "rater_id": "r1", "context": {"task_type": "advice", "emotional_state": 2},
        "messages": [{"role": "user", "content": "My cat died."}, {"role": "assistant", "content": "I'm so sorry."},
                     {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "Tell me about her?"}]}


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def problems_of(path, **kw):
    with pytest.raises(FormatError) as info:
        read_conversations(path, TAXONOMY, **kw)
    return info.value.problems


def test_good_native_file_reads_turns_and_context(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, {**GOOD, "conversation_id": "c2", "context": {}}])
    convs = read_conversations(path, TAXONOMY)
    assert [c.conversation_id for c in convs] == ["c1", "c2"]
    assert convs[0].assistant_turns() == [1, 3]
    assert convs[0].context == {"task_type": "advice", "emotional_state": 2}


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda r: r.pop("conversation_id"), "conversation_id", "missing"),
    (lambda r: r.update(rater_id=""), "rater_id", "empty"),
    (lambda r: r["messages"][0].update(role="bot"), "messages[0].role", "unknown role"),
    (lambda r: r.update(messages=[]), "messages", "empty conversation"),
    (lambda r: r.update(messages=[{"role": "user", "content": "hi"}]), "messages", "no assistant"),
    (lambda r: r["messages"][1].update(content="x" * 60_000), "messages[1].content", "longer than"),
    (lambda r: r["context"].update(emotional_state=9), "context.emotional_state", "outside 1-5"),
    (lambda r: r["context"].update(mood="meh"), "context.mood", "unknown field"),
])
def test_each_kind_of_bad_line_is_named(tmp_path, mutate, field, reason):
    bad = json.loads(json.dumps(GOOD))
    bad["conversation_id"] = "c2"
    mutate(bad)
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, bad])
    problems = problems_of(path)
    assert any(p.line == 2 and p.field == field and reason in p.reason for p in problems), problems
    assert all(p.path == str(path) for p in problems)


def test_malformed_json_invalid_utf8_and_duplicates(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n{not json\n" + b'{"conversation_id": "\xff"}\n'
                     + json.dumps(GOOD).encode() + b"\n")
    problems = problems_of(path)
    by_line = {p.line: p for p in problems}
    assert by_line[2].field == "json" and "malformed JSON" in by_line[2].reason
    assert by_line[3].field == "encoding"
    assert by_line[4].field == "conversation_id" and "duplicate" in by_line[4].reason
    assert "c.jsonl:2: json: malformed JSON" in str(FormatError(problems))


def test_csv_one_message_per_row(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("conversation_id,rater_id,role,content,task_type\n"
                    'c1,r1,user,"Hello, I feel low",emotional_support\n'
                    "c1,r1,assistant,I'm sorry to hear that.,\n"
                    "c2,r2,user,Plan my week,\n"
                    "c2,r2,assistant,Sure.,\n")
    convs = read_conversations(path, TAXONOMY)
    assert [(c.conversation_id, c.rater_id, len(c.messages)) for c in convs] == [("c1", "r1", 2), ("c2", "r2", 2)]
    assert convs[0].messages[0].content == "Hello, I feel low"
    assert convs[0].context == {"task_type": "emotional_support"}


def test_csv_unknown_role_names_its_row(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("conversation_id,rater_id,role,content\nc1,r1,user,hi\nc1,r1,robot,beep\nc1,r1,assistant,ok\n")
    problems = problems_of(path)
    assert [(p.line, p.field) for p in problems] == [(3, "message.role")]


def test_openai_export_needs_a_rater_and_gets_stable_ids(tmp_path):
    path = write_jsonl(tmp_path / "oa.jsonl", [{"messages": [
        {"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]}]}])
    problems = problems_of(path)
    assert problems[0].field == "--rater"
    first = read_conversations(path, TAXONOMY, rater="r9")
    again = read_conversations(path, TAXONOMY, rater="r9")
    assert first[0].conversation_id == again[0].conversation_id and first[0].conversation_id.startswith("oa-")
    assert first[0].assistant_turns() == [2] and first[0].messages[2].content == "Hello!"


def test_assignments_fan_out_without_sharing_context(tmp_path):
    convs = read_conversations(write_jsonl(tmp_path / "c.jsonl", [GOOD]), TAXONOMY)
    assign = tmp_path / "a.csv"
    assign.write_text("conversation_id,rater_id\nc1,r2\nc1,r1\nc1,r2\n")
    out = read_assignments(assign, convs)
    assert [(c.rater_id, c.context) for c in out] == [("r1", GOOD["context"]), ("r2", {})]
    assign.write_text("conversation_id,rater_id\nnope,r2\n")
    with pytest.raises(FormatError, match=r"a.csv:2: conversation_id"):
        read_assignments(assign, convs)


def test_raters_csv_validates_ranges_choices_and_columns(tmp_path):
    path = tmp_path / "raters.csv"
    path.write_text("rater_id,email,age_band,tipi_1,llm_use\nr1,A@x.org,25-34,7,daily\nr2,,18-24,,never\n")
    rows = read_raters(path, TAXONOMY)
    assert rows[0] == {"rater_id": "r1", "email": "a@x.org",
                       "traits": {"age_band": "25-34", "tipi_1": 7, "llm_use": "daily"}}
    assert rows[1]["traits"] == {"age_band": "18-24", "llm_use": "never"}
    path.write_text("rater_id,tipi_1,llm_use\nr1,8,daily\nr2,3,hourly\nr1,2,daily\n")
    with pytest.raises(FormatError) as info:
        read_raters(path, TAXONOMY)
    got = {(p.line, p.field) for p in info.value.problems}
    assert got == {(2, "tipi_1"), (3, "llm_use"), (4, "rater_id")}
    path.write_text("rater_id,favourite_colour\nr1,blue\n")
    with pytest.raises(FormatError, match="unknown column"):
        read_raters(path, TAXONOMY)


def _ratings_fixture(tmp_path):
    convs = read_conversations(write_jsonl(tmp_path / "c.jsonl", [GOOD]), TAXONOMY)
    return convs, tmp_path / "ratings.csv"


def test_ratings_csv_reports_every_bad_line_with_file_line_field(tmp_path):
    convs, path = _ratings_fixture(tmp_path)
    path.write_text("conversation_id,turn_index,rater_id,dimension,rating\n"
                    "c1,1,r1,acknowledgement,4\n"
                    "c1,1,r1,understanding,9\n"      # line 3: rating off the 1-5 scale
                    "c1,3,r1,overall,2\n"
                    "c1,2,r1,overall,3\n"            # line 5: turn 2 is the user's
                    "c1,,r1,expectation_met,3\n")
    with pytest.raises(FormatError) as info:
        read_ratings(path, TAXONOMY, conversations=convs)
    got = [(p.line, p.field) for p in info.value.problems]
    assert got == [(3, "rating"), (5, "turn_index")]
    text = str(info.value)
    assert f"{path}:3: rating: expected an integer 1-5, got '9'" in text
    assert f"{path}:5: turn_index: 2 is not an assistant turn of conversation 'c1'" in text


def test_ratings_csv_reads_whole_conversation_ratings_and_rejects_duplicates(tmp_path):
    convs, path = _ratings_fixture(tmp_path)
    path.write_text("conversation_id,turn_index,rater_id,dimension,rating\nc1,1,r1,tone,4\nc1,,r1,overall,2\n")
    frame = read_ratings(path, TAXONOMY, conversations=convs)
    assert list(frame.columns) == ["conversation_id", "turn_index", "rater_id", "dimension", "rating"]
    assert frame["turn_index"].isna().tolist() == [False, True] and frame["rating"].tolist() == [4, 2]
    path.write_text("conversation_id,turn_index,rater_id,dimension,rating\nc1,1,r1,tone,4\nc1,1,r1,tone,5\n")
    with pytest.raises(FormatError, match=r"ratings.csv:3: dimension: duplicate rating .*first on line 2"):
        read_ratings(path, TAXONOMY, conversations=convs)


def test_ratings_csv_unknown_dimension_is_one_line_naming_file_line_field_and_the_taxonomy_option(tmp_path):
    convs, path = _ratings_fixture(tmp_path)
    path.write_text("conversation_id,turn_index,rater_id,dimension,rating\n"
                    "c1,1,r1,acknowledgement,4\n" + "".join(f"c1,{t},r1,empathy,{t}\n" for t in (1, 3)))
    with pytest.raises(FormatError) as info:
        read_ratings(path, TAXONOMY, conversations=convs)
    message = str(info.value)
    assert "\n" not in message  # the same unknown value on many lines is one problem
    assert message.startswith(f"{path}:3: dimension: 'empathy' is not a control of the taxonomy")
    assert "(acknowledgement, understanding," in message and "1 more line" in message
    assert "pass the study's taxonomy with --taxonomy FILE or SENSE7_TAXONOMY" in message


def test_raters_csv_extra_columns_are_kept_only_when_asked(tmp_path):
    path = tmp_path / "raters.csv"
    path.write_text("rater_id,email,tipi_1,iri_fantasy,note\nr1,a@x.org,7,3.5,hi\nr2,,,2,\n")
    frame = raters_frame(read_raters(path, TAXONOMY, extra_columns=True), TAXONOMY)
    assert list(frame.columns) == ["email", "tipi_1", "iri_fantasy", "note"]
    assert frame.loc["r1", "iri_fantasy"] == 3.5 and frame.loc["r2", "iri_fantasy"] == 2.0  # numeric
    assert frame.loc["r1", "note"] == "hi" and pd.isna(frame.loc["r2", "note"]) and pd.isna(frame.loc["r2", "tipi_1"])
