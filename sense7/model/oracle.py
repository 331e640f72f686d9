"""The oracle: the exact rating distribution of synthetic data, from `SynthData.truth`.

It is the ceiling for any model on synthetic data: its expected rating is the best possible prediction of
an observed rating, so a model's rank correlation with the observed ratings is compared against the
oracle's (tests/model and scripts/bench_model.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

KEYS = ["conversation_id", "turn_index", "rater_id"]


class SynthOracle:
    """rater_blind: the truth for an average rater (SynthTruth.population_latent: perfect text and context,
    nothing of the rater), the ceiling of a generic model; what the oracle adds to it is rater-specific."""

    def __init__(self, truth, rater_blind: bool = False):
        self.truth = truth
        self.rater_blind = rater_blind

    def latent_means(self, X: pd.DataFrame, controls) -> pd.DataFrame:
        source = self.truth.population_latent if self.rater_blind else self.truth.latent
        latent = source.assign(turn_index=source["turn_index"].fillna(-1).astype(int))
        keys = X[KEYS].assign(turn_index=X["turn_index"].astype("Int64").fillna(-1).astype(int))
        merged = keys.merge(latent, on=KEYS, how="left")
        return merged[list(controls)].set_axis(X.index)

    def predict_proba(self, X: pd.DataFrame, controls) -> dict:
        cuts = np.concatenate([[-np.inf], self.truth.thresholds, [np.inf]])
        out = {}
        for control, means in self.latent_means(X, controls).items():
            cdf = norm.cdf((cuts[None, :] - means.to_numpy(dtype=float)[:, None]) / self.truth.noise_sd)
            out[control] = np.diff(cdf, axis=1)
        return out

    def predict_expected(self, X: pd.DataFrame, controls) -> pd.DataFrame:
        levels = np.arange(1, len(self.truth.thresholds) + 2)
        return pd.DataFrame({c: p @ levels for c, p in self.predict_proba(X, controls).items()}, index=X.index)


def compare_with_oracle(synth, n_folds: int = 5, models: dict | None = None) -> dict:
    """Spearman against the *observed* ratings on held-out conversations, for the oracle and each model.

    Folds group by conversation (known raters). In each test fold, every turn-level (item, control)
    rating is pooled into one Spearman correlation between the observed rating and the oracle's expected
    rating / each model's expected rating; the result is the mean over folds. Whole-conversation rows are
    left out (the oracle's truth for them is an average of turns, not the generating process).
    """
    from scipy.stats import spearmanr
    from sklearn.base import clone
    from sklearn.model_selection import GroupKFold

    from sense7.data.items import build_items
    from sense7.model.estimators import GenericRater, PersonalizedRater

    models = models or {"generic": GenericRater(), "personalized": PersonalizedRater()}
    X, Y = build_items(synth.rating_data(), synth.taxonomy)
    oracle = SynthOracle(synth.truth)
    turn_level = X["turn_index"].notna().to_numpy()
    scores = {name: [] for name in ["oracle", *models]}

    def pooled(pred: pd.DataFrame, rows) -> float:
        observed = Y.iloc[rows].to_numpy(dtype=float).ravel()
        predicted = pred[list(Y.columns)].to_numpy(dtype=float).ravel()
        rated = np.isfinite(observed)
        return float(spearmanr(predicted[rated], observed[rated])[0])

    for train, test in GroupKFold(n_splits=n_folds).split(X, groups=X["conversation_id"]):
        test = test[turn_level[test]]
        scores["oracle"].append(pooled(oracle.predict_expected(X.iloc[test], Y.columns), test))
        for name, model in models.items():
            fitted = clone(model).fit(X.iloc[train], Y.iloc[train])
            scores[name].append(pooled(fitted.predict_expected(X.iloc[test]), test))
    return {name: float(np.mean(values)) for name, values in scores.items()}
