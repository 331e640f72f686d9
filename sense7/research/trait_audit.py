"""Trait audit: how much each rater trait, and each questionnaire item, reduces cold-start error.

A study asks every rater its questionnaire so that a model can predict a *new* rater (cold start) from the
answers. Each question costs rater time; this audit says which ones earn it. Folds are grouped by rater
(evaluate's "cold_start" split), so a test rater's ratings never train the model and only the traits
speak for them.

Two methods:
- "permutation" (default, cheap): fit each fold's model once; on the test raters, shuffle one trait (or
  one questionnaire answer) across raters -- whole raters, so each rater's rows stay consistent -- and
  re-predict. The error that rises is what that trait was worth to the fitted model.
- "drop" (more honest, one refit per trait and fold): blank the trait for everyone, refit, re-predict.
  Correlated traits can stand in for each other here, so a trait only counts for what nothing else
  carries. A TIPI item's Big Five score needs both its items: dropping one drops the score.

Two levels, both reported:
- "features": the trait_* feature groups the model sees (a choice answer's one-hot columns are one
  group; each Big Five score is one);
- "items": the raw questionnaire answers (needs the raters frame): a TIPI item is permuted on its own
  and the Big Five scores recomputed with `sense7.data.dataset.trait_features`.

Error: MAE of the expected rating on the cold-start test rows, per rater and control. Importance = error
with the trait shuffled (or dropped) minus the baseline error: positive = the trait helps. Per rater it
is averaged over controls (and repeats); the mean over raters gets a CI resampling raters. Spearman
importance (baseline rho minus shuffled rho, within each test fold) is a point value alongside.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
from sklearn.base import clone

from sense7.data.dataset import NON_TRAIT_COLUMNS, ORDINAL_PROFILE_FIELDS, trait_features
from sense7.data.items import trait_columns
from sense7.research.evaluation import model_levels, make_folds
from sense7.research.metrics import cluster_draws, percentile_ci, spearman
from sense7.research.perspectivist import strict_json

METHODS = ("permutation", "drop")
Progress = Callable[[str], None]


@dataclass
class Unit:
    """One audited thing: a trait feature group ("feature") or a questionnaire answer ("item")."""

    level: str
    name: str
    columns: list[str]  # the trait_* columns it is (feature) or feeds (item)
    features: list[str] = field(default_factory=list)  # item: the feature groups it feeds


# ---------------------------------------------------------------------------------------------------
# What to audit


def feature_groups(columns: list[str], taxonomy) -> dict[str, list[str]]:
    """{group: trait_* columns}: a non-ordinal choice field's one-hot columns form one group (the model
    only ever sees them together), every other column is its own group."""
    onehot = {f"trait_{f.key}_{choice}": f.key for f in taxonomy.profile_fields
              if f.type == "choice" and f.key not in ORDINAL_PROFILE_FIELDS for choice in f.choices}
    groups: dict[str, list[str]] = {}
    for column in columns:
        groups.setdefault(onehot.get(column, column.removeprefix("trait_")), []).append(column)
    return groups


def _features_table(raw: pd.DataFrame, columns: list[str], taxonomy) -> pd.DataFrame:
    """trait_* features of raw answers (index rater_id), on exactly `columns`."""
    return trait_features(raw, taxonomy).add_prefix("trait_").reindex(columns=columns)


def item_units(raw: pd.DataFrame, columns: list[str], groups: dict[str, list[str]], taxonomy) -> list[Unit]:
    """One unit per raw answer column that feeds at least one trait column: found by blanking the answer
    and seeing which features change, so the mapping follows `trait_features`, whatever it computes."""
    base = _features_table(raw, columns, taxonomy)
    group_of = {c: g for g, cols in groups.items() for c in cols}
    units = []
    for item in raw.columns:
        if item in NON_TRAIT_COLUMNS:
            continue
        blanked = _features_table(raw.assign(**{item: np.nan}), columns, taxonomy)
        changed = [c for c in columns if not blanked[c].equals(base[c])]
        if changed:
            features = list(dict.fromkeys(group_of[c] for c in changed))
            units.append(Unit("item", str(item), changed, features))
    return units


# ---------------------------------------------------------------------------------------------------
# Predictions and errors


def _expected(fitted, X: pd.DataFrame, controls, data_levels) -> np.ndarray:
    """(rows, controls): the expected rating under the model's probabilities."""
    proba = fitted.predict_proba(X)
    out = np.empty((len(X), len(controls)))
    for j, c in enumerate(controls):
        p = np.asarray(proba[c], float)
        values = model_levels(fitted, p.shape[1], data_levels, c)
        out[:, j] = p @ values
    return out


def _rater_mae(y: np.ndarray, s: np.ndarray, codes: np.ndarray, n_raters: int) -> np.ndarray:
    """(raters, controls) mean absolute error of the expected rating; NaN where the rater did not rate."""
    error = np.abs(s - y)
    ok = np.isfinite(error)
    out = np.full((n_raters, y.shape[1]), np.nan)
    for j in range(y.shape[1]):
        sums = np.bincount(codes[ok[:, j]], weights=error[ok[:, j], j], minlength=n_raters)
        counts = np.bincount(codes[ok[:, j]], minlength=n_raters)
        out[counts > 0, j] = sums[counts > 0] / counts[counts > 0]
    return out


def _control_mean(values: np.ndarray) -> np.ndarray:
    """Mean of each row over its finite entries (NaN when none)."""
    finite = np.isfinite(values)
    with np.errstate(all="ignore"):
        return np.where(finite, values, 0).sum(axis=1) / finite.sum(axis=1)


def _fold_spearman(y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Spearman per control over the fold's test rows (NaN where undefined)."""
    out = np.full(y.shape[1], np.nan)
    for j in range(y.shape[1]):
        ok = np.isfinite(y[:, j]) & np.isfinite(s[:, j])
        out[j] = spearman(y[ok, j], s[ok, j])
    return out


def _nanmean(values) -> float:
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else float("nan")


# ---------------------------------------------------------------------------------------------------
# One fold


class _Fold:
    """A fitted cold-start fold: its test rows, test raters and baseline errors."""

    def __init__(self, model, X, Y, train, test, data_levels):
        self.model, self.train, self.test = model, train, test
        self.X_test = X.iloc[test].reset_index(drop=True)
        self.y = Y.to_numpy(float)[test]
        self.controls, self.data_levels = list(Y.columns), data_levels
        self.raters = np.array(sorted(self.X_test["rater_id"].astype(str).unique()), dtype=object)
        self.codes = pd.Index(self.raters).get_indexer(self.X_test["rater_id"].astype(str))
        self.fitted = clone(model).fit(X.iloc[train].reset_index(drop=True), Y.iloc[train].reset_index(drop=True))
        _freeze_text(self.fitted, self.X_test)
        self.base = self.errors(self.fitted, self.X_test)

    def errors(self, fitted, X_test) -> tuple[np.ndarray, np.ndarray]:
        """(per rater x control MAE, per control Spearman) of `fitted` on these test rows."""
        s = _expected(fitted, X_test, self.controls, self.data_levels)
        return _rater_mae(self.y, s, self.codes, len(self.raters)), _fold_spearman(self.y, s)

    def with_traits(self, table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
        """The test rows with `columns` replaced by the per-rater `table`."""
        X_new = self.X_test.copy()
        X_new[columns] = table.loc[self.raters[self.codes], columns].to_numpy(float)
        return X_new


def _freeze_text(fitted, X_test: pd.DataFrame) -> None:
    """Shuffling traits leaves the text of the test rows as it is: a rater model that scores text apart
    (sense7's `text_scores`) gets its test-fold text scores computed once instead of on every shuffle.
    The fitted model is the audit's own clone and only ever predicts copies of these rows."""
    text_scores = getattr(fitted, "text_scores", None)
    if callable(text_scores):
        scores = text_scores(X_test)
        fitted.text_scores = lambda X: scores if len(X) == len(scores) else text_scores(X)


def _rng(seed: int, fold: int, repeat: int, name: str) -> np.random.Generator:
    """Keyed by the unit's name, so a feature and the item it equals (e.g. gender) get the same shuffle and
    the order units are audited in does not matter."""
    return np.random.default_rng([seed, fold, repeat, zlib.crc32(name.encode())])


def _permuted_table(unit: Unit, fold: _Fold, traits: pd.DataFrame, raw: pd.DataFrame | None,
                    columns: list[str], taxonomy, rng) -> pd.DataFrame:
    """The test raters' trait table with the unit shuffled across them (whole raters)."""
    order = rng.permutation(len(fold.raters))
    if unit.level == "feature":
        table = traits.loc[fold.raters, columns].copy()
        table[unit.columns] = table[unit.columns].to_numpy()[order]
        return table
    answers = raw.reindex(fold.raters).copy()
    answers[unit.name] = answers[unit.name].to_numpy()[order]
    table = traits.loc[fold.raters, columns].copy()
    table[unit.columns] = _features_table(answers, columns, taxonomy)[unit.columns].to_numpy(float)
    return table


def _dropped(unit: Unit, X: pd.DataFrame, raw: pd.DataFrame | None, columns: list[str], taxonomy) -> pd.DataFrame:
    """X with the unit blanked for every rater (missing traits are what the model learns without)."""
    X_new = X.copy()
    if unit.level == "feature":
        X_new[unit.columns] = np.nan
        return X_new
    table = _features_table(raw.assign(**{unit.name: np.nan}), columns, taxonomy)
    X_new[unit.columns] = table.reindex(X["rater_id"].astype(str).to_numpy())[unit.columns].to_numpy(float)
    return X_new


# ---------------------------------------------------------------------------------------------------
# The audit


def _data_levels(Y: pd.DataFrame, taxonomy) -> np.ndarray:
    """The rating scale, as `evaluate` sets it: the observed range, widened to the taxonomy's scale when
    every control is one of the taxonomy's."""
    observed = Y.to_numpy(float)[np.isfinite(Y.to_numpy(float))]
    if not len(observed):
        raise ValueError("no ratings to audit")
    lo, hi = int(observed.min()), int(observed.max())
    if set(Y.columns) <= set(taxonomy.controls):
        lo, hi = min(lo, 1), max(hi, taxonomy.levels)
    return np.arange(lo, hi + 1)


def _summary(unit: Unit, importance: np.ndarray, spearman_drop: float, draws: np.ndarray) -> dict:
    finite = np.isfinite(importance)
    values = np.where(finite, importance, 0.0)
    with np.errstate(all="ignore"):
        boot = (draws @ values) / (draws @ finite.astype(float))
    out = {"name": unit.name, "columns": [c.removeprefix("trait_") for c in unit.columns],
           "importance": _nanmean(importance), "ci": percentile_ci(boot), "importance_spearman": spearman_drop,
           "n_raters": int(finite.sum())}
    if unit.level == "item":
        out["features"] = unit.features
    return out


def trait_audit(X: pd.DataFrame, Y: pd.DataFrame, model, taxonomy, n_folds: int = 5, n_repeats: int = 3,
                seed: int = 0, n_boot: int = 1000, method: str = "permutation", raters: pd.DataFrame | None = None,
                progress: Progress | None = None) -> dict:
    """Cold-start importance of each trait feature group and (with `raters`, the raw answers indexed by
    rater_id) each questionnaire item, for `model` (an unfitted estimator, cloned per fold; or a catalog
    name such as "personalized").

    Returns strict JSON: {"method", "split": "cold_start", "n_folds", "n_repeats", "seed", "n_boot",
    "n_raters", "controls", "error": "mae_expected",
    "baseline": {"mae", "spearman"},          # cold-start error without any shuffling
    "features": [U], "items": [U],            # sorted by importance, largest first; items [] without raters
    "unaudited_items": [raw answers that feed no trait column], "seconds"}
      U = {name, columns, importance, ci, importance_spearman, n_raters (+ features for items)}.
    """
    from sense7.model.catalog import CATALOG

    if method not in METHODS:
        raise ValueError(f"method {method!r}: choose from {', '.join(METHODS)}")
    started = time.perf_counter()
    model = CATALOG.get(model).factory() if isinstance(model, str) else model
    X, Y = X.reset_index(drop=True), Y.reset_index(drop=True).astype(float)
    data_levels = _data_levels(Y, taxonomy)
    columns = trait_columns(X)
    rater_ids = X["rater_id"].astype(str)
    traits = X[columns].groupby(rater_ids.to_numpy()).first()
    groups = feature_groups(columns, taxonomy)
    units = [Unit("feature", name, cols) for name, cols in groups.items()]
    raw, unaudited = None, []
    if raters is not None and len(raters.columns) and columns:
        raw = raters.copy()
        raw.index = raw.index.astype(str)
        raw = raw.reindex(traits.index)
        items = item_units(raw, columns, groups, taxonomy)
        units += items
        fed = {u.name for u in items}
        unaudited = [str(c) for c in raw.columns if c not in NON_TRAIT_COLUMNS and c not in fed]

    all_raters = pd.Index(sorted(traits.index))
    importance = {(u.level, u.name): np.full(len(all_raters), np.nan) for u in units}
    spearman_sum = {key: 0.0 for key in importance}
    spearman_weight = {key: 0.0 for key in importance}
    spearman_fold = {}  # this fold's Spearman decrease per unit
    base_mae = np.full(len(all_raters), np.nan)
    base_rho, base_weight = 0.0, 0.0
    folds = make_folds(X, "cold_start", n_folds, seed)
    for k, (train, test) in enumerate(folds):
        fold = _Fold(model, X, Y, train, test, data_levels)
        where = all_raters.get_indexer(fold.raters)
        base_err, base_s = fold.base
        base_mae[where] = _control_mean(base_err)
        if np.isfinite(base_s).any():
            base_rho, base_weight = base_rho + _nanmean(base_s) * len(test), base_weight + len(test)
        for unit in units:
            # An item that is exactly one feature group (e.g. gender and its one-hot columns) gets the same
            # shuffle, hence the same result: taken over instead of predicted again.
            same = ("feature", unit.name) if unit.level == "item" and groups.get(unit.name) == unit.columns else None
            if same is None:
                deltas, rho_drop = _unit_effect(unit, fold, k, X, Y, raw, traits, columns, taxonomy, method,
                                                n_repeats, seed)
            else:
                deltas, rho_drop = importance[same][where], spearman_fold[same]
            importance[(unit.level, unit.name)][where] = deltas
            spearman_fold[(unit.level, unit.name)] = rho_drop
            if np.isfinite(rho_drop):
                spearman_sum[(unit.level, unit.name)] += rho_drop * len(test)
                spearman_weight[(unit.level, unit.name)] += len(test)
        if progress:
            progress(f"trait audit fold {k + 1}/{len(folds)}")

    draws = cluster_draws(len(all_raters), n_boot, seed)
    summaries = {"feature": [], "item": []}
    for unit in units:
        key = (unit.level, unit.name)
        rho = spearman_sum[key] / spearman_weight[key] if spearman_weight[key] else float("nan")
        summaries[unit.level].append(_summary(unit, importance[key], rho, draws))
    for level in summaries:
        summaries[level].sort(key=lambda u: -u["importance"] if np.isfinite(u["importance"]) else np.inf)  # NaN last
    return strict_json({
        "method": method, "split": "cold_start", "cluster": "rater_id", "model": type(model).__name__,
        "n_folds": len(folds), "n_repeats": n_repeats if method == "permutation" else None, "seed": seed,
        "n_boot": n_boot, "n_raters": int(len(all_raters)), "controls": list(Y.columns), "error": "mae_expected",
        "baseline": {"mae": _nanmean(base_mae), "spearman": base_rho / base_weight if base_weight else None},
        "features": summaries["feature"], "items": summaries["item"], "unaudited_items": unaudited,
        "seconds": round(time.perf_counter() - started, 3),
    })


def _unit_effect(unit: Unit, fold: _Fold, k: int, X, Y, raw, traits, columns, taxonomy, method: str,
                 n_repeats: int, seed: int) -> tuple[np.ndarray, float]:
    """(per test rater: error increase averaged over controls and repeats, Spearman decrease)."""
    base_err, base_s = fold.base
    if method == "drop":  # refit on the same rows without the unit: same test raters, same order
        errors, s = _Fold(fold.model, _dropped(unit, X, raw, columns, taxonomy), Y, fold.train, fold.test,
                          fold.data_levels).base
        return _control_mean(errors - base_err), _nanmean(base_s - s)
    deltas, drops = [], []
    for repeat in range(n_repeats):
        table = _permuted_table(unit, fold, traits, raw, columns, taxonomy, _rng(seed, k, repeat, unit.name))
        errors, s = fold.errors(fold.fitted, fold.with_traits(table, unit.columns))
        deltas.append(_control_mean(errors - base_err))
        drops.append(_nanmean(base_s - s))
    return np.mean(deltas, axis=0), _nanmean(drops)


def audit_rating_data(data, taxonomy, model="personalized", **options) -> dict:
    """`trait_audit` on a `RatingData` (what `sense7 evaluate --trait-audit` runs): items built with
    `build_items`, raw answers from `data.raters`."""
    from sense7.data.items import build_items

    X, Y = build_items(data, taxonomy)
    return trait_audit(X, Y, model, taxonomy, raters=data.raters, **options)
