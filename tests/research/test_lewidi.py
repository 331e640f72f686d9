"""LeWiDi 2025's ordinal scores (sense7.research.lewidi): a worked example by hand, an independent check of
the Wasserstein distance, and the figures `evaluate` reports against hand computations on its own data."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import wasserstein_distance
from sklearn.base import BaseEstimator

from sense7.research.evaluation import evaluate_items
from sense7.research.lewidi import anad, item_anad, mean_soft_label_wasserstein, soft_label_wasserstein

from tests.support.research import planted_items


def test_anad_worked_example_divides_by_the_number_of_levels_and_averages_over_items():
    # A 1-6 scale (K = 6, as CSC). Item A: two annotators rate 1 and 4, predicted 2 and 4 -> mean |d| 1/2.
    # Item B: three annotators rate 6, 6, 3, predicted 3, 6, 3 -> mean |d| 1. Per item / K: 1/12 and 1/6;
    # ANAD = their mean = 1/8. (Per annotator over K - 1, as sense7's own summary does, would differ.)
    items = [0, 0, 1, 1, 1]
    true = [1, 4, 6, 6, 3]
    pred = [2, 4, 3, 6, 3]
    assert item_anad(items, true, pred, 6).tolist() == pytest.approx([1 / 12, 1 / 6])
    assert anad(items, true, pred, 6) == pytest.approx(0.125)


def test_soft_label_wasserstein_worked_example_in_levels():
    # Item A: observed (1/2 at 1, 1/2 at 4), predicted (1/2 at 2, 1/2 at 4): half the mass moves one level.
    # Item B: observed (1/3 at 3, 2/3 at 6), predicted all at 6: a third of the mass moves three levels.
    targets = np.array([[0.5, 0, 0, 0.5, 0, 0], [0, 0, 1 / 3, 0, 0, 2 / 3]])
    predictions = np.array([[0, 0.5, 0, 0.5, 0, 0], [0, 0, 0, 0, 0, 1]])
    assert soft_label_wasserstein(targets, predictions).tolist() == pytest.approx([0.5, 1.0])
    assert mean_soft_label_wasserstein(targets, predictions) == pytest.approx(0.75)
    # Independent: scipy's 1-d earth mover's distance with levels as positions.
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), 20), rng.dirichlet(np.ones(7), 20)
    expected = [wasserstein_distance(np.arange(7), np.arange(7), a, b) for a, b in zip(p, q)]
    assert soft_label_wasserstein(p, q).tolist() == pytest.approx(expected)


class _AlwaysLowest(BaseEstimator):
    """Predicts the scale's lowest level with probability 1 (so every distance is computable by hand)."""

    def fit(self, X, Y):
        self.levels_ = np.arange(1, 6, dtype=float)
        self.columns_ = list(Y.columns)
        return self

    def predict_proba(self, X):
        p = np.zeros((len(X), 5))
        p[:, 0] = 1
        return {c: p for c in self.columns_}

    def predict(self, X):
        return pd.DataFrame({c: np.ones(len(X)) for c in self.columns_})


def test_evaluate_reports_the_task_scores_next_to_its_own_summaries():
    X, Y = planted_items(n_raters=6, n_conversations=5, n_turns=3, shared_conversations=True, seed=3)
    X.loc[X["rater_id"] == "r5", "conversation_id"] = "solo"  # single-rater turns count in ANAD only
    result = evaluate_items(X, Y, {"lowest": _AlwaysLowest()}, splits=("known_rater",), n_folds=3, n_boot=30)
    block = result["splits"]["known_rater"]["perspectivist"]["models"]["lowest"]
    frame = X.assign(y=Y["overall"])
    per_turn = frame.groupby(["conversation_id", "turn_index"])["y"]
    expected_anad = ((per_turn.mean() - 1) / 5).mean()  # mean |y - 1| over the turn's raters, / K, over turns
    assert block["lewidi_anad"]["mean"] == pytest.approx(expected_anad)
    assert block["lewidi_anad"]["n_turns"] == per_turn.ngroups
    multi = per_turn.mean()[per_turn.size() >= 2]  # point mass at 1: the distance is the mean of (y - 1)
    assert block["lewidi_wasserstein"]["mean"] == pytest.approx((multi - 1).mean())
    assert block["wasserstein_01"]["mean"] == pytest.approx((multi - 1).mean() / 4)
    expected_rater = ((frame["y"] - 1) / 4).groupby(frame["rater_id"]).mean().mean()
    assert block["rater_mean_distance"]["mean"] == pytest.approx(expected_rater)
    lo, hi = block["lewidi_anad"]["ci"]
    assert lo <= block["lewidi_anad"]["mean"] <= hi


class _Skewed(BaseEstimator):
    """The same skewed distribution for every row: mode the 1st level, median the 2nd."""

    P = np.array([0.3, 0.25, 0.25, 0.0, 0.2])

    def fit(self, X, Y):
        self.levels_ = np.arange(1, 6, dtype=float)
        self.columns_ = list(Y.columns)
        return self

    def predict_proba(self, X):
        return {c: np.tile(self.P, (len(X), 1)) for c in self.columns_}

    def predict(self, X):
        return pd.DataFrame({c: np.ones(len(X)) for c in self.columns_})


def test_accuracy_takes_the_mode_and_distances_the_median_both_reported():
    X, Y = planted_items(n_raters=6, n_conversations=5, n_turns=3, shared_conversations=True, seed=4)
    result = evaluate_items(X, Y, {"skewed": _Skewed()}, splits=("known_rater",), n_folds=3, n_boot=20)
    split = result["splits"]["known_rater"]
    m = split["models"]["skewed"]["overall"]
    y = Y["overall"].to_numpy()
    assert m["accuracy"] == pytest.approx(np.mean(y == 1)) and m["accuracy_median"] == pytest.approx(np.mean(y == 2))
    assert m["mae"] == pytest.approx(np.mean(np.abs(y - 2))) and m["mae_mode"] == pytest.approx(np.mean(np.abs(y - 1)))
    block = split["perspectivist"]["models"]["skewed"]
    per_turn = X.assign(y=y).groupby(["conversation_id", "turn_index"])["y"]
    assert block["lewidi_anad"]["mean"] == pytest.approx(per_turn.apply(lambda v: np.abs(v - 2).mean() / 5).mean())
    assert block["lewidi_anad_mode"]["mean"] == pytest.approx(per_turn.apply(lambda v: np.abs(v - 1).mean() / 5).mean())
