"""Decision rules (sense7.model.decision) and the compiled predictions' `best` under each rule."""

import numpy as np
import pytest

from sense7.model.decision import decide
from sense7.model.serving import Predictions


def test_mode_and_median_by_hand():
    p = np.array([[0.3, 0.25, 0.25, 0.0, 0.2],   # mode 1st level; cumulative 0.3, 0.55 -> median 2nd
                  [0.1, 0.1, 0.1, 0.1, 0.6],     # both the 5th
                  [0.5, 0.0, 0.0, 0.0, 0.5],     # a half reached exactly at the 1st: median 1st
                  [0.2, 0.2, 0.1 + 0.2 - 0.2, 0.25, 0.25]])  # cumulative 0.5 at the 3rd (float sums)
    assert decide(p, "mode").tolist() == [0, 4, 0, 3]
    assert decide(p, "median").tolist() == [1, 4, 0, 2]
    with pytest.raises(ValueError, match="median"):
        decide(p, "mean")


def test_median_minimizes_expected_absolute_distance():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(7, 0.4), 200)
    cost = np.abs(np.arange(7)[:, None] - np.arange(7)[None, :])  # cost[chosen, level]
    expected = p @ cost.T  # (rows, chosen level)
    chosen = decide(p, "median")
    assert np.allclose(expected[np.arange(200), chosen], expected.min(axis=1))


def test_predictions_best_follows_the_rule():
    probs = np.array([[[0.3, 0.25, 0.25, 0.0, 0.2]], [[0.0, 0.1, 0.2, 0.3, 0.4]]])  # (items, controls, levels)
    pred = Predictions(kinds=["generic", "generic"], probs=probs, levels=np.arange(1, 6))
    level, conf = pred.best()
    assert level[:, 0].tolist() == [1, 5] and conf[:, 0].tolist() == pytest.approx([0.3, 0.4])
    level, conf = pred.best("median")
    assert level[:, 0].tolist() == [2, 4] and conf[:, 0].tolist() == pytest.approx([0.25, 0.3])
