"""`sense7.research.live_replay`: new raters' answers replayed in order through the live posterior.

Planted data: every rater has a strong leniency offset and no traits, so a new rater's static prediction is
the population's; their own first answers reveal the offset, and only a posterior that reads them beats it."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.data.items import build_items
from sense7.model.estimators import PersonalizedRater
from sense7.research.evaluation import evaluate_items
from sense7.research.live_replay import answer_order, listing_rank, live_replay, replay_plan
from sense7.research.report import render_report
from sense7.synthetic.synth import generate, write
from sense7.taxonomy import load_taxonomy

from tests.support.research import planted_items

KS = (0, 2, 5, 10)
TAXONOMY = load_taxonomy()  # the packaged taxonomy: the synthetic files are made for it
runner = CliRunner()


@pytest.fixture(scope="module")
def planted():
    # 12 raters x 24 answers: leniency sd 1.0 on 1-5, little noise; 10 replayed + 14 predicted per rater.
    return planted_items(n_raters=12, n_conversations=6, n_turns=4, rater_sd=1.0, noise_sd=0.4, seed=3)


@pytest.fixture(scope="module")
def replay(planted):
    X, Y = planted
    return live_replay(X, Y, PersonalizedRater(), n_folds=3, seed=0, n_boot=200, ks=KS, min_targets=5,
                       return_predictions=True)


def test_live_beats_static_and_generic_once_the_rater_has_answered(replay):
    curve = {point["k"]: point for point in replay["curve"]}
    assert replay["n_eligible"] == replay["n_full_stream"] == 12
    assert all(point["n_raters"] == 12 for point in curve.values())
    # No answer yet: live is exactly the static prediction.
    assert curve[0]["mae"]["live"]["value"] == curve[0]["mae"]["static"]["value"]
    for k in (5, 10):
        mae = curve[k]["mae"]
        assert mae["live"]["value"] < 0.75 * mae["static"]["value"]
        assert curve[k]["live_minus"]["static"]["mae"]["ci"][1] < 0  # the paired interval excludes 0
        assert mae["live"]["value"] < mae["generic"]["value"]
        assert curve[k]["spearman"]["live"]["value"] > curve[k]["spearman"]["static"]["value"] + 0.2
    # More answers, a better posterior (on the same targets).
    assert curve[10]["mae"]["live"]["value"] <= curve[2]["mae"]["live"]["value"]


def test_the_stream_never_holds_a_target(planted):
    X, Y = planted
    plan = replay_plan(X, Y, stream_length=10, min_targets=5)
    order = list(answer_order(X))
    for rater, (stream, targets) in plan.items():
        assert not set(stream) & set(targets)
        assert (X["rater_id"].iloc[np.r_[stream, targets]] == rater).all()
        # The stream is the rater's first answers in the replay order; every target comes later.
        assert max(order.index(i) for i in stream) < min(order.index(i) for i in targets)


def test_no_prediction_of_a_rater_reads_their_targets(planted, replay):
    """Mirror one rater's held-out answers: none of that rater's predictions, at any k, may move (a stream
    that reached into the targets, or a fit that saw the test rater, would move them). In the same run,
    mirror the stream of another rater of the same test fold (so that neither is in the other's training):
    their live prediction after the stream must move (the answers are read)."""
    X, Y = planted
    before = replay["predictions"]
    fold_of = before.groupby("rater_id")["fold"].first()
    rater = "r0"
    other = next(r for r in fold_of.index if r != rater and fold_of[r] == fold_of[rater])
    plan = replay_plan(X, Y, 10, 5)
    changed = Y.copy()
    changed.iloc[plan[rater][1], 0] = 6 - changed.iloc[plan[rater][1], 0]  # mirrored on the 1-5 scale
    changed.iloc[plan[other][0], 0] = 6 - changed.iloc[plan[other][0], 0]
    again = live_replay(X, changed, PersonalizedRater(), n_folds=3, seed=0, n_boot=20, ks=KS, min_targets=5,
                        return_predictions=True)["predictions"]
    mine = before[before["rater_id"] == rater].reset_index(drop=True)
    theirs = again[again["rater_id"] == rater].reset_index(drop=True)
    assert len(mine) and mine[["k", "item", "model"]].equals(theirs[["k", "item", "model"]])
    np.testing.assert_allclose(theirs["score"], mine["score"])

    def live_after_stream(frame):
        return frame[(frame["rater_id"] == other) & (frame["model"] == "live") & (frame["k"] == 10)]["score"]

    moved = np.abs(live_after_stream(again).to_numpy() - live_after_stream(before).to_numpy())
    assert moved.max() > 0.3


def test_evaluate_items_reports_the_replay_as_strict_json_and_in_the_report(planted):
    X, Y = planted
    result = evaluate_items(X, Y, {"personalized": PersonalizedRater()}, splits=("live_replay",), n_folds=2,
                            n_boot=20, replay_ks=(0, 1, 5), replay_min_targets=5)
    assert result["splits"] == {}
    block = json.loads(json.dumps(result["live_replay"], allow_nan=False))
    assert [point["k"] for point in block["curve"]] == [0, 1, 5] and block["after"]["k"] == 5
    assert block["stream_length"] == 5 and block["cluster"] == "rater_id"
    assert set(block["curve"][0]["mae"]) == {"live", "static", "generic", "running_mean", "running_median",
                                             "global_mean", "majority"}
    html = render_report(result)
    assert "Live replay" in html and 'alt="Live replay curve" src="data:image/png;base64,' in html


def test_too_few_answers_is_a_clear_error(planted):
    X, Y = planted
    with pytest.raises(ValueError, match="at least 2 are needed"):
        live_replay(X, Y, PersonalizedRater(), n_folds=3, ks=(0, 30), min_targets=5)
    with pytest.raises(ValueError, match="include it in the models"):
        evaluate_items(X, Y, {}, splits=("live_replay",))


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    write(generate(24, 4, seed=3, taxonomy=TAXONOMY), out)
    return out


@pytest.mark.slow  # the whole command: reads files, fits, writes JSON (about 10 s)
def test_evaluate_command_prints_and_saves_the_replay_in_the_data_order(synth_files, tmp_path):
    files = ["--conversations", str(synth_files / "conversations.jsonl"), "--ratings", str(synth_files / "ratings.csv"),
             "--raters", str(synth_files / "raters.csv")]
    json_path = tmp_path / "eval.json"
    result = runner.invoke(app, ["evaluate", *files, "--splits", "live_replay", "--models", "personalized",
                                 "--folds", "2", "--boot", "20", "--replay-ks", "0,2,5", "--replay-min-targets", "3",
                                 "--json", str(json_path)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "live_replay" in result.output and "live minus each" in result.output and "run. median" in result.output
    saved = json.loads(json_path.read_text())
    assert saved["splits"] == {} and [p["k"] for p in saved["live_replay"]["curve"]] == [0, 2, 5]
    assert saved["live_replay"]["order"].startswith("the order the data set lists")
    for bad, words in ((["--replay-ks", "two"], "--replay-ks"), (["--models", "generic"], "add personalized")):
        result = runner.invoke(app, ["evaluate", *files, "--splits", "live_replay", *bad])
        assert result.exit_code == 2 and words in result.output


def test_listing_rank_follows_the_ratings_file():
    data = generate(6, 2, seed=1, taxonomy=TAXONOMY).rating_data()
    X, _ = build_items(data, TAXONOMY)
    reversed_ratings = data.ratings.iloc[::-1].reset_index(drop=True)
    forward, backward = listing_rank(X, data.ratings), listing_rank(X, reversed_ratings)
    assert np.isfinite(forward).all()
    # Listed backwards, the items come in the opposite order.
    assert list(answer_order(X, forward)) == list(answer_order(X, -backward))
