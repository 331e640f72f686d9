"""What the ratings say about raters: who drives the variance, and how ratings move after a failure.

`variance_components`: per control, the shares of rating variance due to the rater, the conversation and
the rest (the turn, plus noise). Method-of-moments estimates for crossed or nested random effects
(the U-statistics of Gao & Owen, 2017, "Efficient moment calculations for variance components in large
unbalanced crossed random effects models"): for each grouping factor, the sum of squared differences of
all pairs of ratings in the same group has an expectation that is linear in the variance components, so
a small linear system gives them. O(n), no iterations, nothing to converge, fine on 10^5+ rows.

`after_events`: how a rater's ratings differ from their own baseline on the turn of a continuity failure
(their `continuity` rating <= 2) or an unmet expectation (`expectation_met` == 1, "no"), and on the next
1-3 turns of the same conversation, with confidence intervals from resampling raters.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sense7.research.metrics import percentile_ci

EVENTS = ("continuity_failure", "unmet_expectation")


def _pairs(codes: np.ndarray) -> float:
    """Number of unordered pairs of rows that share a code."""
    sizes = np.bincount(codes).astype(float)
    return float((sizes * (sizes - 1) / 2).sum())


def _pair_sq_diff(y: np.ndarray, codes: np.ndarray) -> float:
    """Sum over pairs in the same group of (y_i - y_j)^2, via n*sum(y^2) - (sum y)^2 per group."""
    n = np.bincount(codes).astype(float)
    s = np.bincount(codes, weights=y)
    s2 = np.bincount(codes, weights=y * y)
    return float((n * s2 - s * s).sum())


def _moment_variances(y: np.ndarray, rater: np.ndarray, conversation: np.ndarray) -> np.ndarray:
    """(rater, conversation, residual) variances from integer codes, clipped at 0.

    For a grouping factor f, E[sum over same-f pairs of (y_i - y_j)^2 / 2] = sigma_e^2 * P_f
    + sum_k sigma_k^2 * (P_f - P_fk), with P_f the number of same-f pairs and P_fk the pairs sharing both
    f and k; the same with "all pairs" in place of f. Three equations, three unknowns."""
    n = len(y)
    cell = np.unique(rater.astype(np.int64) * (int(conversation.max()) + 1) + conversation, return_inverse=True)[1]
    all_pairs = n * (n - 1) / 2
    p_r, p_c, p_rc = _pairs(rater), _pairs(conversation), _pairs(cell)
    A = np.array([
        [0.0, p_r - p_rc, p_r],
        [p_c - p_rc, 0.0, p_c],
        [all_pairs - p_r, all_pairs - p_c, all_pairs],
    ])
    b = np.array([_pair_sq_diff(y, rater), _pair_sq_diff(y, conversation), _pair_sq_diff(y, np.zeros(n, int))]) / 2
    scale = A.max() or 1.0
    return np.clip(np.linalg.lstsq(A / scale, b / scale, rcond=None)[0], 0.0, None)


def _shares(variance: np.ndarray) -> np.ndarray:
    total = variance.sum()
    return variance / total if total > 0 else np.full(len(variance), np.nan)


def _rater_resample(rater: np.ndarray, conversation: np.ndarray, draw: np.ndarray, rows_of: list[np.ndarray],
                    nested: np.ndarray):
    """Rows of a resample of raters. A rater drawn twice counts as two raters. Its conversations count
    as new ones too, except, for a conversation several raters rated, in the rater's first copy: keeping
    identical copies in one conversation would look like perfect agreement between two raters and
    inflate the conversation share."""
    rows = np.concatenate([rows_of[r] for r in draw])
    slot = np.repeat(np.arange(len(draw)), [len(rows_of[r]) for r in draw])
    first_copy = np.zeros(len(draw), bool)
    first_copy[np.unique(draw, return_index=True)[1]] = True
    conv = conversation[rows].astype(np.int64)
    shared = ~nested[conv] & first_copy[slot]
    conv = np.where(shared, conv, conv + (int(conversation.max()) + 1) * (slot + 1))
    return rows, slot, np.unique(conv, return_inverse=True)[1]


def variance_components(ratings: pd.DataFrame, controls: list[str] | None = None, n_boot: int = 200,
                        seed: int = 0) -> dict[str, dict]:
    """{control: {"n", "level", "variance": {rater, conversation, residual}, "share": {...},
    "share_ci": {...: [lo, hi]}}}; shares sum to 1.

    The residual is what neither the rater nor the conversation explain: turn-to-turn differences,
    rater-by-conversation interaction and noise. Negative moment estimates are set to 0.

    share_ci: 95% intervals from resampling raters (n_boot times; 0 = none). When each conversation has
    one rater (the native SENSE-7 design) this is the whole sampling design and the intervals covered
    the planted shares 90-97% of the time in simulation; when conversations are shared between raters
    (crossed, e.g. WASSA) they leave out the sampling of conversations and are too narrow (about 85%).
    """
    controls = controls or _controls(ratings)
    names = ("rater", "conversation", "residual")
    rng = np.random.default_rng(seed)
    out = {}
    for control in controls:
        rows = ratings[ratings["dimension"] == control]
        per_turn = rows["turn_index"].notna()
        # Ratings of single turns and of whole conversations are different quantities: decompose the
        # per-turn ones when there are any, else the conversation-level ones (e.g. WASSA).
        level = "turn" if per_turn.any() else "conversation"
        rows = rows[per_turn] if per_turn.any() else rows
        y = rows["rating"].to_numpy(float)
        if len(y) < 3:
            continue
        rater = pd.factorize(rows["rater_id"].astype(str))[0]
        conversation = pd.factorize(rows["conversation_id"].astype(str))[0]
        variance = _moment_variances(y, rater, conversation)
        entry = {
            "n": int(len(y)),
            "level": level,
            "n_raters": int(rater.max() + 1),
            "n_conversations": int(conversation.max() + 1),
            "variance": dict(zip(names, map(float, variance))),
            "share": dict(zip(names, map(float, _shares(variance)))),
            "share_ci": {name: [None, None] for name in names},
        }
        if n_boot and rater.max() >= 1:
            order = np.argsort(rater, kind="stable")
            rows_of = np.split(order, np.cumsum(np.bincount(rater))[:-1])
            raters_per_conv = pd.Series(rater).groupby(conversation).nunique().to_numpy()
            nested = raters_per_conv == 1
            boot = np.empty((n_boot, 3))
            for b in range(n_boot):
                draw = rng.integers(0, len(rows_of), len(rows_of))
                picked, slot, conv = _rater_resample(rater, conversation, draw, rows_of, nested)
                boot[b] = _shares(_moment_variances(y[picked], slot, conv))
            for i, name in enumerate(names):
                entry["share_ci"][name] = percentile_ci(boot[:, i])
        out[control] = entry
    return out


def _controls(ratings: pd.DataFrame, skip=("expectation_met",)) -> list[str]:
    return [c for c in pd.unique(ratings["dimension"]) if c not in skip]


def _turn_table(ratings: pd.DataFrame) -> pd.DataFrame:
    """One row per rated turn, ordered within each (conversation, rater), one column per dimension."""
    turns = ratings[ratings["turn_index"].notna()]
    wide = turns.pivot_table(index=["conversation_id", "rater_id", "turn_index"], columns="dimension",
                             values="rating", aggfunc="mean").reset_index()
    wide = wide.sort_values(["conversation_id", "rater_id", "turn_index"]).reset_index(drop=True)
    wide["position"] = wide.groupby(["conversation_id", "rater_id"]).cumcount()
    return wide


def after_events(ratings: pd.DataFrame, max_offset: int = 3, continuity_threshold: int = 2,
                 continuity_key: str = "continuity", expectation_key: str = "expectation_met",
                 n_boot: int = 1000, seed: int = 0) -> dict:
    """{event: {"n_events", "n_raters", "controls": {control: [{offset, mean_change, ci, n, vs_earlier}]}}}.

    mean_change at offset k: the rating of the k-th rated turn after the event turn (k = 0: the event turn
    itself) minus the rater's baseline, averaged over events. The baseline is the rater's mean on turns
    that are neither an event nor within `max_offset` turns after one, so it is not dragged down by the
    effect being measured. (For a continuity failure, the continuity control at offset 0 is low by
    definition; look at the others.)

    vs_earlier: the same, against the rater's mean on the *earlier turns of the same conversation*.
    Failures cluster in weak conversations, so the rater baseline mixes "this conversation was worse" with
    "the failure moved the rating"; the within-conversation comparison separates the two (events on a
    first turn have no earlier turns and are left out of it).
    """
    table = _turn_table(ratings)
    controls = [c for c in _controls(ratings, skip=(expectation_key,)) if c in table.columns]
    flags = {}
    if continuity_key in table.columns:
        flags["continuity_failure"] = (table[continuity_key] <= continuity_threshold).to_numpy()
    if expectation_key in table.columns:
        flags["unmet_expectation"] = (table[expectation_key] == 1).to_numpy()
    seq = pd.factorize(table["conversation_id"].astype(str) + "\x1f" + table["rater_id"].astype(str))[0]
    position = table["position"].to_numpy()
    rater_codes, rater_names = pd.factorize(table["rater_id"].astype(str))
    # Row lookup: (sequence, position) -> row, so "k turns later" is one vectorised lookup.
    index = pd.Series(np.arange(len(table)), index=pd.MultiIndex.from_arrays([seq, position]))
    out = {}
    for event, is_event in flags.items():
        event_rows = np.flatnonzero(is_event)
        affected = np.zeros(len(table), bool)
        for k in range(max_offset + 1):
            later = index.reindex(pd.MultiIndex.from_arrays([seq[event_rows], position[event_rows] + k]))
            affected[later.dropna().to_numpy(int)] = True
        result = {"n_events": int(len(event_rows)), "n_raters": int(len(np.unique(rater_codes[event_rows]))),
                  "controls": {}}
        for control in controls:
            y = table[control].to_numpy(float)
            clean = ~affected & np.isfinite(y)
            sums = np.bincount(rater_codes[clean], weights=y[clean], minlength=len(rater_names))
            counts = np.bincount(rater_codes[clean], minlength=len(rater_names))
            with np.errstate(all="ignore"):
                baseline = sums / counts  # NaN for a rater with no clean turn: their events are skipped
            earlier = _earlier_mean(y, seq)
            rows_out = []
            for k in range(max_offset + 1):
                later = index.reindex(pd.MultiIndex.from_arrays([seq[event_rows], position[event_rows] + k]))
                found = later.notna().to_numpy()
                rows = later.to_numpy()[found].astype(int)
                raters = rater_codes[event_rows[found]]
                delta = y[rows] - baseline[raters]
                ok = np.isfinite(delta)
                row = _mean_with_ci(delta[ok], raters[ok], len(rater_names), k, n_boot, seed)
                delta = y[rows] - earlier[event_rows[found]]
                ok = np.isfinite(delta)
                row["vs_earlier"] = _mean_with_ci(delta[ok], raters[ok], len(rater_names), k, n_boot, seed)
                del row["vs_earlier"]["offset"]
                rows_out.append(row)
            result["controls"][control] = rows_out
        out[event] = result
    return out


def _earlier_mean(y: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Per row: the mean of the same rater's ratings on the earlier turns of the same conversation (NaN
    for a first turn). Rows are ordered by position within each sequence."""
    finite = np.isfinite(y)
    frame = pd.DataFrame({"seq": seq, "y": np.where(finite, y, 0.0), "n": finite.astype(float)})
    sums = frame.groupby("seq")["y"].cumsum() - frame["y"]
    counts = frame.groupby("seq")["n"].cumsum() - frame["n"]
    with np.errstate(all="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def _mean_with_ci(delta: np.ndarray, raters: np.ndarray, n_raters: int, offset: int, n_boot: int,
                  seed: int) -> dict:
    """Mean change with a 95% CI from resampling raters (a rater's events are correlated)."""
    if len(delta) == 0:
        return {"offset": offset, "mean_change": None, "ci": [None, None], "n": 0}
    sums = np.bincount(raters, weights=delta, minlength=n_raters)
    counts = np.bincount(raters, minlength=n_raters).astype(float)
    present = np.flatnonzero(counts > 0)
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(len(present), np.full(len(present), 1 / len(present)), size=n_boot)
    with np.errstate(all="ignore"):
        boot = (draws @ sums[present]) / (draws @ counts[present])
    boot = boot[np.isfinite(boot)]
    lo, hi = np.percentile(boot, [2.5, 97.5]) if len(boot) else (np.nan, np.nan)
    return {"offset": offset, "mean_change": float(delta.mean()), "ci": [float(lo), float(hi)],
            "n": int(len(delta))}


def analyze(ratings: pd.DataFrame, n_boot: int = 1000, seed: int = 0, dataset: str = "", *, taxonomy) -> dict:
    """Both analyses as one JSON-able dict (what `sense7 analyze --json` writes).

    `taxonomy` (the study's): its expectation answer is not a control, and its controls come first in its
    order (controls it does not have follow in the data's order)."""
    expectation_key = taxonomy.expectation_key
    present = _controls(ratings, skip=(expectation_key,))
    controls = [c for c in taxonomy.controls if c in present] + [c for c in present if c not in taxonomy.controls]
    return {
        "dataset": dataset,
        "n_ratings": int(len(ratings)),
        "n_raters": int(ratings["rater_id"].nunique()),
        "variance_components": variance_components(ratings, controls, n_boot=min(n_boot, 200), seed=seed),
        "after_events": after_events(ratings, expectation_key=expectation_key, n_boot=n_boot, seed=seed),
    }
