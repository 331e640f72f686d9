"""Live replay: new raters' own answers replayed in their order through the live posterior, on real data.

`sense7 evaluate --splits live_replay` (result["live_replay"]). What it answers: once a new rater has given k
answers, how much better does the live per-rater posterior (sense7.model.live_posterior, what the rater page's
live pre-fills serve) predict their other answers than the static prediction (the traits prior, or the
generic model for a rater without traits), the generic model and the rater's own running mean?

Honest by construction:
- Folds by rater (GroupKFold, the same assignment as the cold_start split for the same seed): the test raters
  have no rating in training. The personalized model is cloned and fitted on the training raters only;
  everything it holds (text model, trait prior, rater covariances, links) and the generic model (its text
  part, `PersonalizedRater.to_generic`, as a served version has it) and the global baselines come from
  the training fold.
- Each test rater's answers are put in the data's order (`answer_order`): neither WASSA nor ConvAbuse
  records when an answer was given, so `evaluate` replays them in the order the data set lists its ratings
  (ConvAbuse: example number; WASSA: its ratings file, by conversation id); items without such a listing
  go by conversation id and turn index. A rater's stream is their first min(max(ks), answers -
  min_targets) answers; every later answer is a target, the same targets at every k. The live posterior
  after k answers has seen the first k answers of the stream only, so a target is never in the stream
  (tests/research/test_live_replay.py changes targets and checks that no prediction of that rater moves).
- A rater takes part at k when they have at least k + min_targets answers ("n_raters" per k): more raters at
  small k. Within a k every model is scored on the same answers (the differences are paired);
  "curve_full_stream" keeps only the raters with the whole stream (max(ks) + min_targets answers or more),
  the same raters and targets at every k, to compare like with like across k.

Per k (after 0, 1, 2, 5, 10, 20 answers by default): MAE (median-rule level, as `evaluate`'s "mae"; the
running mean and median (the training folds' at k = 0) and the global mean as they are) averaged per rater
and then over raters (every rater counts once),
and Spearman of the expected rating within each fold's test raters pooled (as the cold_start split's),
averaged over folds and controls; 95% intervals resample raters, with the same resamples for every model so
the live-minus-other differences are paired. At k = 0 the live prediction is the static one (a rater with
no answer is served exactly that).
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.model_selection import GroupKFold

from sense7.research.metrics import cluster_draws, fold_spearman_draws, percentile_ci, spearman

REPLAY_SPLIT = "live_replay"
REPLAY_KS = (0, 1, 2, 5, 10, 20)
MIN_TARGETS = 5
# Models of the curve; the two global constants have an MAE but no Spearman.
# running_median: the rater's own median so far, the constant that minimizes their absolute error (on skewed
# scales such as ConvAbuse's, a much stronger MAE baseline than their mean).
REPLAY_MODELS = ("live", "static", "generic", "running_mean", "running_median", "global_mean", "majority")
RANKED_MODELS = ("live", "static", "generic", "running_mean", "running_median")
COMPARED = ("static", "running_mean", "running_median", "generic")  # live minus each, paired
ORDER = "conversation id (numerically when all ids are numbers), then turn index; data rows break ties"
LISTED_ORDER = "the order the data set lists its ratings (ConvAbuse: example number; WASSA: its ratings file)"


def answer_order(X: pd.DataFrame, listed: np.ndarray | None = None) -> np.ndarray:
    """Positions of X's rows in the order a rater's answers are replayed in: by `listed` (per row of X, where
    the data set lists the item's rating: `listing_rank`) when given, else by conversation id (as numbers
    when every id is one) and turn index (a whole-conversation rating first); data rows break ties."""
    position = np.arange(len(X))
    if listed is not None:
        return np.lexsort((position, np.asarray(listed, float)))
    conversation = X["conversation_id"].astype(str)
    numeric = pd.to_numeric(conversation, errors="coerce")
    first = numeric.to_numpy(float) if numeric.notna().all() else conversation.to_numpy()
    turn = pd.to_numeric(X["turn_index"], errors="coerce").fillna(-1).to_numpy(float) \
        if "turn_index" in X.columns else np.zeros(len(X))
    key = pd.DataFrame({"conversation": first, "turn": turn, "position": position})
    return key.sort_values(["conversation", "turn", "position"], kind="stable")["position"].to_numpy()


def listing_rank(X: pd.DataFrame, ratings: pd.DataFrame) -> np.ndarray:
    """Per row of X (items of sense7.data.items.build_items), where its first rating stands in `ratings` (a
    RatingData's ratings, in the data set's own order: ConvAbuse's example numbers, WASSA's ratings file)."""
    turn = pd.to_numeric(ratings["turn_index"], errors="coerce").fillna(-1).astype(int)
    keys = pd.MultiIndex.from_arrays([ratings["conversation_id"].astype(str), turn, ratings["rater_id"].astype(str)])
    first = pd.Series(np.arange(len(ratings)), index=keys).groupby(level=[0, 1, 2]).min()
    x_turn = pd.to_numeric(X["turn_index"], errors="coerce").fillna(-1).astype(int)
    wanted = pd.MultiIndex.from_arrays([X["conversation_id"].astype(str), x_turn, X["rater_id"].astype(str)])
    return first.reindex(wanted).to_numpy(float)


def replay_plan(X: pd.DataFrame, Y: pd.DataFrame, stream_length: int, min_targets: int,
                listed: np.ndarray | None = None) -> dict[str, tuple]:
    """{rater: (stream rows, target rows)} (positions in X) of every rater with at least min_targets rated
    answers, in `answer_order`: the stream is their first min(stream_length, answers - min_targets) answers,
    the targets all later ones (the same targets whatever k the stream is replayed to)."""
    order = answer_order(X, listed)
    rated = np.isfinite(Y.to_numpy(float)).any(axis=1)[order]
    order = order[rated]
    raters = X["rater_id"].astype(str).to_numpy()[order]
    plan = {}
    for rater in pd.unique(raters):
        rows = order[raters == rater]
        if len(rows) >= min_targets:
            length = min(stream_length, len(rows) - min_targets)
            plan[str(rater)] = (rows[:length], rows[length:])
    return plan


def _columns(X: pd.DataFrame, rows: np.ndarray) -> dict:
    """Item columns (sense7.data.items) of the rows of X, as the serving code takes them."""
    part = X.iloc[rows]
    columns = {name: part[name].tolist() for name in part.columns}
    columns.setdefault("assistant_id", [None] * len(rows))
    return columns


def _trait_table(X: pd.DataFrame, raters: list[str]) -> pd.DataFrame:
    """The trait_<name> values of `raters` (index rater_id as text), as X holds them on their rows."""
    names = [c for c in X.columns if str(c).startswith("trait_")]
    frame = X.assign(rater_id=X["rater_id"].astype(str))
    first = frame[frame["rater_id"].isin(raters)].groupby("rater_id", sort=False)[names].first()
    return first.reindex(raters)


def _fold_predictions(model, X, Y, train, plan: dict, raters: list[str], ks, controls) -> list[dict]:
    """Fit `model` on the training rows; per test rater and k, each model's predictions of their targets."""
    from sense7.model.bundle import ModelBundle
    from sense7.model.live_posterior import LivePredictor, LiveUnsupported, OnlinePosterior, check_live

    fitted = clone(model).fit(X.iloc[train].reset_index(drop=True), Y.iloc[train].reset_index(drop=True))
    try:
        check_live(fitted)
    except LiveUnsupported as exc:
        raise ValueError(f"live_replay: the personalized model cannot be updated live ({exc})") from None
    bundle = ModelBundle(version="live-replay", controls=list(fitted.controls_),
                         levels=[int(v) for v in fitted.levels_], generic=fitted.to_generic(),
                         personalized=fitted, known_raters=frozenset(str(r) for r in fitted.known_raters_))
    compiled = bundle.compile()
    live = LivePredictor(compiled)
    model_controls = list(compiled.controls)
    trained = Y.iloc[train].reindex(columns=controls).to_numpy(float)
    global_mean = np.nanmean(trained, axis=0)
    global_median = np.nanmedian(trained, axis=0)
    majority = np.array([pd.Series(col[np.isfinite(col)]).mode().min() for col in trained.T])
    traits = _trait_table(X, raters)
    table = compiled.rater_table(traits)
    out = []
    for rater in raters:
        stream, targets = plan[rater]
        stream_columns, target_columns = _columns(X, stream), _columns(X, targets)
        y_stream = Y.iloc[stream].reindex(columns=controls).to_numpy(float)
        as_served = Y.iloc[stream].reindex(columns=model_controls).to_numpy(float)
        static = compiled.predict(target_columns, table)
        generic = compiled.predict_generic(target_columns)
        if len(stream):  # (a rater with only min_targets answers has none: scored at k = 0 only)
            g = compiled.text_scores(stream_columns)
            shift = compiled.assistant_shifts(stream_columns["assistant_id"])
            directions = fitted.rater_direction_values(stream_columns)
        state = OnlinePosterior(fitted, rater, traits)
        seen = 0
        for k in (k for k in ks if k <= len(stream)):
            if k > seen:
                state.update_many(g[seen:k], as_served[seen:k], shift[seen:k],
                                  None if directions is None else directions[seen:k])
                seen = k
            served = live.predict_with(state, target_columns) if state.n_ratings else static
            answered = np.isfinite(y_stream[:k]).any(axis=0)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a control not rated yet: the global value
                running = np.where(answered, np.nanmean(y_stream[:k], axis=0), global_mean) if k else global_mean
                median = np.where(answered, np.nanmedian(y_stream[:k], axis=0), global_median) if k \
                    else global_median
            predictions = {}
            for name, prediction in (("live", served), ("static", static), ("generic", generic)):
                level = prediction.best("median")[0]
                expected = prediction.expected()
                index = [model_controls.index(c) if c in model_controls else -1 for c in controls]
                predictions[name] = (np.where(np.array(index) >= 0, level[:, index], np.nan),
                                     np.where(np.array(index) >= 0, expected[:, index], np.nan))
            n = len(targets)
            for name, value in (("running_mean", running), ("running_median", median), ("global_mean", global_mean),
                                ("majority", majority)):
                constant = np.broadcast_to(value, (n, len(controls)))
                predictions[name] = (constant, constant)
            out.append({"rater_id": rater, "k": k, "targets": targets, "predictions": predictions})
    return out


def live_replay(X: pd.DataFrame, Y: pd.DataFrame, model, n_folds: int = 5, seed: int = 0, n_boot: int = 1000,
                ks=REPLAY_KS, min_targets: int = MIN_TARGETS, progress: Callable[[str], None] | None = None,
                listed: np.ndarray | None = None, return_predictions: bool = False) -> dict:
    """The live replay curve of `model` (an unfitted PersonalizedRater with its parameters) on items (X, Y).

    Returns {"split": "live_replay", "cluster": "rater_id", "order", "ks", "stream_length", "min_targets",
    "n_folds", "n_raters" (all), "n_eligible" (min_targets answers or more), "n_full_stream", "n_targets"
    (target ratings), "curve" and "curve_full_stream": [{"k", "n_raters",
    "n_ratings", "mae": {model: {"value", "ci"}}, "spearman": {model: {"value", "ci"}} (live, static,
    generic, running_mean), "live_minus": {static, running_mean, generic: {"mae": {"value", "ci"},
    "spearman": {"value", "ci"}}}}], "after": the curve's entry at k = 5 when there is one}. Models:
    REPLAY_MODELS. return_predictions: also "predictions", one row per (k, target rating, model) (tests)."""
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 0:
        raise ValueError(f"live_replay: ks must be counts of answers >= 0, got {ks}")
    if min_targets < 1:
        raise ValueError(f"live_replay: min_targets must be at least 1, got {min_targets}")
    X, Y = X.reset_index(drop=True), Y.reset_index(drop=True).astype(float)
    controls = list(Y.columns)
    stream_length = ks[-1]
    plan = replay_plan(X, Y, stream_length, min_targets, listed)
    raters = X["rater_id"].astype(str).to_numpy()
    n_raters = len(np.unique(raters))
    base = {"split": REPLAY_SPLIT, "cluster": "rater_id", "order": ORDER if listed is None else LISTED_ORDER,
            "ks": ks, "stream_length": stream_length,
            "min_targets": min_targets, "n_raters": n_raters, "n_eligible": len(plan), "n_boot": n_boot}
    full = [r for r, (stream, _) in plan.items() if len(stream) == stream_length]
    if len(full) < 2:
        raise ValueError(f"live_replay: {len(full)} rater(s) have at least {stream_length + min_targets} answers "
                         f"({stream_length} replayed + {min_targets} to predict); at least 2 are needed")
    base["n_full_stream"] = len(full)
    folds = list(GroupKFold(n_splits=min(n_folds, n_raters), shuffle=True, random_state=seed)
                 .split(X, groups=raters))
    base["n_folds"] = len(folds)
    rows = []
    for fold, (train, test) in enumerate(folds):
        tested = [r for r in pd.unique(raters[test]) if r in plan]
        if tested:
            for entry in _fold_predictions(model, X, Y, train, plan, tested, ks, controls):
                entry["fold"] = fold
                rows.append(entry)
        if progress:
            progress(f"{REPLAY_SPLIT} fold {fold + 1}/{len(folds)}")
    curve = [_curve_point(k, [r for r in rows if r["k"] == k], Y, controls, n_boot, seed) for k in ks]
    # Like with like across k: only the raters whose whole stream was replayed, the same raters at every k.
    whole = set(full)
    curve_full = [_curve_point(k, [r for r in rows if r["k"] == k and r["rater_id"] in whole], Y, controls,
                               n_boot, seed) for k in ks]
    out = {**base, "n_targets": int(np.isfinite(Y.iloc[np.concatenate([t for _, t in plan.values()])]
                                                 .to_numpy(float)).sum()), "curve": curve,
           "curve_full_stream": curve_full}
    out["after"] = next((point for point in curve if point["k"] == 5), None)
    if return_predictions:
        out["predictions"] = _prediction_rows(rows, controls)
    return out


def _curve_point(k: int, rows: list[dict], Y: pd.DataFrame, controls: list[str], n_boot: int, seed: int) -> dict:
    """One k: per-rater MAE averaged over raters and fold-pooled Spearman, with paired rater-bootstrap CIs
    (no figures with fewer than 2 raters)."""
    if len(rows) < 2:
        none = {"value": None, "ci": [None, None]}
        return {"k": k, "n_raters": len(rows), "n_ratings": 0, "mae": {name: none for name in REPLAY_MODELS},
                "spearman": {name: none for name in RANKED_MODELS},
                "live_minus": {other: {"mae": none, "spearman": none} for other in COMPARED}}
    rater_codes = {row["rater_id"]: i for i, row in enumerate(rows)}
    draws = cluster_draws(len(rows), n_boot, seed)
    mae, mae_boot = {}, {}
    for name in REPLAY_MODELS:
        per_rater = []
        for row in rows:
            truth = Y.iloc[row["targets"]].reindex(columns=controls).to_numpy(float)
            level = np.asarray(row["predictions"][name][0], float)
            ok = np.isfinite(truth) & np.isfinite(level)
            per_rater.append(float(np.abs(level - truth)[ok].mean()) if ok.any() else np.nan)
        per_rater = np.asarray(per_rater)
        mae[name] = float(np.nanmean(per_rater))
        finite = np.isfinite(per_rater)
        w = draws * finite
        with np.errstate(all="ignore"):
            mae_boot[name] = (w * np.where(finite, per_rater, 0)).sum(axis=1) / w.sum(axis=1)
    # Spearman: every target rating of the k's raters, pooled within each fold (fold_spearman_draws).
    targets = np.concatenate([row["targets"] for row in rows])
    truth = Y.iloc[targets].reindex(columns=controls).reset_index(drop=True)
    clusters = np.concatenate([np.full(len(row["targets"]), rater_codes[row["rater_id"]]) for row in rows])
    fold_ids = np.concatenate([np.full(len(row["targets"]), row["fold"]) for row in rows])
    scores = {name: pd.DataFrame(np.concatenate([np.asarray(row["predictions"][name][1], float) for row in rows]),
                                 columns=controls) for name in RANKED_MODELS}
    rho = {name: _fold_spearman(truth, scores[name], fold_ids) for name in RANKED_MODELS}
    rho_boot = {name: values["__overall__"] for name, values in
                fold_spearman_draws(truth, scores, clusters, fold_ids, n_boot, seed).items()}

    def value(point, samples) -> dict:
        point = float(point) if point is not None and np.isfinite(point) else None
        return {"value": point, "ci": percentile_ci(samples) if point is not None else [None, None]}

    def difference(a, b):
        return None if a is None or b is None or not (np.isfinite(a) and np.isfinite(b)) else a - b

    return {
        "k": k, "n_raters": len(rows),
        "n_ratings": int(np.isfinite(truth.to_numpy(float)).sum()),
        "mae": {name: value(mae[name], mae_boot[name]) for name in REPLAY_MODELS},
        "spearman": {name: value(rho[name], rho_boot[name]) for name in RANKED_MODELS},
        "live_minus": {other: {"mae": value(difference(mae["live"], mae[other]), mae_boot["live"] - mae_boot[other]),
                               "spearman": value(difference(rho["live"], rho[other]),
                                                 rho_boot["live"] - rho_boot[other])}
                       for other in COMPARED},
    }


def _fold_spearman(truth: pd.DataFrame, score: pd.DataFrame, fold_ids: np.ndarray) -> float:
    """Spearman within each fold per control, averaged over folds (weight: ratings) and then controls;
    NaN where every fold's prediction is constant."""
    per_control = []
    for c in truth.columns:
        t, s = truth[c].to_numpy(float), score[c].to_numpy(float)
        total = weight = 0.0
        for fold in np.unique(fold_ids):
            ok = (fold_ids == fold) & np.isfinite(t) & np.isfinite(s)
            if ok.sum() >= 2 and np.ptp(s[ok]) > 0 and np.ptp(t[ok]) > 0:
                total += spearman(t[ok], s[ok]) * ok.sum()
                weight += ok.sum()
        if weight:
            per_control.append(total / weight)
    return float(np.mean(per_control)) if per_control else float("nan")


def _prediction_rows(rows: list[dict], controls: list[str]) -> pd.DataFrame:
    """One row per (rater, k, target item, control, model): the rater's fold, predicted level and score."""
    records = []
    for row in rows:
        for name, (level, score) in row["predictions"].items():
            for i, item in enumerate(row["targets"]):
                for j, control in enumerate(controls):
                    records.append((row["rater_id"], row["fold"], row["k"], int(item), control, name,
                                    float(level[i][j]), float(score[i][j])))
    return pd.DataFrame(records, columns=["rater_id", "fold", "k", "item", "control", "model", "level", "score"])
