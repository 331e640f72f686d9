"""Several raters per conversation in native files (issue 16, item 5): `sense7 synth --raters-per-conversation`
writes one line per conversation plus assignments.csv, and `evaluate` / `analyze` read a text rated by
several people, through --assignments or through the one line every rater of it shares."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.readers.formats import FormatError, load_native, read_conversations
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

runner = CliRunner()


@pytest.fixture(scope="module")
def three_raters(tmp_path_factory):
    out = tmp_path_factory.mktemp("multi")
    result = runner.invoke(app, ["synth", "--out", str(out), "--conversations", "30", "--raters", "9",
                                 "--raters-per-conversation", "3", "--seed", "4"])
    assert result.exit_code == 0, result.output
    return out


def test_synth_writes_each_conversation_once_and_gives_it_to_its_other_raters(three_raters):
    conversations = read_conversations(three_raters / "conversations.jsonl", TAXONOMY)  # a duplicate id would raise
    assert len(conversations) == 30
    with open(three_raters / "assignments.csv", newline="") as fh:
        pairs = [(r["conversation_id"], r["rater_id"]) for r in csv.DictReader(fh)]
    assert len(pairs) == 60 and len(set(pairs)) == 60  # two more raters for each of the 30
    owners = {c.conversation_id: c.rater_id for c in conversations}
    assert all(owners[cid] != rid for cid, rid in pairs)
    with open(three_raters / "ratings.csv", newline="") as fh:
        rated = {(r["conversation_id"], r["rater_id"]) for r in csv.DictReader(fh)}
    assert rated == set(pairs) | set(owners.items())


@pytest.mark.parametrize("with_assignments", [True, False])
def test_a_text_rated_by_several_people_loads_whole(three_raters, with_assignments):
    data = load_native(three_raters / "conversations.jsonl", three_raters / "ratings.csv",
                       three_raters / "raters.csv",
                       assignments_path=three_raters / "assignments.csv" if with_assignments else None, taxonomy=TAXONOMY)
    per_conversation = data.ratings.groupby("conversation_id")["rater_id"].nunique()
    assert (per_conversation == 3).all() and len(per_conversation) == 30
    assert set(data.conversations) == set(zip(data.ratings["conversation_id"], data.ratings["rater_id"]))
    # Each rater's copy carries the text but not the owner's context (context is what that rater felt).
    for (cid, rid), conv in data.conversations.items():
        owner = next(c for (c2, _), c in data.conversations.items() if c2 == cid and c.context)
        assert conv.messages == owner.messages
        assert (conv.context == owner.context) == (rid == owner.rater_id)


def test_a_rating_of_a_conversation_that_is_not_in_the_file_is_still_an_error(three_raters, tmp_path):
    ratings = tmp_path / "ratings.csv"
    ratings.write_text("conversation_id,turn_index,rater_id,dimension,rating\nnope,1,r001,overall,3\n")
    with pytest.raises(FormatError, match="no conversation 'nope' in the conversations file"):
        load_native(three_raters / "conversations.jsonl", ratings, taxonomy=TAXONOMY)


def test_evaluate_and_analyze_take_the_multi_rater_files(three_raters, tmp_path):
    out = tmp_path / "eval.json"
    result = runner.invoke(app, ["evaluate", "--conversations", str(three_raters / "conversations.jsonl"),
                                 "--ratings", str(three_raters / "ratings.csv"), "--raters",
                                 str(three_raters / "raters.csv"), "--assignments",
                                 str(three_raters / "assignments.csv"), "--models", "majority,rater_mean",
                                 "--folds", "3", "--boot", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    evaluated = json.loads(out.read_text())
    assert evaluated["n_conversations"] == 30 and evaluated["n_raters"] <= 9
    analysed = tmp_path / "analyze.json"
    result = runner.invoke(app, ["analyze", "--ratings", str(three_raters / "ratings.csv"), "--boot", "20",
                                 "--json", str(analysed)])
    assert result.exit_code == 0, result.output
    agreement = json.loads(analysed.read_text())["agreement"]["controls"]
    assert all(block["alpha"] is not None and block["n_units"] > 0 for block in agreement.values())
    assert "Krippendorff" in result.output
    missing = runner.invoke(app, ["evaluate", "--ratings", str(three_raters / "ratings.csv"), "--assignments",
                                  str(three_raters / "assignments.csv")])
    assert missing.exit_code == 2
