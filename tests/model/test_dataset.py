"""The dataset layer: validation errors that name file, line and column; trait features; one item path
for training (build_items), serving (items_from_tasks) and the jury (transcript_columns)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sense7.data.dataset import TIPI_SCALES, trait_features
from sense7.data.items import build_items, items_from_tasks, task_columns, transcript_columns
from sense7.labelstudio.protocol import rating_tasks
from sense7.readers.formats import FormatError, load_native
from sense7.synthetic.synth import generate, write
from sense7.synthetic.toy_study import make_raters
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


@pytest.fixture()
def files(tmp_path):
    return write(generate(6, 3, seed=4, taxonomy=TAXONOMY), tmp_path)


def _rewrite(path, line_no, new_line):
    lines = path.read_text().splitlines()
    lines[line_no - 1] = new_line
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("bad_line, column, reason", [
    ("c0001,1,r001,acknowledgement,6", "rating", "1-5"),
    ("c0001,1,r001,acknowledgement,x", "rating", "1-5"),
    ("c0001,1,r001,expectation_met,4", "rating", "1-3"),
    ("c0001,1,r001,warmth,3", "dimension", "'warmth' is not a control of the taxonomy"),
    ("c0001,-1,r001,acknowledgement,3", "turn_index", "non-negative integer"),
    ("c0001,0,r001,acknowledgement,3", "turn_index", "not an assistant turn"),
    ("c9999,1,r001,acknowledgement,3", "conversation_id", "no conversation 'c9999'"),
    (",1,r001,acknowledgement,3", "conversation_id", "empty"),
])
def test_bad_ratings_name_file_line_and_column(files, bad_line, column, reason):
    _rewrite(files["ratings.csv"], 3, bad_line)
    with pytest.raises(FormatError) as err:
        load_native(files["conversations.jsonl"], files["ratings.csv"], files["raters.csv"], taxonomy=TAXONOMY)
    message = str(err.value)
    assert f"{files['ratings.csv']}:3: {column}:" in message
    assert reason in message


def test_duplicate_rating_is_rejected(files):
    lines = files["ratings.csv"].read_text().splitlines()
    files["ratings.csv"].write_text("\n".join(lines + [lines[1]]) + "\n")
    with pytest.raises(FormatError, match="duplicate rating"):
        load_native(files["conversations.jsonl"], files["ratings.csv"], taxonomy=TAXONOMY)


def test_missing_column_and_bad_rater_fields(files):
    files["ratings.csv"].write_text("conversation_id,turn_index,rater_id,rating\n")
    with pytest.raises(FormatError, match=r"ratings.csv:1: header: missing column\(s\): dimension"):
        load_native(files["conversations.jsonl"], files["ratings.csv"], taxonomy=TAXONOMY)
    lines = files["raters.csv"].read_text().splitlines()
    header = lines[0].split(",")
    row = lines[2].split(",")
    row[header.index("tipi_3")] = "9"
    _rewrite(files["raters.csv"], 3, ",".join(row))
    with pytest.raises(FormatError) as err:
        load_native(files["conversations.jsonl"], files["ratings.csv"], files["raters.csv"], taxonomy=TAXONOMY)
    assert f"{files['raters.csv']}:3: tipi_3: 9 is outside 1-7" in str(err.value)


def test_trait_features_score_tipi_with_reverse_keyed_items():
    tax = load_taxonomy()
    raw = {f"tipi_{i}": 4 for i in range(1, 11)}
    raw.update(tipi_1=7, tipi_6=1, tipi_7=2, tipi_2=7, llm_use="daily", age_band="25-34", gender="woman",
               job_role="research", ai_trust=5)
    raters = pd.DataFrame([raw, {"llm_use": np.nan, "iri_fantasy": 3.5}], index=pd.Index(["a", "b"], name="rater_id"))
    feats = trait_features(raters, tax)
    assert feats.loc["a", "big5_extraversion"] == 7.0  # (7 + (8 - 1)) / 2
    assert feats.loc["a", "big5_agreeableness"] == 1.5  # (2 + (8 - 7)) / 2
    assert feats.loc["a", "llm_use"] == 3.0 and feats.loc["a", "age_band"] == 1.0
    assert feats.loc["a", "gender_woman"] == 1.0 and feats.loc["a", "gender_man"] == 0.0
    assert np.isnan(feats.loc["b", "gender_woman"])  # unknown, not "not a woman"
    assert np.isnan(feats.loc["b", "llm_use"]) and feats.loc["b", "iri_fantasy"] == 3.5  # numeric passes through
    assert feats.loc["a", "ai_trust"] == 5.0
    assert "email" not in feats.columns


def test_trait_features_of_one_rater_alone_equal_their_row_of_the_whole_frame():
    """The rater page makes one rater's trait row at a time (a live pre-fill); training makes every rater's at
    once: the two agree, column for column, whatever the frame's cells hold (text, numbers as text, missing,
    an unknown choice, a text column among numbers), and so do the column names and their order."""
    tax = load_taxonomy()
    raters = pd.DataFrame([r["traits"] for r in make_raters(12, tax, prefix="t")],
                          index=pd.Index([f"t{i}" for i in range(1, 13)], name="rater_id")).astype(object)
    raters.iloc[1, 0], raters.iloc[2, 1], raters.iloc[3, 2] = None, "5", np.nan
    raters.loc["t5", "gender"] = "not a listed choice"
    raters["iri_fantasy"], raters["email"] = [float(i) / 2 for i in range(12)], "x@raters.test"
    whole = trait_features(raters, tax)
    assert list(whole.columns)[:5] == [f"big5_{name}" for name in TIPI_SCALES] and "email" not in whole.columns
    assert (whole.dtypes == float).all()
    for rater in raters.index:
        alone = trait_features(raters.loc[[rater]], tax)
        pd.testing.assert_frame_equal(alone, whole.loc[[rater]], check_exact=True)
    assert whole.loc["t5", "gender_woman"] == 0.0  # answered, with none of the choices: known, not missing
    assert trait_features(raters[["email"]], tax).shape == (12, 0)


def test_build_items_and_items_from_tasks_agree():
    tax = load_taxonomy()
    synth = generate(8, 3, seed=6, whole_conversation_share=0.0, taxonomy=TAXONOMY)
    data = synth.rating_data()
    X, Y = build_items(data, TAXONOMY)
    assert list(Y.columns) == tax.controls
    tasks = [t["data"] for conv in synth.conversations for t in rating_tasks(conv)]
    contexts = {(c.conversation_id, c.rater_id): c.context for c in synth.conversations}
    served = items_from_tasks(tasks, data.raters, contexts, TAXONOMY)
    key = ["conversation_id", "turn_index", "rater_id"]
    left = X.sort_values(key).reset_index(drop=True)
    right = served.sort_values(key).reset_index(drop=True)[list(X.columns)]
    pd.testing.assert_frame_equal(left, right, check_dtype=False)
    first = left[left["turn_position"] == 1].iloc[0]
    assert first["history_text"].startswith("user: ")  # the start placeholder is not part of the history
    assert any(c.startswith("trait_big5_") for c in X.columns) and "ctx_empathy_wanted" in X.columns


def test_transcript_columns_equal_the_task_columns_of_the_same_turns():
    """The jury reads transcripts directly; the ML backend reads the task data the import made of them: both
    give the model the same items (assistant ids from the context included)."""
    synth = generate(6, 3, seed=5, taxonomy=TAXONOMY)
    convs = synth.conversations
    convs[0].context["assistant_id"] = "assistant-b"
    convs[1].context.clear()  # no context at all: ctx columns None
    tasks = [t["data"] for conv in convs for t in rating_tasks(conv)]
    contexts = {(c.conversation_id, c.rater_id): c.context for c in convs}
    direct = transcript_columns(convs, TAXONOMY)
    assert direct == task_columns(tasks, contexts, TAXONOMY)
    assert len(direct["text"]) == sum(len(c.assistant_turns()) for c in convs)
    assert direct["assistant_id"][0] == "assistant-b" and "ctx_empathy_wanted" in direct


def test_whole_conversation_items_join_all_assistant_turns():
    synth = generate(30, 3, seed=8, whole_conversation_share=1.0, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    whole = X[X["turn_index"].isna()]
    assert len(whole) == 30
    row = whole.iloc[0]
    conv = next(c for c in synth.conversations if c.conversation_id == row["conversation_id"])
    assert row["text"] == "\n".join(conv.messages[i].content for i in conv.assistant_turns())
    assert Y.loc[whole.index, "overall"].notna().all()
    assert Y.loc[whole.index, "acknowledgement"].isna().all()
