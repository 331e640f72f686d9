"""Does pre-filling the model's prediction anchor raters?

A study's pre-fill policy puts each (rater, task) in an arm: "shown" (the model's predicted levels are
pre-filled in the form) or "hidden" (a prediction is recorded but never shown). The arm is randomized, so
the hidden arm tells how often raters land on the prediction on their own; whatever the shown arm adds to
that is the effect of seeing it.

`anchoring` compares the arms per control: how often ratings equal the prediction, how far they are from
it, the implied probability of keeping a pre-fill unchanged (`copy_rate`), and how long a task takes.
Confidence intervals resample raters: a rater's ratings are correlated, and with per-task randomization
one rater is in both arms, so both arms are recomputed from the same resample (a paired comparison).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sense7.research.metrics import finite_or_none, cluster_draws, percentile_ci

ARMS = ("shown", "hidden")
ALL = "__all__"


def simulate_anchored(own: int, predicted: int | None, copy_probability: float, rng) -> int:
    """The level a rater submits under the model `anchoring` estimates: with probability
    `copy_probability` the pre-filled prediction is kept, otherwise the rater's own level. Nothing
    shown (predicted None, the hidden arm): always the own level. For simulations (tests, demo data)."""
    if predicted is not None and rng.random() < copy_probability:
        return int(predicted)
    return int(own)


def _estimate(values: np.ndarray) -> dict:
    """values[0] is the statistic on the data, values[1:] on the resamples."""
    return {"value": finite_or_none(values[0]), "ci": percentile_ci(values[1:])}


def _weighted_medians(values: np.ndarray, clusters: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """For each row b of `weights` (n_draws, n_clusters): the median of the data set in which value i is
    repeated weights[b, clusters[i]] times (the mean of the two middle values for an even count, as
    np.median). NaN where nothing has weight. Draws are done in chunks so memory stays bounded."""
    out = np.full(len(weights), np.nan)
    if len(values) == 0:
        return out
    order = np.argsort(values, kind="stable")
    values, clusters = values[order], clusters[order]
    step = max(1, 2_000_000 // len(values))
    for start in range(0, len(weights), step):
        cum = np.cumsum(weights[start:start + step][:, clusters], axis=1)
        total = cum[:, -1]
        # 1-based ranks of the middle value(s) in the expanded data: equal for an odd total.
        lower = (cum >= np.ceil(total / 2)[:, None]).argmax(axis=1)
        upper = (cum >= (np.floor(total / 2) + 1)[:, None]).argmax(axis=1)
        out[start:start + step] = np.where(total > 0, (values[lower] + values[upper]) / 2, np.nan)
    return out


def _control_summary(rows: pd.DataFrame, raters: np.ndarray, n_raters: int, weights: np.ndarray) -> dict:
    """Per-arm agreement with the prediction and the differences between arms, for one control (or all).

    Each statistic is a ratio of per-rater sums, so a resample is one matrix product: weights (draws x
    raters) @ per-rater sums. weights[0] is all ones (the data as observed)."""
    rating, predicted = rows["rating"].to_numpy(float), rows["predicted"].to_numpy(float)
    equal, distance = (rating == predicted).astype(float), np.abs(rating - predicted)
    arm = rows["arm"].to_numpy()
    arms, share, mean_distance = {}, {}, {}
    for name in ARMS:
        mask = arm == name
        count = np.bincount(raters[mask], minlength=n_raters)
        with np.errstate(invalid="ignore", divide="ignore"):
            share[name] = (weights @ np.bincount(raters[mask], weights=equal[mask], minlength=n_raters)) / (
                weights @ count)
            mean_distance[name] = (weights @ np.bincount(raters[mask], weights=distance[mask],
                                                          minlength=n_raters)) / (weights @ count)
        arms[name] = {"n": int(mask.sum()), "share_equal": finite_or_none(share[name][0]),
                      "mean_distance": finite_or_none(mean_distance[name][0])}
    with np.errstate(invalid="ignore", divide="ignore"):
        # Undefined (None) when the hidden arm always equals the prediction: nothing left to copy.
        copy_rate = (share["shown"] - share["hidden"]) / (1.0 - share["hidden"])
    return {
        "arms": arms,
        "shift_toward_prediction": _estimate(mean_distance["hidden"] - mean_distance["shown"]),
        "share_equal_difference": _estimate(share["shown"] - share["hidden"]),
        "copy_rate": _estimate(copy_rate),
    }


def anchoring(frame: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """How much pre-filling the prediction pulls ratings toward it; strict JSON (None, never NaN).

    `frame`: one row per (submitted rating, control) with rater_id, task_id, arm ("shown"/"hidden"),
    control, rating, predicted (the recorded prediction's level, the one pre-filled in the shown arm) and
    lead_time (seconds on the task, NaN when unknown; the same on every row of a task). Rows missing a
    rating or a prediction count for the task time only.

    Returns {"n_raters", "arms": {arm: {"n_tasks", "n_raters", "median_seconds"}},
    "controls": {control and "__all__": {"arms": {arm: {"n", "share_equal", "mean_distance"}},
    "shift_toward_prediction", "share_equal_difference", "copy_rate"}}, "seconds_difference"}, each
    difference as {"value", "ci": [lo, hi]} (95%, resampling raters `n_boot` times; 0 = no CI).

    - share_equal: share of ratings equal to the prediction; mean_distance: mean |rating - predicted|.
    - shift_toward_prediction = mean_distance(hidden) - mean_distance(shown): positive when raters who
      saw the prediction ended up closer to it.
    - copy_rate: the probability p that a rater keeps a shown pre-fill as it is. Model: with probability
      p the pre-filled level is submitted; otherwise the rater gives their own rating, which equals the
      prediction by chance as often as in the hidden arm (randomization makes the arms alike in
      everything but the pre-fill). Then share_equal(shown) = p + (1 - p) * share_equal(hidden), so
      p = (s_shown - s_hidden) / (1 - s_hidden). A plain difference of shares would understate p by the
      chance agreement; near 0 (or negative, by sampling noise) means no detectable copying. It counts
      only exact keeps: being nudged toward the prediction shows in shift_toward_prediction instead.
    - seconds_difference: median seconds per task, shown minus hidden (a copied pre-fill is faster).
    - "__all__" pools the controls' ratings.

    An arm without rows has None values; with only one arm present the differences are None.
    """
    unknown = sorted(set(frame["arm"].astype(str)) - set(ARMS))
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}: expected one of {list(ARMS)}")
    raters, rater_names = pd.factorize(frame["rater_id"].astype(str))
    n_raters = len(rater_names)
    weights = np.vstack([np.ones((1, n_raters)), cluster_draws(n_raters, n_boot, seed)])

    rated = (frame["rating"].notna() & frame["predicted"].notna()).to_numpy()
    controls = {}
    for control in [*pd.unique(frame.loc[rated, "control"]), ALL]:
        mask = rated if control == ALL else rated & (frame["control"] == control).to_numpy()
        controls[str(control)] = _control_summary(frame[mask], raters[mask], n_raters, weights)

    # One row per submitted task (rater, task) for the times.
    first = ~frame.duplicated(["rater_id", "task_id"]).to_numpy()
    task_arm = frame["arm"].to_numpy()[first]
    task_rater = raters[first]
    seconds = frame["lead_time"].to_numpy(float)[first]
    arms, medians = {}, {}
    for name in ARMS:
        in_arm = task_arm == name
        timed = in_arm & np.isfinite(seconds)
        medians[name] = _weighted_medians(seconds[timed], task_rater[timed], weights)
        arms[name] = {"n_tasks": int(in_arm.sum()), "n_raters": int(len(np.unique(task_rater[in_arm]))),
                      "median_seconds": finite_or_none(medians[name][0])}
    return {
        "n_raters": n_raters,
        "arms": arms,
        "controls": controls,
        "seconds_difference": _estimate(medians["shown"] - medians["hidden"]),
    }
