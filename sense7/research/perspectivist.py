"""Perspectivist metrics: how well a model predicts *each rater*, and the spread of ratings over raters.

Two families, kept apart so that nothing claims to be what it is not:
- the LeWiDi 2025 task's own scores (`sense7.research.lewidi`): ANAD over turns (|predicted - rated| / K,
  averaged over each turn's raters, then over turns) and the soft-label Wasserstein distance in levels on
  turns with several raters; comparable with published figures;
- sense7's summaries, which answer other questions:
- per rater, the mean normalized absolute distance |predicted level - rated level| / (K - 1) over the
  rater's ratings and controls (0 = every rating hit, 1 = always at the opposite end of the scale);
  summarized over raters, so a model that serves a few prolific raters well cannot hide the rest;
- where several raters rated the same turn, the Wasserstein-1 distance between the predicted and the
  observed distribution of their ratings on the ordinal scale, normalized to [0, 1]: does the model know
  how much raters disagree, not only the average;
- per rater, the personalization gain (personalized against generic), on within-rater Spearman and on the
  normalized distance: who gains, and how many.

Everything is computed from out-of-fold predictions (`sense7.research.evaluation.cross_val_predictions`),
and the result is strict JSON (undefined values are None).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sense7.research.lewidi import item_anad
from sense7.research.metrics import finite_or_none, cluster_draws, percentile_ci

QUANTILES = (10, 25, 50, 75, 90)
# What makes two ratings "of the same turn". The rated assistant is part of it: in WASSA both people of a
# conversation rate it (turn NA), but each rates the *other* person, so they do not rate the same thing.
TURN_KEY = ("conversation_id", "turn_index", "assistant_id")


# ---------------------------------------------------------------------------------------------------
# The metrics on arrays


def normalized_distance(y_true, y_level, n_levels: int) -> np.ndarray:
    """|predicted level - rated level| / (K - 1), elementwise (NaN where either is missing)."""
    return np.abs(np.asarray(y_level, float) - np.asarray(y_true, float)) / max(n_levels - 1, 1)


def wasserstein_ordinal(p, q) -> np.ndarray:
    """Wasserstein-1 between distributions over the same K ordered levels, normalized to [0, 1]:
    sum over levels of |CDF_p - CDF_q| / (K - 1). Rows of 2-d inputs are separate pairs."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    n_levels = p.shape[-1]
    return np.abs(np.cumsum(p - q, axis=-1)).sum(axis=-1) / max(n_levels - 1, 1)


def within_group_spearman(groups, y, score) -> pd.Series:
    """Spearman of y and score within each group (index: group); NaN where a side is constant or the
    group has fewer than two rows. Pearson correlation of mid-ranks, i.e. scipy's Spearman with ties,
    vectorized over groups instead of one scipy call per rater."""
    frame = pd.DataFrame({"g": np.asarray(groups), "y": np.asarray(y, float), "s": np.asarray(score, float)})
    frame = frame[np.isfinite(frame["y"]) & np.isfinite(frame["s"])]
    ranks = frame.groupby("g")[["y", "s"]].rank()
    centered = ranks - ranks.groupby(frame["g"]).transform("mean")
    sums = pd.DataFrame({"cov": centered["y"] * centered["s"], "vy": centered["y"] ** 2,
                         "vs": centered["s"] ** 2}).groupby(frame["g"]).sum()
    with np.errstate(all="ignore"):
        rho = sums["cov"] / np.sqrt(sums["vy"] * sums["vs"])
    return rho.where((sums["vy"] > 1e-12) & (sums["vs"] > 1e-12))


# ---------------------------------------------------------------------------------------------------
# Turns rated by several raters


class RaterTurns:
    """The rows of an item frame grouped into turns rated by two or more raters, per control.

    Built once per evaluation; `wasserstein` then reduces a model's (n, K) probabilities to one distance
    per multi-rater turn, so the caller keeps a few numbers per model instead of every probability."""

    def __init__(self, X: pd.DataFrame, Y: pd.DataFrame):
        keys = pd.DataFrame({
            "conversation_id": X["conversation_id"].astype(str).to_numpy(),
            "turn_index": pd.Series(X["turn_index"]).astype("Int64").fillna(-1).astype(int).to_numpy(),
            "assistant_id": (X["assistant_id"].fillna("").astype(str).to_numpy() if "assistant_id" in X
                             else np.full(len(X), "")),
        })
        turn = keys.groupby(list(TURN_KEY), sort=False).ngroup().to_numpy()
        self.conversation_codes = pd.factorize(keys["conversation_id"])[0]
        self.n_conversations = int(self.conversation_codes.max()) + 1 if len(X) else 0
        self.blocks = {}  # control -> (rows, turn code 0..T-1 per row, conversation code per turn)
        self.all_blocks = {}  # the same over every rated turn, one rater or more (LeWiDi's ANAD)
        for c in Y.columns:
            rated = np.flatnonzero(np.isfinite(Y[c].to_numpy(float)))
            counts = np.bincount(turn[rated], minlength=turn.max() + 1 if len(turn) else 0)
            self.blocks[c] = self._block(turn, rated[counts[turn[rated]] >= 2])
            self.all_blocks[c] = self._block(turn, rated)

    def _block(self, turn: np.ndarray, rows: np.ndarray):
        codes = np.unique(turn[rows], return_inverse=True)[1]
        first = np.zeros(codes.max() + 1 if len(codes) else 0, int)
        first[codes] = rows  # any row of the turn names its conversation
        return rows, codes, self.conversation_codes[first]

    def n_turns(self) -> dict[str, int]:
        return {c: int(len(conv)) for c, (_, _, conv) in self.blocks.items()}

    def wasserstein(self, Y: pd.DataFrame, proba: dict[str, np.ndarray], data_levels) -> dict[str, np.ndarray]:
        """{control: distance per multi-rater turn}: the mean of the raters' predicted probability vectors
        against the empirical distribution of their ratings."""
        data_levels = np.asarray(data_levels)
        out = {}
        for c, (rows, codes, conv) in self.blocks.items():
            n_turns, n_levels = len(conv), len(data_levels)
            if not n_turns:
                out[c] = np.zeros(0)
                continue
            size = np.bincount(codes, minlength=n_turns)[:, None].astype(float)
            predicted = np.zeros((n_turns, n_levels))
            np.add.at(predicted, codes, np.asarray(proba[c], float)[rows])
            level = np.clip(np.rint(Y[c].to_numpy(float)[rows] - data_levels[0]).astype(int), 0, n_levels - 1)
            observed = np.zeros((n_turns, n_levels))
            np.add.at(observed, (codes, level), 1.0)
            out[c] = wasserstein_ordinal(predicted / size, observed / size)
        return out


# ---------------------------------------------------------------------------------------------------
# Summaries with confidence intervals


def _quantiles(values: np.ndarray) -> dict:
    if not len(values):
        return {f"p{q}": None for q in QUANTILES}
    return {f"p{q}": float(v) for q, v in zip(QUANTILES, np.percentile(values, QUANTILES))}


def _row_mean(values: np.ndarray) -> np.ndarray:
    """Mean of each row over its finite entries; NaN for a row with none (np.nanmean, without the warning)."""
    finite = np.isfinite(values)
    with np.errstate(all="ignore"):
        return np.where(finite, values, 0).sum(axis=1) / finite.sum(axis=1)


def _rater_summary(values: np.ndarray, n_boot: int, seed: int, gain: bool = False) -> dict | None:
    """Mean over raters with a CI resampling raters, and the distribution over raters. For a gain also
    the share of raters who gain and the sorted values (the report's histogram)."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    boot = cluster_draws(len(values), n_boot, seed) @ values / len(values)
    out = {"mean": float(values.mean()), "ci": percentile_ci(boot), "quantiles": _quantiles(values),
           "n_raters": int(len(values))}
    if gain:  # many raters can tie (same predicted levels from both models): gain and loss both shown
        out["share_gain"] = float(np.mean(values > 0))
        out["share_loss"] = float(np.mean(values < 0))
        out["values"] = sorted(float(v) for v in values)
    return out


def _per_rater_distance(Y: pd.DataFrame, levels: pd.DataFrame, rater_codes: np.ndarray, n_raters: int,
                        n_levels: int) -> np.ndarray:
    """Each rater's mean normalized distance over their rated cells (all controls pooled)."""
    d = normalized_distance(Y.to_numpy(float), levels.to_numpy(float), n_levels)
    ok = np.isfinite(d)
    sums = np.bincount(rater_codes, weights=np.where(ok, d, 0).sum(axis=1), minlength=n_raters)
    counts = np.bincount(rater_codes, weights=ok.sum(axis=1), minlength=n_raters)
    with np.errstate(all="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _spearman_gain(Y: pd.DataFrame, personalized: pd.DataFrame, generic: pd.DataFrame, rater_codes: np.ndarray,
                   fold_ids: np.ndarray, n_raters: int) -> np.ndarray:
    """Per rater: within-rater Spearman of personalized minus generic, computed within each test fold and
    averaged over the rater's folds and controls (weighted by ratings; NaN where never defined).

    Within a fold, not over the rater's pooled out-of-fold predictions: a rater's fitted leniency changes
    from fold to fold, and it is learned from the rater's *other* ratings, so pooled across folds it runs
    against the held-out ratings and would make personalization look bad at ranking (with a handful of
    ratings per rater, as in WASSA, strongly so)."""
    total, weight = spearman_gain_sums(Y, personalized, generic, rater_codes, fold_ids, n_raters)
    with np.errstate(all="ignore"):
        return np.where(weight > 0, total / weight, np.nan)


def spearman_gain_sums(Y: pd.DataFrame, personalized: pd.DataFrame, generic: pd.DataFrame, rater_codes: np.ndarray,
                       fold_ids: np.ndarray, n_raters: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-rater within-rater Spearman gain (see _spearman_gain) as its two sums per rater: the
    rating-weighted sum of the per-fold gains and the weights. Sums of several fold assignments add up to
    the gain over all of them (`repeated_gain`)."""
    n_folds = int(fold_ids.max()) + 1 if len(fold_ids) else 1
    groups = rater_codes * n_folds + fold_ids
    total, weight = np.zeros(n_raters), np.zeros(n_raters)
    for c in Y.columns:
        y = Y[c].to_numpy(float)
        diff = (within_group_spearman(groups, y, personalized[c].to_numpy(float))
                - within_group_spearman(groups, y, generic[c].to_numpy(float))).dropna()
        codes = diff.index.to_numpy(int)
        size = np.bincount(groups[np.isfinite(y)], minlength=n_raters * n_folds)[codes]
        np.add.at(total, codes // n_folds, diff.to_numpy(float) * size)
        np.add.at(weight, codes // n_folds, size)
    return total, weight


def repeated_gain(sums: list[tuple[np.ndarray, np.ndarray]], seeds: list[int], n_boot: int, seed: int) -> dict | None:
    """The within-rater Spearman gain over several fold assignments (repeated cross-validation): each
    rater's per-fold gains pooled over every assignment (`sums`: spearman_gain_sums per assignment), then
    the mean over raters with a CI resampling raters, as for one assignment. With a handful of ratings a
    rater, a test fold holds two or three of theirs, and one assignment's gain swings with where they fell.

    {"repeats", "seeds", "per_assignment": [mean over raters of each assignment alone], mean, ci, ...}"""
    total = sum(t for t, _ in sums)
    weight = sum(w for _, w in sums)
    with np.errstate(all="ignore"):
        values = np.where(weight > 0, total / weight, np.nan)
        per_assignment = [float(np.nanmean(np.where(w > 0, t / w, np.nan))) if (w > 0).any() else None
                          for t, w in sums]
    summary = _rater_summary(values, n_boot, seed, gain=True)
    if summary is None:
        return None
    return {"repeats": len(sums), "seeds": list(seeds), "per_assignment": per_assignment, **summary}


def _turn_summary(values_per_control: dict[str, np.ndarray], blocks: dict, n_conversations: int,
                  draws: np.ndarray) -> dict | None:
    """Mean over turns per control, and their mean over controls ("mean"), each with a CI resampling
    conversations (the same resamples for every model and control). `blocks`: RaterTurns.blocks or
    .all_blocks, whose turns the values are of."""
    per_control, boot_means = {}, []
    for c, values in values_per_control.items():
        if not len(values):
            continue
        conv = blocks[c][2]
        sums = np.bincount(conv, weights=values, minlength=n_conversations)
        counts = np.bincount(conv, minlength=n_conversations).astype(float)
        with np.errstate(all="ignore"):
            boot = (draws @ sums) / (draws @ counts)
        boot_means.append(boot)
        per_control[c] = {"mean": float(values.mean()), "ci": percentile_ci(boot), "n_turns": int(len(values))}
    if not per_control:
        return None
    overall_boot = _row_mean(np.vstack(boot_means).T)
    return {"mean": float(np.mean([b["mean"] for b in per_control.values()])), "ci": percentile_ci(overall_boot),
            "n_turns": max(b["n_turns"] for b in per_control.values()), "per_control": per_control}


def _turn_anad(Y: pd.DataFrame, levels: pd.DataFrame, turns: RaterTurns, n_levels: int) -> dict[str, np.ndarray]:
    """{control: LeWiDi's per-item ANAD of every rated turn} (sense7.research.lewidi.item_anad)."""
    out = {}
    for c, (rows, codes, _) in turns.all_blocks.items():
        out[c] = item_anad(codes, Y[c].to_numpy(float)[rows], levels[c].to_numpy(float)[rows], n_levels)
    return out


def perspectivist_metrics(Y: pd.DataFrame, raters: np.ndarray, levels: dict[str, pd.DataFrame],
                          scores: dict[str, pd.DataFrame], turn_distances: dict[str, dict[str, np.ndarray]],
                          turns: RaterTurns, fold_ids: np.ndarray, n_levels: int, n_boot: int, seed: int,
                          mode_levels: dict[str, pd.DataFrame] | None = None) -> dict:
    """One split's perspectivist block of the `evaluate` result. `levels`: the predicted level each distance
    is computed on (evaluate passes the median); `mode_levels`: also ANAD on these (evaluate: the mode).

    {"n_raters", "turn_key", "multi_rater_turns": {control: n},
     "models": {name: {
        "lewidi_anad": T,         the task's ANAD over every rated turn (|d| / K; sense7.research.lewidi)
        "lewidi_anad_mode": T | None,    the same on `mode_levels`
        "lewidi_wasserstein": T | None,  the task's soft-label Wasserstein (in levels) on multi-rater turns
        "rater_mean_distance": {mean, ci, quantiles: {p10..p90}, n_raters},   sense7's: per rater |d| / (K-1)
        "wasserstein_01": T | None}},    sense7's: the same Wasserstein divided by K - 1
       T = {mean, ci, n_turns, per_control: {control: {mean, ci, n_turns}}}; means over controls
     "personalization_gain": {"distance": G, "spearman": G} | None}
       G = {mean, ci, quantiles, n_raters, share_gain, values} over raters (None where undefined for all);
       positive = personalization helps (generic distance - personalized distance; Spearman p - g).
    Rater means resample raters; turn means (ANAD, Wasserstein) resample conversations."""
    rater_codes, rater_names = pd.factorize(pd.Series(raters).astype(str))
    n_raters = len(rater_names)
    conv_draws = cluster_draws(turns.n_conversations, n_boot, seed)
    distances = {name: _per_rater_distance(Y, levels[name], rater_codes, n_raters, n_levels) for name in levels}
    out = {"n_raters": int(n_raters), "turn_key": list(TURN_KEY), "multi_rater_turns": turns.n_turns(),
           "models": {}}
    for name in levels:
        normalized = turn_distances[name]
        # wasserstein_01 is sum |CDF gap| / (K - 1); the task's distance is the same sum, undivided.
        in_levels = {c: v * max(n_levels - 1, 1) for c, v in normalized.items()}
        out["models"][name] = {
            "lewidi_anad": _turn_summary(_turn_anad(Y, levels[name], turns, n_levels), turns.all_blocks,
                                         turns.n_conversations, conv_draws),
            "lewidi_anad_mode": None if mode_levels is None else _turn_summary(
                _turn_anad(Y, mode_levels[name], turns, n_levels), turns.all_blocks, turns.n_conversations, conv_draws),
            "lewidi_wasserstein": _turn_summary(in_levels, turns.blocks, turns.n_conversations, conv_draws),
            "rater_mean_distance": _rater_summary(distances[name], n_boot, seed),
            "wasserstein_01": _turn_summary(normalized, turns.blocks, turns.n_conversations, conv_draws),
        }
    out["personalization_gain"] = None
    if "personalized" in levels and "generic" in levels:
        spearman_gain = _spearman_gain(Y, scores["personalized"], scores["generic"], rater_codes, fold_ids, n_raters)
        out["personalization_gain"] = {
            "distance": _rater_summary(distances["generic"] - distances["personalized"], n_boot, seed, gain=True),
            "spearman": _rater_summary(spearman_gain, n_boot, seed, gain=True),
        }
    return strict_json(out)


def strict_json(value):
    """Floats NaN/inf -> None, recursively: the result must survive json.dumps(allow_nan=False)."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return finite_or_none(value)
    if isinstance(value, np.integer):
        return int(value)
    return value
