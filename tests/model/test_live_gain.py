"""Planted data (sense7.research.live_gain.simulate): raters with strong leniency and slopes; after 5 of a
new rater's answers their live pre-fills are >= 30% closer (MAE) than the traits prior on their remaining
turns, the gain curve never drops by more than its interval, and a rater answering at random is not made
worse than the prior beyond the interval. Also the curve's arithmetic on a frame worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from sense7.research.live_gain import bin_of, gain_curve, simulate
from sense7.taxonomy import load_taxonomy


@pytest.fixture(scope="module")
def simulated():
    return simulate(seed=0, n_boot=300, taxonomy=load_taxonomy())


def test_five_answers_cut_the_error_of_the_traits_prior_by_30_percent(simulated):
    signal = simulated["after"]["signal"]
    assert signal["n_raters"] >= 15
    assert signal["relative_gain"]["value"] >= 0.30, signal
    assert signal["live_minus_static"]["ci"][1] < 0  # and the difference is clear of zero


def test_the_gain_curve_rises_within_its_intervals(simulated):
    bins = simulated["curve"]["bins"]
    assert [b["own_ratings"] for b in bins] == ["0", "1-2", "3-5", "6-10", "11-20", "21+"]
    gains = [b["relative_gain"] for b in bins]
    assert gains[0]["value"] == 0  # no answers yet: live is the static prediction
    for earlier, later in zip(gains, gains[1:]):
        assert later["value"] >= earlier["ci"][0], gains  # never significantly lower than before
    assert gains[-1]["ci"][0] > 0.2


def test_a_random_rater_is_not_made_worse_than_the_prior(simulated):
    noise = simulated["after"]["random"]
    assert noise["n_raters"] >= 5
    assert noise["live_minus_static"]["ci"][0] <= 0, noise  # not significantly worse


def test_gain_curve_arithmetic():
    frame = pd.DataFrame({"rater_id": ["a", "a", "b", "b", "b"], "own_ratings": [0, 1, 2, 4, 30],
                          "abs_error_live": [1.0, 0.0, 1.0, 0.0, 0.0], "abs_error_static": [1.0, 1.0, 1.0, 2.0, 1.0],
                          "abs_error_generic": [2.0, 2.0, 2.0, 2.0, 2.0]})
    assert bin_of([0, 1, 2, 3, 5, 6, 10, 11, 20, 21]).tolist() == \
        ["0", "1-2", "1-2", "3-5", "3-5", "6-10", "6-10", "11-20", "11-20", "21+"]
    curve = {b["own_ratings"]: b for b in gain_curve(frame, n_boot=50)["bins"]}
    assert list(curve) == ["0", "1-2", "3-5", "21+"]
    one_two = curve["1-2"]
    assert (one_two["n"], one_two["n_raters"]) == (2, 2)
    assert one_two["mae"]["live"]["value"] == 0.5 and one_two["mae"]["static"]["value"] == 1.0
    assert one_two["live_minus_static"]["value"] == -0.5 and one_two["relative_gain"]["value"] == 0.5
    assert curve["3-5"]["relative_gain"]["value"] == 1.0
    low, high = one_two["mae"]["live"]["ci"]
    assert 0 <= low <= 0.5 <= high <= 1
    assert gain_curve(frame.iloc[:0])["bins"] == []
