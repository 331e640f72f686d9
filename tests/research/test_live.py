"""`sense7.research.live_evaluation`: the served model scored on hidden-prediction ratings, per version, against
the generic model and a rater-mean baseline that only knows the past."""

import json

import numpy as np
import pandas as pd
import pytest

from sense7.research.live_evaluation import _weighted_qwk, live_evaluation, rater_mean_scores
from sense7.research.metrics import quadratic_kappa

LEVELS = [1, 2, 3, 4, 5]
METRIC_KEYS = {"spearman", "qwk", "mae", "spearman_ci", "qwk_ci", "mae_ci"}


def _frame(n_raters=30, n_turns=20, controls=("tone", "overall"), version="v1", kind="personalized", seed=0):
    """Ratings uniform on 1-5; the served model = rating + small noise, the generic model = noise only."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_raters):
        for t in range(n_turns):
            for control in controls:
                rating = int(rng.integers(1, 6))
                expected = np.clip(rating + rng.normal(0, 0.6), 1, 5)
                generic = rng.uniform(1, 5)
                rows.append({"rater_id": f"{version}-r{r}", "conversation_id": f"c{r}_{t // 4}", "turn_index": t % 4,
                             "version": version, "kind": kind, "control": control, "rating": rating,
                             "predicted_level": int(np.round(expected)), "predicted_expected": expected,
                             "generic_level": int(np.round(generic)), "generic_expected": generic,
                             "rater_mean": np.nan})
    return pd.DataFrame(rows)


def test_planted_personalized_beats_generic_with_a_paired_interval_above_zero():
    result = live_evaluation(_frame(), LEVELS, n_boot=300)
    block = result["versions"]["v1"]
    personalized, generic = (block["models"][m]["overall"] for m in ("personalized", "generic"))
    assert set(personalized) == METRIC_KEYS
    assert set(block["models"]["rater_mean"]["per_control"]) == {"tone", "overall"}
    assert personalized["spearman"] > 0.8 and abs(generic["spearman"]) < 0.15
    assert personalized["qwk"] > generic["qwk"] and personalized["mae"] < generic["mae"]
    for name in ("spearman", "qwk", "mae"):
        lo, hi = personalized[f"{name}_ci"]
        assert lo < personalized[name] < hi
    paired = block["paired"]["personalized_minus_generic"]
    assert paired["spearman"] == pytest.approx(personalized["spearman"] - generic["spearman"])
    assert paired["ci"][0] > 0
    assert block["paired"]["personalized_minus_rater_mean"]["ci"][0] > 0


def test_versions_are_reported_separately_and_pooled_under_all():
    old = _frame(n_raters=4, n_turns=5, version="v1", kind="generic", seed=1)
    new = _frame(n_raters=6, n_turns=3, version="v2", kind="traits", seed=2)
    new.loc[new.index[:6], "kind"] = "personalized"  # the first 3 turns (2 controls each) of v2
    result = live_evaluation(pd.concat([old, new]), LEVELS, n_boot=50)
    v1, v2, pooled = result["versions"]["v1"], result["versions"]["v2"], result["all"]
    assert (v1["n_ratings"], v1["n_raters"], v1["kinds"]) == (20, 4, {"generic": 20})
    assert (v2["n_ratings"], v2["n_raters"], v2["kinds"]) == (18, 6, {"personalized": 3, "traits": 15})
    assert (pooled["n_ratings"], pooled["n_raters"]) == (38, 10)
    assert pooled["kinds"] == {"generic": 20, "personalized": 3, "traits": 15}
    assert result["levels"] == LEVELS


def test_differences_are_paired_on_the_same_rater_resamples():
    # Raters differ in how predictable they are, and the generic model nearly copies the served one: each
    # resample moves both Spearmans together, so their difference varies far less than either.
    frame = _frame(n_raters=20, n_turns=10, controls=("tone",), seed=4)
    rng = np.random.default_rng(5)
    noise_sd = np.repeat(rng.uniform(0.2, 2.5, 20), 10)
    frame["predicted_expected"] = frame["rating"] + rng.normal(0, 1, len(frame)) * noise_sd
    frame["generic_expected"] = frame["predicted_expected"] + rng.normal(0, 0.05, len(frame))
    block = live_evaluation(frame, LEVELS, n_boot=300)["all"]
    lo, hi = block["models"]["personalized"]["overall"]["spearman_ci"]
    paired_lo, paired_hi = block["paired"]["personalized_minus_generic"]["ci"]
    assert paired_hi - paired_lo < 0.3 * (hi - lo)


def test_rater_mean_baseline_only_uses_earlier_ratings():
    # One rater, ratings 1..5 in time order, no recorded rater mean: the fallback is the mean of the
    # *earlier* rows (midpoint 3 for the first). Any mean that included the current or later ratings
    # would rise with the rating and rank it perfectly.
    frame = pd.DataFrame({"rater_id": "r", "conversation_id": "c", "turn_index": [1, 3, 5, 7, 9], "version": "v",
                          "kind": "generic", "control": "tone", "rating": [1, 2, 3, 4, 5],
                          "predicted_level": 3, "predicted_expected": 3.0, "generic_level": 3,
                          "generic_expected": 3.0, "rater_mean": np.nan})
    assert rater_mean_scores(frame, LEVELS) == pytest.approx([3.0, 1.0, 1.5, 2.0, 2.5])

    tone = live_evaluation(frame, LEVELS, n_boot=20)["versions"]["v"]["models"]["rater_mean"]["per_control"]["tone"]
    # Scores rank [5, 1, 2, 3, 4] against 1..5: sum d^2 = 20, rho = 1 - 6 * 20 / 120 = 0.
    assert tone["spearman"] == pytest.approx(0.0)
    # Levels (halves round up) 3, 1, 2, 2, 3: errors 2, 1, 1, 2, 2.
    assert tone["mae"] == pytest.approx(1.6)


def test_recorded_rater_mean_wins_and_the_fallback_is_per_control():
    frame = pd.DataFrame({"control": ["tone", "support", "tone", "support", "tone"],
                          "rating": [5, 1, 4, np.nan, 2],
                          "rater_mean": [np.nan, np.nan, np.nan, 2.5, 4.25]})
    # tone: midpoint, then mean(5); support: midpoint, then the recorded 2.5; tone: recorded 4.25.
    assert rater_mean_scores(frame, LEVELS) == pytest.approx([3.0, 3.0, 5.0, 2.5, 4.25])


def test_weighted_qwk_equals_quadratic_kappa_on_repeated_rows():
    rng = np.random.default_rng(0)
    y, level = rng.integers(1, 6, 40), rng.integers(1, 6, 40)
    level[:20] = y[:20]
    w = rng.integers(0, 4, 40)
    expected = quadratic_kappa(np.repeat(y, w), np.repeat(level, w), LEVELS)
    assert _weighted_qwk(y - 1, level - 1, w.astype(float), 5) == pytest.approx(expected)
    assert _weighted_qwk(y - 1, level - 1, np.ones(40), 5) == pytest.approx(quadratic_kappa(y, level, LEVELS))


def test_result_is_strict_json_with_undefined_values_as_null():
    frame = _frame(n_raters=3, n_turns=4, controls=("tone",))
    frame["generic_expected"] = 3.0  # a constant prediction: Spearman undefined
    frame["generic_level"] = 3
    result = live_evaluation(frame, LEVELS, n_boot=30)
    json.dumps(result, allow_nan=False)
    generic = result["all"]["models"]["generic"]["overall"]
    assert generic["spearman"] is None and generic["spearman_ci"] == [None, None]
    assert result["all"]["paired"]["personalized_minus_generic"] == {"spearman": None, "ci": [None, None]}


def test_empty_frame_has_no_versions():
    empty = _frame().iloc[:0]
    assert live_evaluation(empty, LEVELS) == {"levels": LEVELS, "versions": {}, "all": None}
    unrated = _frame(n_raters=1, n_turns=2).assign(rating=np.nan)
    assert live_evaluation(unrated, LEVELS)["versions"] == {}


def test_predictions_off_the_scale_are_an_error():
    with pytest.raises(ValueError, match="predicted_level outside the scale"):
        live_evaluation(_frame(n_raters=2, n_turns=2).assign(predicted_level=7), LEVELS, n_boot=10)
