"""`evaluate` on synthetic SENSE-7-shaped data: the JSON contract and the planted ordering of models."""

import json

import numpy as np
import pandas as pd
import pytest

from sense7.data.dataset import RatingData
from sense7.model.baselines import GlobalMean, MajorityClass, RaterMean
from sense7.research.evaluation import MODEL_ORDER, evaluate, evaluate_items
from sense7.synthetic.synth import generate

from tests.support.research import planted_items
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

METRIC_KEYS = {"spearman", "accuracy", "qwk", "mae", "mae_mode", "accuracy_median", "spearman_ci"}


@pytest.fixture(scope="module")
def synth_result():
    data = generate(48, 12, seed=2, taxonomy=TAXONOMY).rating_data()
    return evaluate(data, n_folds=3, seed=0, n_boot=200, dataset="synth", taxonomy=TAXONOMY)


@pytest.mark.slow
def test_json_shape_is_the_documented_contract(synth_result):
    r = synth_result
    assert r["dataset"] == "synth"
    assert r["n_raters"] == 12 and r["n_ratings"] > 0
    assert set(r["splits"]) == {"known_rater", "cold_start"}
    controls = ["acknowledgement", "understanding", "validation", "curiosity", "continuity", "tone", "support",
                "overall"]
    assert r["controls"] == controls and r["levels"] == [1, 2, 3, 4, 5]
    for split in r["splits"].values():
        assert list(split["models"]) == list(MODEL_ORDER)
        for model in split["models"].values():
            assert set(model["overall"]) == METRIC_KEYS
            assert list(model["per_control"]) == controls
            assert all(set(block) == METRIC_KEYS for block in model["per_control"].values())
        paired = split["paired"]["personalized_minus_generic"]
        assert set(paired) >= {"spearman", "ci"} and len(paired["ci"]) == 2
    json.dumps(r, allow_nan=False)  # strict JSON: undefined metrics are null, never NaN


@pytest.mark.slow
def test_planted_structure_orders_the_models_on_known_raters(synth_result):
    models = synth_result["splits"]["known_rater"]["models"]
    personalized, generic, majority = (models[m]["overall"] for m in ("personalized", "generic", "majority"))
    assert personalized["spearman"] > generic["spearman"]
    assert personalized["qwk"] > generic["qwk"] > majority["qwk"]
    assert generic["spearman"] > 0.3
    assert majority["spearman"] is None  # a constant prediction ranks nothing


@pytest.mark.slow
def test_bootstrap_intervals_contain_the_point_values(synth_result):
    for split in synth_result["splits"].values():
        for model in split["models"].values():
            for block in [model["overall"], *model["per_control"].values()]:
                lo, hi = block["spearman_ci"]
                if block["spearman"] is not None:
                    assert lo <= block["spearman"] <= hi
        paired = split["paired"]["personalized_minus_generic"]
        assert paired["ci"][0] <= paired["spearman"] <= paired["ci"][1]


@pytest.mark.slow
def test_rater_counts_feed_the_gain_curve(synth_result):
    known = synth_result["splits"]["known_rater"]
    cold = synth_result["splits"]["cold_start"]
    assert len(known["rater_train_ratings"]) == 12 and min(known["rater_train_ratings"]) > 0
    assert max(cold["rater_train_ratings"]) == 0  # cold start: no rater has training ratings
    assert [b["bin"] for b in cold["by_train_ratings"]] == ["0"]
    assert sum(b["n_items"] for b in known["by_train_ratings"]) == synth_result["n_items"]
    assert all(b["gain_spearman"] is not None for b in known["by_train_ratings"])


def test_rater_mean_beats_global_mean_on_known_raters_but_not_cold_start():
    X, Y = planted_items(n_raters=30, rater_sd=1.0, noise_sd=0.5)
    models = {"majority": MajorityClass(), "global_mean": GlobalMean(), "rater_mean": RaterMean()}
    r = evaluate_items(X, Y, models, n_folds=5, n_boot=100)
    known, cold = r["splits"]["known_rater"]["models"], r["splits"]["cold_start"]["models"]
    assert known["rater_mean"]["overall"]["spearman"] > 0.5
    assert known["rater_mean"]["overall"]["mae"] < known["global_mean"]["overall"]["mae"]
    # Without a rater's own ratings, the rater mean is the global mean: no signal at all.
    assert cold["rater_mean"]["overall"]["spearman"] is None
    assert cold["rater_mean"]["overall"]["mae"] == pytest.approx(cold["global_mean"]["overall"]["mae"])


def test_scale_and_controls_come_from_the_data():
    # A WASSA-like data set: one conversation-level control on 1-7.
    X, Y = planted_items(n_raters=20, n_turns=1, levels=(1, 7), controls=("perceived_empathy",), seed=4)
    r = evaluate_items(X, Y, {"majority": MajorityClass(), "rater_mean": RaterMean()}, n_boot=50)
    assert r["levels"] == list(range(int(Y.min().min()), int(Y.max().max()) + 1))
    assert r["levels"][-1] == 7 and r["controls"] == ["perceived_empathy"]
    confusion = r["splits"]["known_rater"]["confusion"]["rater_mean"]["perceived_empathy"]
    assert np.asarray(confusion).shape == (len(r["levels"]),) * 2
    assert np.asarray(confusion).sum() == len(X)


def test_evaluate_reads_rating_data_with_whole_conversation_ratings():
    from sense7.data.conversations import Conversation, Message

    conversations, rows = {}, []
    rng = np.random.default_rng(0)
    for r in range(8):
        for c in range(6):
            conv = Conversation(f"c{c}", f"r{r}", [Message("user", "hi"), Message("assistant", f"reply {c}")])
            conversations[(f"c{c}", f"r{r}")] = conv
            rows.append((f"c{c}", pd.NA, f"r{r}", "perceived_empathy", int(rng.integers(1, 8))))
    ratings = pd.DataFrame(rows, columns=["conversation_id", "turn_index", "rater_id", "dimension", "rating"])
    ratings["turn_index"] = ratings["turn_index"].astype("Int64")
    data = RatingData(conversations, ratings, pd.DataFrame(index=pd.Index([], name="rater_id")))
    r = evaluate(data, splits=("cold_start",), n_folds=4, n_boot=20,
                 models={"majority": MajorityClass(), "rater_mean": RaterMean()}, taxonomy=TAXONOMY)
    assert r["n_ratings"] == 48 and r["controls"] == ["perceived_empathy"]


def test_bootstrap_resamples_equal_a_direct_weighted_spearman_per_fold():
    from sense7.research.metrics import fold_spearman_draws
    from sense7.research.metrics import RankStructure, cluster_weights, weighted_spearman

    rng = np.random.default_rng(7)
    n = 300
    Y = pd.DataFrame({"a": rng.integers(1, 6, n).astype(float), "b": rng.integers(1, 6, n).astype(float)})
    Y.loc[rng.random(n) < 0.2, "b"] = np.nan  # unrated cells are left out per control
    scores = {"m": pd.DataFrame({"a": Y["a"].fillna(3) + rng.normal(0, 1, n), "b": rng.normal(0, 1, n)})}
    clusters, folds = rng.integers(0, 40, n), rng.integers(0, 3, n)
    boot = fold_spearman_draws(Y, scores, clusters, folds, n_boot=5, seed=11)
    for b, weights in enumerate(cluster_weights(clusters, 5, seed=11)):
        for c in ("a", "b"):
            acc = total = 0.0
            for f in range(3):
                rows = np.flatnonzero((folds == f) & Y[c].notna().to_numpy())
                w = weights[rows]
                rho = weighted_spearman(RankStructure(scores["m"][c].to_numpy()[rows]),
                                        RankStructure(Y[c].to_numpy()[rows]), w)
                acc, total = acc + rho * w.sum(), total + w.sum()
            assert boot["m"][c][b] == pytest.approx(acc / total)
        assert boot["m"]["__overall__"][b] == pytest.approx((boot["m"]["a"][b] + boot["m"]["b"][b]) / 2)
