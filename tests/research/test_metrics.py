"""Metrics against values worked out by hand, and the resampling identity the bootstrap relies on."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from sense7.research.metrics import (
    RankStructure,
    cluster_weights,
    percentile_ci,
    point_metrics,
    quadratic_kappa,
    spearman,
    weighted_spearman,
)


def test_point_metrics_match_hand_computed_values():
    y = [1, 2, 3, 4, 5]
    level = [1, 2, 3, 5, 4]
    m = point_metrics(y, level, level, levels=range(1, 6))
    # Spearman: sum d^2 = 2, 1 - 6*2 / (5*24) = 0.9
    assert m["spearman"] == pytest.approx(0.9)
    assert m["accuracy"] == pytest.approx(0.6)
    assert m["mae"] == pytest.approx(0.4)
    # QWK: observed weighted disagreement 2 (two cells at distance 1); expected 0.2 * sum_ij (i-j)^2 = 20.
    assert m["qwk"] == pytest.approx(1 - 2 / 20)


def test_qwk_is_one_when_perfect_and_counts_distance():
    y = np.array([1, 1, 2, 3, 5, 5, 4])
    assert quadratic_kappa(y, y, range(1, 6)) == pytest.approx(1.0)
    near = quadratic_kappa(y, np.clip(y + 1, 1, 5), range(1, 6))
    far = quadratic_kappa(y, np.clip(y + 3, 1, 5), range(1, 6))
    assert 1.0 > near > far


def test_spearman_uses_the_score_and_is_undefined_for_constant_predictions():
    y = [1, 2, 3, 4]
    assert spearman(y, [0.1, 0.2, 0.3, 0.4]) == pytest.approx(1.0)
    assert np.isnan(spearman(y, [3, 3, 3, 3]))


def test_weighted_spearman_equals_spearman_of_the_expanded_data():
    rng = np.random.default_rng(3)
    y = rng.integers(1, 6, 60).astype(float)  # many ties, like ratings
    score = np.round(rng.normal(size=60) + 0.3 * y, 1)  # some ties too
    weights = rng.integers(0, 4, 60).astype(float)
    expanded = np.repeat(np.arange(60), weights.astype(int))
    expected = spearmanr(y[expanded], score[expanded]).statistic
    got = weighted_spearman(RankStructure(score), RankStructure(y), weights)
    assert got == pytest.approx(expected, abs=1e-12)
    assert weighted_spearman(RankStructure(score), RankStructure(y), np.ones(60)) == pytest.approx(
        spearmanr(y, score).statistic, abs=1e-12)


def test_cluster_weights_resample_whole_clusters():
    clusters = np.array([0, 0, 0, 1, 1, 2])
    for weights in cluster_weights(clusters, 50, seed=1):
        # rows of one cluster always share one draw count, and draws sum to the number of clusters
        assert weights[0] == weights[1] == weights[2] and weights[3] == weights[4]
        assert weights[0] + weights[3] + weights[5] == 3


def test_percentile_ci_ignores_undefined_resamples():
    assert percentile_ci([np.nan, np.nan]) == [None, None]
    lo, hi = percentile_ci(np.r_[np.linspace(0, 1, 101), np.nan])
    assert lo == pytest.approx(0.025) and hi == pytest.approx(0.975)
