"""Trivial rater models every evaluation reports next to the real ones.

They follow the same contract as `GenericRater` / `PersonalizedRater` (DESIGN.md): `fit(X, Y)` with X the
item frame of `sense7.data.items.build_items` and Y one float column per control (NaN = not rated);
`predict(X)` -> DataFrame of levels; `predict_proba(X)` -> {control: (n, len(levels_))}. The scale is
read from the training ratings (or given), never assumed, so the same classes serve 1-5 and 1-7 data.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator


def scale_from_ratings(Y: pd.DataFrame) -> np.ndarray:
    """The integer levels min..max observed over all controls."""
    values = Y.to_numpy(float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        raise ValueError("no ratings to fit on: every control is empty")
    return np.arange(int(np.floor(values.min())), int(np.ceil(values.max())) + 1)


def mean_to_proba(means: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """A distribution over levels whose expected value is `means` (mass split between the two
    neighbouring levels), so a mean predictor still yields a graded score for ranking metrics."""
    means = np.clip(np.asarray(means, float), levels[0], levels[-1])
    position = means - levels[0]
    lower = np.minimum(np.floor(position).astype(int), len(levels) - 1)
    upper_share = position - lower
    proba = np.zeros((len(means), len(levels)))
    rows = np.arange(len(means))
    proba[rows, lower] = 1.0 - upper_share
    upper = np.minimum(lower + 1, len(levels) - 1)
    proba[rows, upper] += upper_share
    return proba


class _BaselineRater(BaseEstimator):
    """Shared plumbing: controls and scale from Y, levels from the fitted per-row means/modes."""

    def _fit_scale(self, Y: pd.DataFrame) -> None:
        self.controls_ = list(Y.columns)
        self.levels_ = np.asarray(self.levels) if self.levels is not None else scale_from_ratings(Y)

    def _row_means(self, X: pd.DataFrame) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_proba(self, X: pd.DataFrame) -> dict[str, np.ndarray]:
        return {c: mean_to_proba(m, self.levels_) for c, m in self._row_means(X).items()}

    def predict_expected(self, X: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(self._row_means(X), index=X.index, columns=self.controls_)

    def predict(self, X: pd.DataFrame) -> pd.DataFrame:
        levels = {}
        for control, means in self._row_means(X).items():
            # Round half up to the nearest level on the scale.
            idx = np.clip(np.floor(np.asarray(means) - self.levels_[0] + 0.5).astype(int), 0, len(self.levels_) - 1)
            levels[control] = self.levels_[idx]
        return pd.DataFrame(levels, index=X.index, columns=self.controls_)


class MajorityClass(_BaselineRater):
    """Always the most frequent training level of each control (ties -> the lower level)."""

    def __init__(self, levels=None):
        self.levels = levels

    def fit(self, X: pd.DataFrame, Y: pd.DataFrame) -> "MajorityClass":
        self._fit_scale(Y)
        self.majority_ = {}
        for control in self.controls_:
            counts = Y[control].dropna().round().value_counts()
            top = counts[counts == counts.max()].index
            self.majority_[control] = float(min(top)) if len(counts) else float(self.levels_[0])
        return self

    def _row_means(self, X):
        return {c: np.full(len(X), self.majority_[c]) for c in self.controls_}

    def predict_proba(self, X):
        proba = {}
        for control in self.controls_:
            p = np.zeros((len(X), len(self.levels_)))
            p[:, int(np.searchsorted(self.levels_, self.majority_[control]))] = 1.0
            proba[control] = p
        return proba


class GlobalMean(_BaselineRater):
    """The training mean of each control for everybody."""

    def __init__(self, levels=None):
        self.levels = levels

    def fit(self, X: pd.DataFrame, Y: pd.DataFrame) -> "GlobalMean":
        self._fit_scale(Y)
        self.mean_ = {c: float(Y[c].mean()) if Y[c].notna().any() else float(self.levels_.mean())
                      for c in self.controls_}
        return self

    def _row_means(self, X):
        return {c: np.full(len(X), self.mean_[c]) for c in self.controls_}


class RaterMean(_BaselineRater):
    """Each rater's mean per control, shrunk toward the global mean by `pseudo_count` phantom ratings
    (so a rater with two ratings is mostly the global mean). Unknown raters get the global mean.

    Everything comes from the rows passed to `fit`; evaluation fits a clone per training fold, so a
    held-out rating never moves its rater's mean.
    """

    def __init__(self, pseudo_count: float = 5.0, levels=None):
        self.pseudo_count = pseudo_count
        self.levels = levels

    def fit(self, X: pd.DataFrame, Y: pd.DataFrame) -> "RaterMean":
        self._fit_scale(Y)
        if "rater_id" not in X.columns:
            raise ValueError("RaterMean needs a rater_id column in X")
        self.global_mean_ = {}
        self.rater_means_ = {}
        raters = X["rater_id"].astype(str).to_numpy()
        for control in self.controls_:
            y = Y[control].to_numpy(float)
            rated = np.isfinite(y)
            global_mean = float(y[rated].mean()) if rated.any() else float(self.levels_.mean())
            frame = pd.DataFrame({"rater": raters[rated], "y": y[rated]})
            stats = frame.groupby("rater")["y"].agg(["sum", "count"])
            shrunk = (stats["sum"] + self.pseudo_count * global_mean) / (stats["count"] + self.pseudo_count)
            self.global_mean_[control] = global_mean
            self.rater_means_[control] = shrunk
        return self

    def _row_means(self, X):
        raters = X["rater_id"].astype(str)
        return {
            c: raters.map(self.rater_means_[c]).fillna(self.global_mean_[c]).to_numpy(float)
            for c in self.controls_
        }


class RaterMedian(_BaselineRater):
    """Each rater's own median training level per control, with all its mass on that level (the lower
    middle level on an even count); unknown raters get the median of all training ratings. The baseline
    perspectivist benchmarks set personalized models against: "each annotator's usual label"."""

    def __init__(self, levels=None):
        self.levels = levels

    def fit(self, X: pd.DataFrame, Y: pd.DataFrame) -> "RaterMedian":
        self._fit_scale(Y)
        if "rater_id" not in X.columns:
            raise ValueError("RaterMedian needs a rater_id column in X")
        raters = X["rater_id"].astype(str).to_numpy()
        self.global_median_, self.rater_medians_ = {}, {}
        for control in self.controls_:
            y = Y[control].to_numpy(float)
            rated = np.isfinite(y)
            self.global_median_[control] = _lower_median(pd.Series(y[rated])) if rated.any() else float(
                self.levels_[len(self.levels_) // 2])
            self.rater_medians_[control] = pd.Series(y[rated]).groupby(raters[rated]).agg(_lower_median)
        return self

    def _row_means(self, X):
        raters = X["rater_id"].astype(str)
        return {c: raters.map(self.rater_medians_[c]).fillna(self.global_median_[c]).to_numpy(float)
                for c in self.controls_}

    def predict_proba(self, X):
        proba = {}
        for control, medians in self._row_means(X).items():
            p = np.zeros((len(X), len(self.levels_)))
            index = np.clip(np.searchsorted(self.levels_, medians), 0, len(self.levels_) - 1)
            p[np.arange(len(X)), index] = 1.0
            proba[control] = p
        return proba


def _lower_median(values: pd.Series) -> float:
    """The median of ratings as one of them (the lower of the two middle values on an even count)."""
    ordered = np.sort(np.asarray(values, float))
    return float(ordered[(len(ordered) - 1) // 2])
