"""Agreement metrics between ratings and predictions, and their cluster-bootstrap confidence intervals.

Point values come from scipy / scikit-learn. The bootstrap does not copy rows: a resample is a vector of
row multiplicities (how often each row was drawn, via its cluster), and `weighted_spearman` computes the
Spearman correlation of the data set in which every row is repeated that many times. That keeps 1000
resamples of 10^5 ratings a matter of seconds instead of minutes.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.metrics import cohen_kappa_score

METRIC_NAMES = ("spearman", "accuracy", "qwk", "mae")
# Under the other decision rule (sense7.model.decision), reported next to METRIC_NAMES by `evaluate`.
OTHER_RULE_METRIC_NAMES = ("mae_mode", "accuracy_median")


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: an undefined metric (e.g. Spearman of a constant prediction) becomes null."""
    value = float(value)
    return value if math.isfinite(value) else None


def macro_metrics(per_control: dict[str, dict], undefined=float("nan")) -> dict:
    """Each metric averaged over controls, leaving out controls where it is undefined (None or NaN);
    `undefined` where no control has it."""
    out = {}
    present = [n for n in OTHER_RULE_METRIC_NAMES if any(n in m for m in per_control.values())]
    for name in METRIC_NAMES + tuple(present):
        values = [m[name] for m in per_control.values() if m.get(name) is not None and math.isfinite(m[name])]
        out[name] = float(np.mean(values)) if values else undefined
    return out


def spearman(y_true, score) -> float:
    """Spearman rho; NaN when either side is constant (a constant prediction ranks nothing)."""
    y_true, score = np.asarray(y_true, float), np.asarray(score, float)
    if len(y_true) < 2 or np.ptp(y_true) == 0 or np.ptp(score) == 0:
        return float("nan")
    return float(spearmanr(y_true, score).statistic)


def quadratic_kappa(y_true, y_level, levels) -> float:
    """Quadratic weighted kappa over the full scale `levels`; 1 = perfect, 0 = chance agreement."""
    y_true, y_level = np.asarray(y_true, int), np.asarray(y_level, int)
    if len(np.unique(np.concatenate([y_true, y_level]))) < 2:
        # sklearn divides 0 by 0 here; all-equal identical vectors agree perfectly, anything else is undefined.
        return 1.0 if np.array_equal(y_true, y_level) else float("nan")
    with warnings.catch_warnings():  # undefined cases come back as NaN; the warning adds nothing
        warnings.simplefilter("ignore")
        return float(cohen_kappa_score(y_true, y_level, labels=list(levels), weights="quadratic"))


def point_metrics(y_true, y_level, score, levels) -> dict:
    """Spearman (true rating vs the model's score), accuracy and QWK (on levels), MAE (levels).
    `levels=None` skips QWK (NaN), e.g. when y_level is a continuous score."""
    y_true = np.asarray(y_true, float)
    y_level = np.asarray(y_level, float)
    return {
        "spearman": spearman(y_true, score),
        "accuracy": float(np.mean(y_true == y_level)) if len(y_true) else float("nan"),
        "qwk": quadratic_kappa(y_true, y_level, levels) if levels is not None else float("nan"),
        "mae": float(np.mean(np.abs(y_true - y_level))) if len(y_true) else float("nan"),
    }


class RankStructure:
    """Tie groups of one variable, computed once so each bootstrap resample ranks in O(n)."""

    def __init__(self, values):
        # np.unique sorts, so group g holds the g-th smallest distinct value.
        self.groups, self.inverse = np.unique(np.asarray(values, float), return_inverse=True)

    def midranks(self, weights: np.ndarray) -> np.ndarray:
        """Mid-ranks of each row in the data set where row i appears weights[i] times."""
        group_weight = np.bincount(self.inverse, weights=weights, minlength=len(self.groups))
        below = np.cumsum(group_weight) - group_weight
        return (below + (group_weight + 1.0) / 2.0)[self.inverse]


def weighted_spearman(x: RankStructure, y: RankStructure, weights: np.ndarray) -> float:
    """Spearman rho of the data set in which row i is repeated weights[i] times (weights >= 0)."""
    total = weights.sum()
    if total < 2:
        return float("nan")
    rx, ry = x.midranks(weights), y.midranks(weights)
    mx, my = (weights * rx).sum() / total, (weights * ry).sum() / total
    dx, dy = rx - mx, ry - my
    vx, vy = (weights * dx * dx).sum(), (weights * dy * dy).sum()
    if vx <= 0 or vy <= 0:
        return float("nan")
    return float((weights * dx * dy).sum() / math.sqrt(vx * vy))


def cluster_draws(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n_clusters) draw counts: clusters drawn with replacement, n_clusters draws each.

    A row's weight in a resample is its cluster's count. Clusters (conversations or raters), not rows,
    because ratings within a conversation or by one rater are correlated; resampling single ratings
    would give intervals that are too narrow."""
    if n_clusters == 0:
        return np.zeros((n_boot, 0))
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot).astype(float)


def cluster_weights(cluster_codes: np.ndarray, n_boot: int, seed: int):
    """Yield `n_boot` row-weight vectors (one resample each): see `cluster_draws`."""
    cluster_codes = np.asarray(cluster_codes)
    n_clusters = int(cluster_codes.max()) + 1 if len(cluster_codes) else 0
    for counts in cluster_draws(n_clusters, n_boot, seed):
        yield counts[cluster_codes]


def percentile_ci(samples, level: float = 0.95) -> list[float | None]:
    samples = np.asarray(samples, float)
    samples = samples[np.isfinite(samples)]
    if len(samples) == 0:
        return [None, None]
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return [float(lo), float(hi)]


def json_metrics(values: dict, spearman_ci) -> dict:
    out = {name: finite_or_none(values[name]) for name in METRIC_NAMES}
    out.update({name: finite_or_none(values[name]) for name in OTHER_RULE_METRIC_NAMES if name in values})
    out["spearman_ci"] = list(spearman_ci)
    return out


def fold_spearman_draws(y: pd.DataFrame, scores: dict[str, pd.DataFrame], clusters: np.ndarray,
                        fold_ids: np.ndarray, n_boot: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Resampled fold-averaged Spearman per model and control (control average under "__overall__").

    All models and controls share the same resamples, which makes differences between models paired.
    The rating ranks of a resample are computed once and shared by every model."""
    controls = list(y.columns)
    n_clusters = int(clusters.max()) + 1 if len(clusters) else 0
    blocks = []  # (control, rows of one fold, rating ranks, {model: score ranks})
    for c in controls:
        t = y[c].to_numpy(float)
        for fold in np.unique(fold_ids):
            rows = np.flatnonzero((fold_ids == fold) & np.isfinite(t))
            ranked = {}
            for name, frame in scores.items():
                s = frame[c].to_numpy(float)[rows]
                if len(s) and np.ptp(s) > 0:  # constant scores rank nothing: no CI
                    ranked[name] = RankStructure(s)
            if ranked:
                blocks.append((c, rows, RankStructure(t[rows]), ranked))
    acc = {name: {c: np.zeros(n_boot) for c in controls} for name in scores}
    weight = {name: {c: np.zeros(n_boot) for c in controls} for name in scores}
    for b, draw in enumerate(cluster_draws(n_clusters, n_boot, seed)):
        for c, rows, y_rank, ranked in blocks:
            w = draw[clusters[rows]]
            total = w.sum()
            if total < 2:
                continue
            ry = y_rank.midranks(w)
            dy = ry - (w * ry).sum() / total
            wdy = w * dy
            vy = (wdy * dy).sum()
            if vy <= 0:
                continue
            for name, s_rank in ranked.items():
                rx = s_rank.midranks(w)
                dx = rx - (w * rx).sum() / total
                vx = (w * dx * dx).sum()
                if vx > 0:
                    acc[name][c][b] += total * (wdy * dx).sum() / np.sqrt(vx * vy)
                    weight[name][c][b] += total
    out = {}
    for name in scores:
        with np.errstate(all="ignore"):
            out[name] = {c: np.where(weight[name][c] > 0, acc[name][c] / weight[name][c], np.nan) for c in controls}
        stacked = np.vstack([out[name][c] for c in controls])
        finite = np.isfinite(stacked)
        with np.errstate(all="ignore"):
            mean = np.where(finite, stacked, 0).sum(axis=0) / finite.sum(axis=0)
        out[name]["__overall__"] = np.where(finite.any(axis=0), mean, np.nan)
    return out
