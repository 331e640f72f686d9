"""Cross-validated evaluation of rater models, with the guarantees a researcher needs to trust it.

- Known raters: folds grouped by conversation, so no conversation text is both trained on and tested.
- Cold start: folds grouped by rater, so a test rater has no rating in training. (When several raters
  rate the same conversation, other raters' ratings of it may be in training: a new rater joining a
  project meets material others have rated.)
- Every model is cloned and fitted per training fold: whatever it learns (vectorizers, scalers, rater
  effects) comes from training rows only.
- Controls and the rating scale come from the data (SENSE-7 style 1-5 with eight controls, WASSA 1-7 with
  one), never from constants.
- Metrics are computed within each test fold and averaged over folds (weighted by the fold's ratings).
  Pooling out-of-fold predictions instead would credit or punish a model for differences *between*
  folds: a training-set mean is anti-correlated with the held-out fold's mean, so a constant predictor
  would show a negative Spearman on pooled folds.
- Confidence intervals resample clusters (conversations for known raters, raters for cold start), and
  personalized minus generic is a paired bootstrap on the same resamples.

`evaluate` returns plain JSON-able data; `sense7.research.report` draws it and `sense7 evaluate` prints it.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pandas as pd
from joblib import Parallel, delayed
from sklearn.base import clone
from sklearn.model_selection import GroupKFold

from sense7.model.catalog import CATALOG, Catalog
from sense7.model.decision import decide
from sense7.research.metrics import (
    METRIC_NAMES,
    finite_or_none,
    fold_spearman_draws,
    json_metrics,
    macro_metrics,
    percentile_ci,
    point_metrics,
)
from sense7.research.live_replay import MIN_TARGETS, REPLAY_KS, REPLAY_SPLIT, listing_rank, live_replay
from sense7.research.perspectivist import (RaterTurns, perspectivist_metrics, repeated_gain,
                                           spearman_gain_sums, strict_json)

SPLITS = {"known_rater": "conversation_id", "cold_start": "rater_id"}
# Every split `evaluate` takes: the cross-validated ones, and the live replay of new raters' answers in their
# order (sense7.research.live_replay; its result is result["live_replay"], not under result["splits"]).
SPLIT_NAMES = (*SPLITS, REPLAY_SPLIT)
# Bins of "how many training ratings did this rater have in this fold" for the personalization-gain curve.
TRAIN_COUNT_EDGES = (0, 1, 5, 10, 20, 50, 100, 200, 500)

Progress = Callable[[str], None]


def __getattr__(name: str):
    # MODEL_ORDER used to be a constant here; the model kinds now live in sense7.model.catalog.
    if name == "MODEL_ORDER":
        return CATALOG.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_models(names=None, catalog: Catalog | None = None) -> dict:
    """Fresh estimators of the catalog's model kinds (default: all of sense7.model.catalog.CATALOG), or of
    the chosen subset, in catalog order (baselines first). Unknown names: UnknownModelError (a ValueError)
    listing the catalog's names."""
    return (catalog or CATALOG).make(names)


def make_folds(X: pd.DataFrame, split: str, n_folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train_rows, test_rows) positional indices; groups never straddle train and test."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    groups = X[SPLITS[split]].astype(str).to_numpy()
    n_groups = len(np.unique(groups))
    if n_groups < 2:
        raise ValueError(f"split {split!r} needs at least two distinct {SPLITS[split]} values, got {n_groups}")
    folds = GroupKFold(n_splits=min(n_folds, n_groups), shuffle=True, random_state=seed)
    return [(train, test) for train, test in folds.split(X, groups=groups)]


def model_levels(model, n_columns: int, data_levels, control: str):
    """The rating value of each predict_proba column: the model's fitted levels_ when it exposes them,
    else the data's scale (None when neither fits, so the caller can fall back)."""
    levels = getattr(model, "levels_", None)
    if isinstance(levels, dict):
        levels = levels.get(control)
    if levels is not None and len(levels) == n_columns:
        return np.asarray(levels, float)
    if data_levels is None:
        return None
    if len(data_levels) == n_columns:
        return np.asarray(data_levels, float)
    who = type(model).__name__ if model is not None else "the model"
    raise ValueError(f"{who}.predict_proba gives {n_columns} columns for {control!r}, "
                     f"but the data's scale has {len(data_levels)} levels and the model exposes no levels_")


def _fit_predict(model, X, Y, train, test):
    """One fold: a fresh clone fitted on the training rows, its levels and probabilities on the test rows."""
    fitted = clone(model).fit(X.iloc[train].reset_index(drop=True), Y.iloc[train].reset_index(drop=True))
    X_test = X.iloc[test].reset_index(drop=True)
    proba = fitted.predict_proba(X_test)
    values = {c: model_levels(fitted, np.asarray(proba[c]).shape[1], None, c) for c in Y.columns}
    return fitted.predict(X_test), proba, values


def cross_val_predictions(model, X, Y, folds, data_levels, progress: Progress | None = None, label: str = "",
                          n_jobs: int = 1, with_proba: bool = False):
    """Out-of-fold predicted levels and scores (expected rating under predict_proba) for every row.

    Also returns, per row, how many training rows its rater had in the fold that predicted it.
    with_proba: also return {control: (rows, len(data_levels)) out-of-fold probabilities on the data's
    scale} (the perspectivist metrics need distributions, not only the expected rating).
    n_jobs > 1 fits folds in parallel processes (joblib); results are identical to n_jobs=1.
    """
    levels = pd.DataFrame(np.nan, index=Y.index, columns=Y.columns)
    scores = levels.copy()
    probabilities = {c: np.zeros((len(X), len(data_levels))) for c in Y.columns} if with_proba else None
    train_counts = np.zeros(len(X), int)
    raters = X["rater_id"].astype(str).to_numpy()
    jobs = (delayed(_fit_predict)(model, X, Y, train, test) for train, test in folds)
    outputs = Parallel(n_jobs=n_jobs, return_as="generator")(jobs) if n_jobs != 1 else (
        _fit_predict(model, X, Y, train, test) for train, test in folds)
    for k, ((train, test), (predicted, proba, values)) in enumerate(zip(folds, outputs)):
        for control in Y.columns:
            levels.iloc[test, levels.columns.get_loc(control)] = np.asarray(predicted[control], float)
            p = np.asarray(proba[control], float)
            column_levels = values[control] if values[control] is not None else model_levels(
                None, p.shape[1], data_levels, control)
            scores.iloc[test, scores.columns.get_loc(control)] = p @ column_levels
            if with_proba:
                probabilities[control][test] = _on_scale(p, column_levels, data_levels)
        per_rater = pd.Series(raters[train]).value_counts()
        train_counts[test] = pd.Series(raters[test]).map(per_rater).fillna(0).to_numpy(int)
        if progress:
            progress(f"{label} fold {k + 1}/{len(folds)}")
    if with_proba:
        return levels, scores, train_counts, probabilities
    return levels, scores, train_counts


def _on_scale(p: np.ndarray, column_levels: np.ndarray, data_levels) -> np.ndarray:
    """Probabilities over the model's levels moved onto the data's scale (a fold's model may know fewer
    levels than the data has; a level outside the scale counts as its nearest end)."""
    out = np.zeros((len(p), len(data_levels)))
    index = np.clip(np.rint(np.asarray(column_levels) - data_levels[0]).astype(int), 0, len(data_levels) - 1)
    for j, k in enumerate(index):
        out[:, k] += p[:, j]
    return out


def fold_metrics(y_true, y_level, score, fold_ids, levels) -> dict:
    """Each metric computed within every fold, averaged with the fold's number of ratings as weight.
    Folds where a metric is undefined (e.g. Spearman of a constant prediction) are left out."""
    sums = {name: 0.0 for name in METRIC_NAMES}
    weights = {name: 0.0 for name in METRIC_NAMES}
    for fold in np.unique(fold_ids):
        rows = fold_ids == fold
        values = point_metrics(y_true[rows], y_level[rows], score[rows], levels)
        for name, value in values.items():
            if np.isfinite(value):
                sums[name] += value * rows.sum()
                weights[name] += rows.sum()
    return {name: sums[name] / weights[name] if weights[name] else float("nan") for name in METRIC_NAMES}


def _train_count_bins(y, scores, train_counts, raters, fold_ids) -> list[dict]:
    """Metrics by how many training ratings the rater had: the personalization-gain curve."""
    edges = list(TRAIN_COUNT_EDGES) + [np.inf]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        rows = (train_counts >= lo) & (train_counts < hi)
        if rows.sum() < 3:
            continue
        label = str(lo) if hi == lo + 1 else (f"{lo}+" if not np.isfinite(hi) else f"{lo}-{int(hi) - 1}")
        entry = {"bin": label, "lo": int(lo), "n_items": int(rows.sum()),
                 "n_raters": int(len(np.unique(raters[rows]))), "models": {}}
        for name, frame in scores.items():
            rhos, maes = [], []
            for c in y.columns:
                t = y[c].to_numpy(float)[rows]
                s = frame[c].to_numpy(float)[rows]
                ok = np.isfinite(t) & np.isfinite(s)
                if ok.sum() >= 3:
                    m = fold_metrics(t[ok], s[ok], s[ok], fold_ids[rows][ok], None)
                    rhos.append(m["spearman"])
                    maes.append(m["mae"])
            rhos = [r for r in rhos if np.isfinite(r)]
            entry["models"][name] = {"spearman": float(np.mean(rhos)) if rhos else None,
                                     "mae_expected": float(np.mean(maes)) if maes else None}
        p, g = entry["models"].get("personalized", {}), entry["models"].get("generic", {})
        entry["gain_spearman"] = (p["spearman"] - g["spearman"]
                                  if p.get("spearman") is not None and g.get("spearman") is not None else None)
        out.append(entry)
    return out


def evaluate_items(X: pd.DataFrame, Y: pd.DataFrame, models: dict, splits=tuple(SPLITS), n_folds: int = 5,
                   seed: int = 0, n_boot: int = 1000, dataset: str = "", progress: Progress | None = None,
                   n_jobs: int = 1, scale=None, repeats: int = 1, replay_ks=REPLAY_KS,
                   replay_min_targets: int = MIN_TARGETS, replay_order=None) -> dict:
    """`evaluate` on an item frame (X, Y) already built by `sense7.data.items.build_items`.

    Returns {"dataset", "n_ratings", "n_items", "n_raters", "n_conversations", "controls", "levels", ...,
    "splits": {split: {
        "models": {name: {"overall": M, "per_control": {control: M}}},   M = {spearman, accuracy, qwk, mae,
                                                  mae_mode, accuracy_median, spearman_ci: [lo, hi]}
            accuracy and QWK: the predicted distribution's mode; mae: its median (the point that minimizes
            the expected absolute distance); mae_mode and accuracy_median: the other rule, for comparison
        "paired": {"personalized_minus_generic": {"spearman", "ci", "per_control"}},
        "confusion": {name: {control: counts[true level][predicted level]}},
        "by_train_ratings": [{bin, n_items, n_raters, models: {name: {spearman, mae_expected}},
                              gain_spearman}],   # by the rater's number of ratings in the training fold
        "rater_train_ratings": [mean training ratings per rater, sorted],
        "perspectivist": LeWiDi 2025's ANAD and Wasserstein, sense7's per-rater distance and 0-1 Wasserstein,
                         the per-rater personalization gain (distances on the median; ANAD also on the mode) (see sense7.research.perspectivist.perspectivist_metrics),
                         and with repeats > 1 "personalization_gain_repeated": the within-rater Spearman gain
                         over `repeats` fold assignments (seeds seed, seed + 1, ...; perspectivist.repeated_gain)
                         and "model_spearman": {generic, personalized: {mean, per_assignment}},
        "fit_predict_seconds": {name: seconds}, "n_folds", "cluster"}}}
    With "live_replay" among `splits`: result["live_replay"], the live posterior's curve over new raters'
    answers replayed in order (sense7.research.live_replay.live_replay: models["personalized"], the same folds
    by rater as cold_start, after replay_ks answers, at least replay_min_targets answers to predict; answers
    in the order of `replay_order`, per row of X, else by conversation id and turn index).
    Undefined values (e.g. Spearman of a constant prediction) are None, so the result is strict JSON.
    `scale`: the rating levels (e.g. a taxonomy's 1..7); default the range of the observed ratings.
    `repeats`: fold assignments for the within-rater gain (the generic and personalized models are
    cross-validated once more per extra assignment); every other figure is the first assignment's.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    unknown = [s for s in splits if s not in SPLIT_NAMES]
    if unknown:
        raise ValueError(f"unknown split(s) {', '.join(map(repr, unknown))}; choose from {', '.join(SPLIT_NAMES)}")
    if REPLAY_SPLIT in splits and "personalized" not in models:
        raise ValueError(f"the {REPLAY_SPLIT} split replays the personalized model: include it in the models")
    X, Y = X.reset_index(drop=True), Y.reset_index(drop=True).astype(float)
    observed = Y.to_numpy(float)[np.isfinite(Y.to_numpy(float))]
    if len(observed) == 0:
        raise ValueError("no ratings to evaluate")
    lo, hi = int(observed.min()), int(observed.max())
    if scale is not None:
        lo, hi = min(lo, int(min(scale))), max(hi, int(max(scale)))
    data_levels = np.arange(lo, hi + 1)
    result = {
        "dataset": dataset,
        "n_ratings": int(np.isfinite(Y.to_numpy(float)).sum()),
        "n_items": int(len(X)),
        "n_raters": int(X["rater_id"].nunique()),
        "n_conversations": int(X["conversation_id"].nunique()),
        "controls": list(Y.columns),
        "levels": [int(v) for v in data_levels],
        "n_folds": n_folds,
        "seed": seed,
        "n_boot": n_boot,
        "splits": {},
    }
    raters = X["rater_id"].astype(str).to_numpy()
    turns = RaterTurns(X, Y)
    if REPLAY_SPLIT in splits:
        result["live_replay"] = strict_json(live_replay(X, Y, models["personalized"], n_folds, seed, n_boot,
                                                        replay_ks, replay_min_targets, progress,
                                                        listed=replay_order))
    for split in (s for s in splits if s in SPLITS):
        folds = make_folds(X, split, n_folds, seed)
        levels, scores, counts, medians = {}, {}, None, {}  # levels: the mode; medians: the median
        seconds, turn_distances = {}, {}
        for name, model in models.items():
            started = time.perf_counter()
            levels[name], scores[name], counts, proba = cross_val_predictions(
                model, X, Y, folds, data_levels, progress, label=f"{split} {name}", n_jobs=n_jobs, with_proba=True)
            seconds[name] = round(time.perf_counter() - started, 3)
            # Reduced right away: one distance per multi-rater turn instead of every row's probabilities.
            turn_distances[name] = turns.wasserstein(Y, proba, data_levels)
            medians[name] = pd.DataFrame({c: data_levels[decide(proba[c], "median")].astype(float)
                                          for c in Y.columns})
        clusters = pd.factorize(X[SPLITS[split]].astype(str))[0]
        fold_ids = np.empty(len(X), int)
        for k, (_, test) in enumerate(folds):
            fold_ids[test] = k
        boot = fold_spearman_draws(Y, scores, clusters, fold_ids, n_boot, seed)
        split_out = {"models": {}, "paired": {}, "confusion": {}, "n_folds": len(folds),
                     "cluster": SPLITS[split], "fit_predict_seconds": seconds}
        for name in models:
            per_control = {}
            split_out["confusion"][name] = {}
            for c in Y.columns:
                t = Y[c].to_numpy(float)
                ok = np.isfinite(t) & np.isfinite(levels[name][c].to_numpy(float))
                values = fold_metrics(t[ok], levels[name][c].to_numpy(float)[ok],
                                      scores[name][c].to_numpy(float)[ok], fold_ids[ok], data_levels)
                # Decision rules (sense7.model.decision): accuracy and QWK on the mode, MAE on the median
                # (it minimizes the expected absolute distance); each also under the other rule.
                by_median = fold_metrics(t[ok], medians[name][c].to_numpy(float)[ok],
                                         scores[name][c].to_numpy(float)[ok], fold_ids[ok], data_levels)
                values["mae_mode"], values["mae"] = values["mae"], by_median["mae"]
                values["accuracy_median"] = by_median["accuracy"]
                per_control[c] = json_metrics(values, percentile_ci(boot[name][c]))
                split_out["confusion"][name][c] = _confusion(t[ok], levels[name][c].to_numpy(float)[ok], data_levels)
            overall = json_metrics(macro_metrics(per_control), percentile_ci(boot[name]["__overall__"]))
            split_out["models"][name] = {"overall": overall, "per_control": per_control}
        if "personalized" in models and "generic" in models:
            split_out["paired"]["personalized_minus_generic"] = _paired(split_out["models"], boot, list(Y.columns))
        split_out["by_train_ratings"] = _train_count_bins(Y, scores, counts, raters, fold_ids)
        per_rater = pd.Series(counts).groupby(raters).mean()
        split_out["rater_train_ratings"] = sorted(float(v) for v in per_rater)
        split_out["perspectivist"] = perspectivist_metrics(Y, raters, medians, scores, turn_distances, turns,
                                                           fold_ids, len(data_levels), n_boot, seed,
                                                           mode_levels=levels)
        if repeats > 1 and "personalized" in models and "generic" in models:
            first = {name: split_out["models"][name]["overall"]["spearman"] for name in ("generic", "personalized")}
            split_out["perspectivist"]["personalization_gain_repeated"] = _repeated_gain(
                X, Y, models, split, n_folds, seed, repeats, scores, fold_ids, data_levels, n_boot, progress, n_jobs,
                first)
        result["splits"][split] = split_out
    return result


def _repeated_gain(X, Y, models, split, n_folds, seed, repeats, scores, fold_ids, data_levels, n_boot, progress,
                   n_jobs, first_spearman: dict) -> dict | None:
    """The within-rater gain over `repeats` fold assignments: the first one's scores (already computed), then
    generic and personalized cross-validated on each further assignment (seed + 1, ...). Also each model's
    overall Spearman per assignment (`first_spearman`: the first one's, as reported)."""
    codes = pd.factorize(X["rater_id"].astype(str))[0]
    n_raters = int(codes.max()) + 1 if len(codes) else 0
    sums = [spearman_gain_sums(Y, scores["personalized"], scores["generic"], codes, fold_ids, n_raters)]
    spearmans = {name: [value] for name, value in first_spearman.items()}
    seeds = [seed + r for r in range(repeats)]
    for extra in seeds[1:]:
        folds = make_folds(X, split, n_folds, extra)
        ids = np.empty(len(X), int)
        for k, (_, test) in enumerate(folds):
            ids[test] = k
        again = {}
        for name in ("generic", "personalized"):
            levels, again[name], _ = cross_val_predictions(models[name], X, Y, folds, data_levels, progress,
                                                           label=f"{split} {name} (assignment {extra})", n_jobs=n_jobs)
            spearmans[name].append(_overall_spearman(Y, levels, again[name], ids, data_levels))
        sums.append(spearman_gain_sums(Y, again["personalized"], again["generic"], codes, ids, n_raters))
    out = repeated_gain(sums, seeds, n_boot, seed)
    if out is not None:
        out["model_spearman"] = {name: {"mean": float(np.mean([v for v in values if v is not None]))
                                        if any(v is not None for v in values) else None, "per_assignment": values}
                                 for name, values in spearmans.items()}
    return strict_json(out)


def _overall_spearman(Y: pd.DataFrame, levels: pd.DataFrame, scores: pd.DataFrame, fold_ids: np.ndarray,
                      data_levels) -> float | None:
    """A model's "overall" Spearman as evaluate_items reports it: within each fold, per control, averaged."""
    per_control = {}
    for c in Y.columns:
        t = Y[c].to_numpy(float)
        ok = np.isfinite(t) & np.isfinite(levels[c].to_numpy(float))
        per_control[c] = fold_metrics(t[ok], levels[c].to_numpy(float)[ok], scores[c].to_numpy(float)[ok],
                                      fold_ids[ok], data_levels)
    return finite_or_none(macro_metrics(per_control)["spearman"])


def _paired(model_results: dict, boot: dict, controls: list[str]) -> dict:
    def diff(block_p, block_g):
        p, g = block_p["spearman"], block_g["spearman"]
        return None if p is None or g is None else p - g

    pers, gen = model_results["personalized"], model_results["generic"]
    out = {"spearman": diff(pers["overall"], gen["overall"]),
           "ci": percentile_ci(boot["personalized"]["__overall__"] - boot["generic"]["__overall__"]),
           "per_control": {}}
    for c in controls:
        out["per_control"][c] = {"spearman": diff(pers["per_control"][c], gen["per_control"][c]),
                                 "ci": percentile_ci(boot["personalized"][c] - boot["generic"][c])}
    return out


def _confusion(y_true, y_level, levels) -> list[list[int]]:
    """Counts: row = true level, column = predicted level, both over the data's scale."""
    idx_t = np.clip(np.asarray(y_true, int) - int(levels[0]), 0, len(levels) - 1)
    idx_p = np.clip(np.asarray(y_level, int) - int(levels[0]), 0, len(levels) - 1)
    counts = np.bincount(idx_t * len(levels) + idx_p, minlength=len(levels) ** 2)
    return counts.reshape(len(levels), len(levels)).tolist()


def evaluate(data, splits=("known_rater", "cold_start"), n_folds: int = 5, seed: int = 0, n_boot: int = 1000,
             models: dict | None = None, dataset: str | None = None, progress: Progress | None = None,
             n_jobs: int = 1, repeats: int = 1, *, taxonomy, replay_ks=REPLAY_KS,
             replay_min_targets: int = MIN_TARGETS) -> dict:
    """Cross-validate `models` (default: every kind of sense7.model.catalog.CATALOG) on a
    `sense7.data.dataset.RatingData`.

    `taxonomy` (the study's) orders the controls and, when every rated control is one of its controls,
    sets the scale 1..taxonomy.levels (else the scale is the data's)."""
    from sense7.data.items import build_items

    X, Y = build_items(data, taxonomy)
    # The live replay's answer order: where the data set lists each item's rating.
    order = listing_rank(X, data.ratings) if REPLAY_SPLIT in splits else None
    scale = None
    if set(Y.columns) <= set(taxonomy.controls):
        scale = range(1, taxonomy.levels + 1)
    name = dataset if dataset is not None else getattr(data, "name", "") or ""
    return evaluate_items(X, Y, models if models is not None else default_models(), splits, n_folds, seed,
                          n_boot, dataset=name, progress=progress, n_jobs=n_jobs, scale=scale, repeats=repeats,
                          replay_ks=replay_ks, replay_min_targets=replay_min_targets, replay_order=order)
