"""Live evaluation: how good was the model the raters actually met?

Cross-validation (`sense7.research.evaluation`) estimates how a model would do; this measures how the
served model did. Every rating whose prediction was recorded but hidden from the rater is a clean test
item: the model predicted before the rater answered, and the rater could not anchor on it. Each rating
is scored for three models:

- "personalized": whatever the served model answered (predicted_level / predicted_expected), whichever
  kind it was at the time (personalized, traits or generic: reported under "kinds");
- "generic": the generic model's answer recorded next to it;
- "rater_mean": the rater's mean of their earlier ratings of the control, the baseline a personalized
  model has to beat.

Intervals resample raters (a rater's ratings are correlated: their leniency moves all of them), with the
same resamples for every model, so the personalized-minus-baseline differences are paired.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from sense7.research.metrics import RankStructure, cluster_draws, percentile_ci, point_metrics, weighted_spearman

MODELS = ("personalized", "generic", "rater_mean")
METRICS = ("spearman", "qwk", "mae")
PAIRED = {"personalized_minus_generic": "generic", "personalized_minus_rater_mean": "rater_mean"}


def _none(value) -> float | None:
    """Strict JSON: undefined values (NaN) become null."""
    return float(value) if value is not None and math.isfinite(value) else None


def _to_level(score: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The nearest level on the scale (halves round up, like the baselines), clipped to the scale."""
    index = np.clip(np.floor(score - levels[0] + 0.5).astype(int), 0, len(levels) - 1)
    return levels[index]


def rater_mean_scores(frame: pd.DataFrame, levels: Sequence[int]) -> np.ndarray:
    """The rater-mean baseline's score for each row: the recorded `rater_mean`, else the mean of all
    earlier rows' ratings of the same control, else the scale's midpoint.

    The frame is in time order and only rows *before* a row are used: at the time of a rating nobody
    could have known the later ones (nor the rating itself), and letting them in would credit the
    baseline with the answer it is scored against."""
    rating = frame["rating"].to_numpy(float)
    known = np.isfinite(rating)
    by_control = pd.DataFrame({"control": frame["control"].to_numpy(), "y": np.where(known, rating, 0.0),
                               "n": known.astype(float)}).groupby("control")
    # Running totals minus the row itself: strictly earlier rows only (no peeking at this or later ratings).
    earlier_sum = by_control["y"].cumsum().to_numpy() - np.where(known, rating, 0.0)
    earlier_n = by_control["n"].cumsum().to_numpy() - known
    with np.errstate(all="ignore"):
        earlier = np.where(earlier_n > 0, earlier_sum / earlier_n, (min(levels) + max(levels)) / 2)
    recorded = frame["rater_mean"].to_numpy(float)
    return np.where(np.isfinite(recorded), recorded, earlier)


def _weighted_qwk(true_index: np.ndarray, level_index: np.ndarray, w: np.ndarray, n_levels: int) -> float:
    """Quadratic weighted kappa of the data set where row i appears w[i] times: `quadratic_kappa` on
    repeated rows, without repeating them (sklearn's kappa is too slow for thousands of resamples)."""
    observed = np.bincount(true_index * n_levels + level_index, weights=w, minlength=n_levels ** 2)
    observed = observed.reshape(n_levels, n_levels)
    total = observed.sum()
    if total == 0:
        return float("nan")
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / total
    distance = (np.arange(n_levels)[:, None] - np.arange(n_levels)[None, :]) ** 2
    chance = (distance * expected).sum()
    if chance == 0:  # one level throughout, on both sides: identical, like quadratic_kappa
        return 1.0
    return float(1 - (distance * observed).sum() / chance)


def _model_columns(rows: pd.DataFrame, levels: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{model: (level, score)} per row."""
    baseline = rows["rater_mean_score"].to_numpy(float)
    return {
        "personalized": (rows["predicted_level"].to_numpy(float), rows["predicted_expected"].to_numpy(float)),
        "generic": (rows["generic_level"].to_numpy(float), rows["generic_expected"].to_numpy(float)),
        "rater_mean": (_to_level(baseline, levels).astype(float), baseline),
    }


def _control_metrics(rows: pd.DataFrame, raters: np.ndarray, draws: np.ndarray, levels: np.ndarray):
    """Point metrics {model: {metric: value}} and resampled ones {model: {metric: (n_boot,)}} of one
    control. A model is scored on the rows where it gave both a level and a score."""
    y = rows["rating"].to_numpy(float)
    points, boot = {}, {}
    for model, (level, score) in _model_columns(rows, levels).items():
        ok = np.isfinite(level) & np.isfinite(score)
        values = point_metrics(y[ok], level[ok], score[ok], levels) if ok.any() else dict.fromkeys(METRICS, np.nan)
        points[model] = {name: values[name] for name in METRICS}
        boot[model] = {name: np.full(len(draws), np.nan) for name in METRICS}
        if not ok.any():
            continue
        true_rank, score_rank = RankStructure(y[ok]), RankStructure(score[ok])
        true_index, level_index = np.searchsorted(levels, y[ok]), np.searchsorted(levels, level[ok])
        error = np.abs(y[ok] - level[ok])
        for b, draw in enumerate(draws):
            w = draw[raters[ok]]
            if w.sum() == 0:
                continue
            boot[model]["spearman"][b] = weighted_spearman(true_rank, score_rank, w)
            boot[model]["qwk"][b] = _weighted_qwk(true_index, level_index, w, len(levels))
            boot[model]["mae"][b] = (w * error).sum() / w.sum()
    return points, boot


def _mean_over_controls(values: list) -> float:
    """Mean of the finite values (a control where a metric is undefined is left out); NaN if none."""
    values = np.asarray(values, float)
    finite = np.isfinite(values)
    return float(values[finite].mean()) if finite.any() else float("nan")


def _boot_mean(arrays: list[np.ndarray]) -> np.ndarray:
    """Per resample, the mean over controls of the finite values."""
    stacked = np.vstack(arrays)
    finite = np.isfinite(stacked)
    with np.errstate(all="ignore"):
        return np.where(finite.any(axis=0), np.where(finite, stacked, 0).sum(axis=0) / finite.sum(axis=0), np.nan)


def _json_block(points: dict, boot: dict) -> dict:
    out = {name: _none(points[name]) for name in METRICS}
    out.update({f"{name}_ci": percentile_ci(boot[name]) for name in METRICS})
    return out


def _block(rows: pd.DataFrame, levels: np.ndarray, n_boot: int, seed: int) -> dict:
    """The metrics of one set of rows (one version, or all)."""
    turns = pd.Series(rows.groupby(["rater_id", "conversation_id", "turn_key"]).ngroup().to_numpy())
    raters, rater_names = pd.factorize(rows["rater_id"].astype(str))
    draws = cluster_draws(len(rater_names), n_boot, seed)
    controls = list(pd.unique(rows["control"]))
    per_control = {}
    for control in controls:
        mine = (rows["control"] == control).to_numpy()
        per_control[control] = _control_metrics(rows[mine], raters[mine], draws, levels)
    models, paired = {}, {}
    overall_boot = {}
    for model in MODELS:
        points = {name: _mean_over_controls([per_control[c][0][model][name] for c in controls]) for name in METRICS}
        overall_boot[model] = {name: _boot_mean([per_control[c][1][model][name] for c in controls])
                               for name in METRICS}
        models[model] = {
            "overall": _json_block(points, overall_boot[model]),
            "per_control": {str(c): _json_block(per_control[c][0][model], per_control[c][1][model]) for c in controls},
        }
    for key, baseline in PAIRED.items():
        p, g = models["personalized"]["overall"]["spearman"], models[baseline]["overall"]["spearman"]
        paired[key] = {
            "spearman": None if p is None or g is None else p - g,
            "ci": percentile_ci(overall_boot["personalized"]["spearman"] - overall_boot[baseline]["spearman"]),
        }
    kinds = turns.groupby(rows["kind"].astype(str).to_numpy()).nunique()
    return {
        "n_ratings": int(turns.nunique()),
        "n_raters": int(len(rater_names)),
        "kinds": {str(kind): int(count) for kind, count in kinds.items()},
        "models": models,
        "paired": paired,
    }


def live_evaluation(frame: pd.DataFrame, levels: Sequence[int], n_boot: int = 1000, seed: int = 0) -> dict:
    """{"levels", "versions": {version: block}, "all": block (every version pooled)}, strict JSON.

    `frame`: one row per (rating, control), in time order, with rater_id, conversation_id, turn_index,
    version, kind, control, rating, predicted_level, predicted_expected, generic_level, generic_expected
    and rater_mean (the rater's mean of their earlier ratings of the control; NaN when none).

    block = {"n_ratings" (distinct rated turns), "n_raters", "kinds": {kind: rated turns},
             "models": {model: {"overall": M, "per_control": {control: M}}},
             "paired": {"personalized_minus_generic" | "personalized_minus_rater_mean": {"spearman", "ci"}}}
    M = {spearman, qwk, mae, spearman_ci, qwk_ci, mae_ci}: Spearman of the rating against the model's
    expected rating, QWK and MAE of its predicted *level* (mae is |rating - level|, not of the expected
    rating); overall = the mean over controls. Intervals: 95% percentiles over `n_boot` resamples of raters.
    Undefined values (e.g. Spearman of a constant prediction) are None.

    An empty frame (or one without a rating) gives {"levels", "versions": {}, "all": None}: no rating with
    a hidden prediction yet is a normal state of a young study, not an error.
    """
    levels = np.asarray(sorted(levels))
    frame = frame.reset_index(drop=True)
    # Before dropping anything: the baseline's fallback is the mean of every earlier rating.
    frame = frame.assign(rater_mean_score=rater_mean_scores(frame, levels),
                         turn_key=pd.to_numeric(frame["turn_index"], errors="coerce").fillna(-1).astype(int))
    frame = frame[frame["rating"].notna()]
    result = {"levels": [int(v) for v in levels], "versions": {}, "all": None}
    if frame.empty:
        return result
    _check_scale(frame, levels)
    for version in pd.unique(frame["version"]):
        result["versions"][str(version)] = _block(frame[frame["version"] == version], levels, n_boot, seed)
    result["all"] = _block(frame, levels, n_boot, seed)
    return result


def _check_scale(frame: pd.DataFrame, levels: np.ndarray) -> None:
    """Ratings and predicted levels must lie on the scale: QWK and the level indices assume it."""
    for column in ("rating", "predicted_level", "generic_level"):
        values = frame[column].to_numpy(float)
        outside = np.isfinite(values) & ~np.isin(values, levels)
        if outside.any():
            raise ValueError(f"{column} outside the scale {levels.tolist()}: {sorted(set(values[outside]))}")
