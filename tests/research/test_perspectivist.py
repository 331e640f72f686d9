"""Perspectivist metrics in `evaluate` (per-rater distance, Wasserstein on multi-rater turns, per-rater
personalization gain): known values on planted data, the JSON contract, the report."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from sklearn.base import BaseEstimator

from sense7.model.baselines import MajorityClass, RaterMean
from sense7.model.catalog import CATALOG
from sense7.research.evaluation import evaluate, evaluate_items
from sense7.research.perspectivist import (
    RaterTurns,
    normalized_distance,
    repeated_gain,
    wasserstein_ordinal,
    within_group_spearman,
)
from sense7.research.report import render_report
from sense7.synthetic.synth import generate

from tests.support.research import planted_items
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def _keys(X: pd.DataFrame) -> list[str]:
    return (X["conversation_id"].astype(str) + "|" + X["turn_index"].astype(str) + "|"
            + X["rater_id"].astype(str)).tolist()


class _Oracle(BaseEstimator):
    """A perfect model: it was handed every rating and predicts it with probability 1."""

    def __init__(self, truth=None, levels=(1, 2, 3, 4, 5)):
        self.truth = truth
        self.levels = levels

    def fit(self, X, Y):
        self.levels_ = np.asarray(self.levels, float)
        return self

    def predict_proba(self, X):
        rows = self.truth.reindex(_keys(X))
        return {c: (rows[c].to_numpy(float)[:, None] == self.levels_[None, :]).astype(float) for c in rows}

    def predict(self, X):
        return pd.DataFrame({c: self.levels_[p.argmax(axis=1)] for c, p in self.predict_proba(X).items()})


# -- the metrics on arrays ---------------------------------------------------------------------------

def test_normalized_distance_by_hand():
    assert normalized_distance([1, 3, 5], [5, 4, 5], 5).tolist() == [1.0, 0.25, 0.0]
    assert normalized_distance([2], [2], 7).tolist() == [0.0]


def test_wasserstein_of_hand_computed_examples():
    # All mass at opposite ends: the whole scale apart.
    assert wasserstein_ordinal([1, 0, 0], [0, 0, 1]) == pytest.approx(1.0)
    # CDFs (.5, 1, 1) and (0, .5, 1): |.5| + |.5| + 0 = 1, over K - 1 = 2.
    assert wasserstein_ordinal([0.5, 0.5, 0], [0, 0.5, 0.5]) == pytest.approx(0.5)
    # Moving a quarter of the mass one level on a 5-level scale: 0.25 / 4.
    assert wasserstein_ordinal([0, 1, 0, 0, 0], [0, 0.75, 0.25, 0, 0]) == pytest.approx(0.0625)
    # Rows are separate pairs; identical distributions are 0 apart.
    p = np.array([[0.2, 0.3, 0.5], [1, 0, 0]])
    assert wasserstein_ordinal(p, p).tolist() == [0.0, 0.0]


def test_within_group_spearman_equals_scipy_per_group():
    rng = np.random.default_rng(1)
    groups = np.repeat(["a", "b", "c", "d"], 12)
    y = rng.integers(1, 6, len(groups)).astype(float)
    s = y + rng.normal(0, 1.5, len(groups))
    s[groups == "d"] = 3.0  # a constant prediction ranks nothing
    rho = within_group_spearman(groups, y, s)
    for g in "abc":
        rows = groups == g
        assert rho[g] == pytest.approx(spearmanr(y[rows], s[rows]).statistic)
    assert np.isnan(rho["d"])


def test_spearman_gain_is_within_fold_so_a_per_fold_rater_offset_changes_nothing():
    from sense7.research.perspectivist import _spearman_gain

    rng = np.random.default_rng(3)
    n = 240
    raters, folds = rng.integers(0, 6, n), rng.integers(0, 3, n)
    Y = pd.DataFrame({"a": rng.integers(1, 6, n).astype(float)})
    generic = pd.DataFrame({"a": Y["a"] + rng.normal(0, 1, n)})
    # A leniency learned per fold (from the rater's other ratings) shifts a fold's scores, not their order.
    personalized = generic + rng.normal(0, 2, (6, 3))[raters, folds][:, None]
    gain = _spearman_gain(Y, personalized, generic, raters, folds, 6)
    assert gain == pytest.approx(np.zeros(6))
    pooled = within_group_spearman(raters, Y["a"], personalized["a"]) - within_group_spearman(raters, Y["a"],
                                                                                               generic["a"])
    assert np.abs(pooled).max() > 0.01  # pooled over folds, the shifts would count


def test_turn_wasserstein_by_hand_with_whole_conversation_and_assistant_keys():
    # Turn 1 of c1: three raters rate 1, 2, 2; turn NA (whole conversation) of c1: two raters rate 3, 3;
    # c2 is rated by one rater only; c3's two ratings are of two different assistants (as in WASSA).
    X = pd.DataFrame({
        "conversation_id": ["c1", "c1", "c1", "c1", "c1", "c2", "c3", "c3"],
        "turn_index": pd.array([1, 1, 1, pd.NA, pd.NA, 1, pd.NA, pd.NA], dtype="Int64"),
        "rater_id": ["r1", "r2", "r3", "r1", "r2", "r1", "r1", "r2"],
        "assistant_id": [None, None, None, None, None, None, "r2", "r1"],
    })
    Y = pd.DataFrame({"overall": [1, 2, 2, 3, 3, 1, 2, 3]}, dtype=float)
    proba = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1], [0, 0.5, 0.5], [1, 0, 0], [1, 0, 0], [1, 0, 0]])
    turns = RaterTurns(X, Y)
    assert turns.n_turns() == {"overall": 2}
    distances = turns.wasserstein(Y, {"overall": proba}, np.arange(1, 4))["overall"]
    # Turn 1: predicted (1/3, 1/3, 1/3) vs observed (1/3, 2/3, 0): CDF gap 1/3 at level 2 -> (1/3) / 2.
    # Whole conversation: predicted (0, 1/4, 3/4) vs observed (0, 0, 1): gap 1/4 at level 2 -> (1/4) / 2.
    assert sorted(distances) == pytest.approx([1 / 8, 1 / 6])


# -- in evaluate ---------------------------------------------------------------------------------------

def test_a_perfect_model_has_zero_distance_and_zero_wasserstein():
    X, Y = planted_items(n_raters=8, n_conversations=6, n_turns=3, shared_conversations=True)
    truth = pd.DataFrame(Y.to_numpy(), index=_keys(X), columns=Y.columns)
    result = evaluate_items(X, Y, {"oracle": _Oracle(truth), "majority": MajorityClass()}, n_folds=3, n_boot=50)
    for split in result["splits"].values():
        block = split["perspectivist"]
        assert block["multi_rater_turns"]["overall"] == 6 * 3  # every turn has all 8 raters
        oracle = block["models"]["oracle"]
        assert oracle["rater_mean_distance"]["mean"] == 0 and oracle["rater_mean_distance"]["ci"] == [0, 0]
        assert oracle["wasserstein_01"]["mean"] == pytest.approx(0) and oracle["wasserstein_01"]["ci"][1] == pytest.approx(0)
        majority = block["models"]["majority"]
        assert majority["rater_mean_distance"]["mean"] > 0.05 and majority["wasserstein_01"]["mean"] > 0.05
        assert block["personalization_gain"] is None  # no generic and personalized pair here
    json.dumps(result, allow_nan=False)


def test_no_multi_rater_turn_gives_no_wasserstein():
    X, Y = planted_items(n_raters=10, n_conversations=4, n_turns=2)  # one rater per conversation
    result = evaluate_items(X, Y, {"rater_mean": RaterMean()}, splits=("known_rater",), n_folds=3, n_boot=20)
    block = result["splits"]["known_rater"]["perspectivist"]
    assert block["multi_rater_turns"] == {"overall": 0}
    assert block["models"]["rater_mean"]["wasserstein_01"] is None
    assert block["models"]["rater_mean"]["rater_mean_distance"]["n_raters"] == 10


def test_repeated_gain_pools_each_raters_folds_over_the_assignments_by_hand():
    # Two assignments, two raters: (rating-weighted sum of per-fold gains, weight) per rater.
    first = (np.array([1.0, 0.2]), np.array([2.0, 1.0]))   # alone: +0.5 and +0.2 -> mean +0.35
    second = (np.array([0.0, 0.6]), np.array([1.0, 2.0]))  # alone: 0.0 and +0.3 -> mean +0.15
    out = repeated_gain([first, second], seeds=[4, 5], n_boot=50, seed=0)
    # Pooled per rater: 1.0 / 3 and 0.8 / 3, not the mean of the two assignments' means (0.25).
    assert out["mean"] == pytest.approx((1.0 / 3 + 0.8 / 3) / 2)
    assert out["values"] == pytest.approx([0.8 / 3, 1.0 / 3])
    assert out["per_assignment"] == pytest.approx([0.35, 0.15])
    assert (out["repeats"], out["seeds"], out["n_raters"], out["share_gain"]) == (2, [4, 5], 2, 1.0)
    # A rater with no defined gain in any assignment is left out, not counted as 0.
    none = (np.array([0.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0]))
    assert repeated_gain([none], seeds=[0], n_boot=10, seed=0) is None


@pytest.mark.slow
def test_repeats_add_the_same_models_on_further_fold_assignments():
    data = generate(24, 12, seed=5, raters_per_conversation=3, taxonomy=TAXONOMY).rating_data()
    models = CATALOG.make(["generic", "personalized"])

    def run(seed, repeats=1):
        return evaluate(data, splits=("known_rater",), n_folds=3, seed=seed, n_boot=50, models=models,
                        repeats=repeats, taxonomy=TAXONOMY)["splits"]["known_rater"]["perspectivist"]

    both = run(0, repeats=2)
    alone = [run(0)["personalization_gain"]["spearman"], run(1)["personalization_gain"]["spearman"]]
    repeated = both["personalization_gain_repeated"]
    # Each assignment alone is what a single run with its seed gives; the first one's block is unchanged.
    assert repeated["per_assignment"] == pytest.approx([g["mean"] for g in alone])
    assert both["personalization_gain"]["spearman"] == alone[0]
    assert repeated["seeds"] == [0, 1] and repeated["n_raters"] >= max(g["n_raters"] for g in alone)
    # Each model's overall Spearman per assignment: what a single run with that seed reports.
    for name in ("generic", "personalized"):
        single = [evaluate(data, splits=("known_rater",), n_folds=3, seed=s, n_boot=50, models=models,
                           taxonomy=TAXONOMY)["splits"]["known_rater"]["models"][name]["overall"]["spearman"]
                  for s in (0, 1)]
        assert repeated["model_spearman"][name]["per_assignment"] == pytest.approx(single)
        assert repeated["model_spearman"][name]["mean"] == pytest.approx(np.mean(single))
    assert alone[0]["mean"] != alone[1]["mean"]  # the assignments differ, so pooling them means something
    assert "personalization_gain_repeated" not in run(0)
    with pytest.raises(ValueError, match="repeats"):
        run(0, repeats=0)


def test_parallel_folds_give_the_same_perspectivist_block():
    X, Y = planted_items(n_raters=10, n_conversations=5, shared_conversations=True)
    models = {"rater_mean": RaterMean(), "majority": MajorityClass()}
    serial = evaluate_items(X, Y, models, n_folds=3, n_boot=20)
    parallel = evaluate_items(X, Y, models, n_folds=3, n_boot=20, n_jobs=2)
    for split in serial["splits"]:
        assert serial["splits"][split]["perspectivist"] == parallel["splits"][split]["perspectivist"]


@pytest.fixture(scope="module")
def synth_result():
    # Planted rater leniency, three raters per conversation (crossed design).
    data = generate(24, 12, seed=5, raters_per_conversation=3, taxonomy=TAXONOMY).rating_data()
    return evaluate(data, splits=("known_rater",), n_folds=3, n_boot=200, dataset="synth",
                    models=CATALOG.make(["generic", "personalized"]), taxonomy=TAXONOMY)


def test_planted_leniency_makes_personalization_gain_per_rater(synth_result):
    block = synth_result["splits"]["known_rater"]["perspectivist"]
    gain = block["personalization_gain"]["distance"]
    assert gain["mean"] > 0 and gain["ci"][0] > 0
    assert gain["n_raters"] == 12 and 0.5 < gain["share_gain"] <= 1 and gain["share_gain"] + gain["share_loss"] <= 1
    assert len(gain["values"]) == 12 and gain["quantiles"]["p10"] <= gain["quantiles"]["p90"]
    assert block["personalization_gain"]["spearman"]["n_raters"] > 0
    assert min(block["multi_rater_turns"].values()) > 0
    for name in ("generic", "personalized"):
        w = block["models"][name]["wasserstein_01"]
        assert w is not None and 0 <= w["ci"][0] <= w["mean"] <= w["ci"][1] <= 1
        assert set(w["per_control"]) == set(synth_result["controls"])
        d = block["models"][name]["rater_mean_distance"]
        assert d["ci"][0] <= d["mean"] <= d["ci"][1]
    assert (block["models"]["personalized"]["rater_mean_distance"]["mean"]
            < block["models"]["generic"]["rater_mean_distance"]["mean"])


def test_result_is_strict_json_and_the_report_draws_it(synth_result):
    text = json.dumps(synth_result, allow_nan=False)
    assert json.loads(text)["splits"]["known_rater"]["perspectivist"]["turn_key"] == [
        "conversation_id", "turn_index", "assistant_id"]
    html = render_report(synth_result)
    assert "Per rater and per turn" in html and "Personalization gain per rater" in html
    assert 'alt="Personalization gain per rater, known_rater"' in html
