"""The gain curve of live pre-fills: how much better a rater's predictions get with each of their own answers.

A rating's live prediction used the rater's earlier answers (sense7.model.live, sense7.rater_page.live); the
static one is what the served version gives without them (for a new rater: the traits prior), the generic
one ignores the rater. `gain_curve` scores the three by the number of the rater's own earlier ratings
(0, 1-2, 3-5, 6-10, 11-20, more), with intervals that resample raters (their ratings are correlated) and the
same resamples for every model, so the live-minus-static differences are paired.

`simulate` is the model-level check on planted data: a synthetic study whose raters differ strongly in
leniency and in how much they follow the text (slopes); a version is trained on some raters, and each new
rater answers their turns in order while every next turn is predicted live from the answers so far
(`scripts/bench_live.py` prints it; tests/model/test_live_gain.py holds it to the issue's targets).
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from sense7.research.metrics import cluster_draws, percentile_ci

BINS = (("0", 0, 0), ("1-2", 1, 2), ("3-5", 3, 5), ("6-10", 6, 10), ("11-20", 11, 20), ("21+", 21, None))
MODELS = ("live", "static", "generic")


def bin_of(own_ratings) -> np.ndarray:
    """The curve's bin label of each count of own earlier ratings."""
    n = np.asarray(own_ratings, dtype=float)
    out = np.full(len(n), None, dtype=object)
    for label, low, high in BINS:
        out[(n >= low) & ((n <= high) if high is not None else True)] = label
    return out


def _value(point: float, samples: np.ndarray) -> dict:
    return {"value": float(point) if np.isfinite(point) else None, "ci": percentile_ci(samples)}


def relative_gain(live: np.ndarray, static: np.ndarray) -> np.ndarray:
    """1 - live / static per resample; a resample whose static MAE is 0 has no relative gain (NaN, which the
    percentile CI leaves out) rather than a division warning."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(static > 0, 1 - live / np.where(static > 0, static, 1), np.nan)


def gain_curve(frame: pd.DataFrame, n_boot: int = 500, seed: int = 0) -> dict:
    """frame: one row per (rating, control) with rater_id, own_ratings (the rater's earlier answers the live
    prediction used) and abs_error_<model> for live, static and generic (|most likely level - rating|).

    Returns {"bins": [{"own_ratings", "n", "n_raters", "mae": {model: {"value", "ci"}}, "live_minus_static",
    "live_minus_generic", "relative_gain"}]} (relative_gain: 1 - live MAE / static MAE); empty bins left out."""
    if frame.empty:
        return {"bins": [], "n_boot": n_boot}
    raters = pd.factorize(frame["rater_id"].astype(str))[0]
    draws = cluster_draws(int(raters.max()) + 1, n_boot, seed)
    labels = bin_of(frame["own_ratings"])
    out = []
    for label, _, _ in BINS:
        rows = labels == label
        if not rows.any():
            continue
        r = raters[rows]
        w = draws[:, r]  # (n_boot, rows)
        total = w.sum(axis=1)
        ok = total > 0
        errors = {m: frame[f"abs_error_{m}"].to_numpy(float)[rows] for m in MODELS}
        point = {m: float(errors[m].mean()) for m in MODELS}
        boot = {m: np.where(ok, (w * errors[m]).sum(axis=1) / np.where(ok, total, 1), np.nan) for m in MODELS}
        out.append({
            "own_ratings": label, "n": int(rows.sum()), "n_raters": int(len(np.unique(r))),
            "mae": {m: _value(point[m], boot[m]) for m in MODELS},
            "live_minus_static": _value(point["live"] - point["static"], boot["live"] - boot["static"]),
            "live_minus_generic": _value(point["live"] - point["generic"], boot["live"] - boot["generic"]),
            "relative_gain": _value(1 - point["live"] / point["static"], relative_gain(boot["live"], boot["static"]))
            if point["static"] > 0 else {"value": None, "ci": [None, None]},
        })
    return {"bins": out, "n_boot": n_boot}


# -- the planted-data simulation --------------------------------------------------------------------------

def planted_study(n_conversations: int, n_raters: int, seed: int, taxonomy, leniency_sd: float = 0.8,
                  slope_sd: float = 0.5, random_raters=()):
    """A synthetic study (sense7.synthetic.synth) with ratings redrawn so that raters differ strongly: each
    rater's latent means get an extra leniency ~ N(0, leniency_sd) and a slope ~ 1 + N(0, slope_sd) around
    the scale's middle; raters in `random_raters` answer uniformly at random (no signal)."""
    from sense7.synthetic.synth import generate

    synth = copy.deepcopy(generate(n_conversations, n_raters, seed=seed, taxonomy=taxonomy))
    rng = np.random.default_rng(seed + 1)
    truth = synth.truth
    raters = sorted(synth.raters["rater_id"])
    extra = dict(zip(raters, rng.normal(0, leniency_sd, len(raters))))
    slope = dict(zip(raters, np.clip(1 + rng.normal(0, slope_sd, len(raters)), 0.1, 2.5)))
    middle = (taxonomy.levels + 1) / 2
    latent = truth.latent.dropna(subset=["turn_index"]).set_index(["conversation_id", "turn_index", "rater_id"])
    ratings = synth.ratings
    turn = ratings["turn_index"].notna() & ratings["dimension"].isin(taxonomy.controls)
    rows = ratings[turn]
    keys = pd.MultiIndex.from_arrays([rows["conversation_id"], rows["turn_index"].astype("Int64"), rows["rater_id"]])
    mean = np.array([latent.at[k, d] for k, d in zip(keys, rows["dimension"])], dtype=float)
    who = rows["rater_id"].to_numpy()
    shifted = middle + (mean - middle) * np.array([slope[r] for r in who]) + np.array([extra[r] for r in who])
    drawn = 1 + np.searchsorted(truth.thresholds, shifted + rng.normal(0, truth.noise_sd, len(mean)))
    noise = np.isin(who, list(random_raters))
    drawn[noise] = rng.integers(1, taxonomy.levels + 1, noise.sum())
    synth.ratings.loc[turn, "rating"] = drawn
    return synth


def simulate(n_conversations: int = 400, n_raters: int = 60, n_new: int = 24, n_random: int = 6,
             seed: int = 0, after: int = 5, *, taxonomy, n_boot: int = 500, leniency_sd: float = 0.8,
             slope_sd: float = 0.5) -> dict:
    """Train a version on the first n_raters - n_new raters of a planted study; every new rater (the last
    n_random of them answer at random) answers their turns in order, each next turn predicted live from
    the answers so far. Returns the gain curve of the signal raters and of the random ones, and the
    issue's check: MAE on each new rater's remaining turns after their first `after` answers."""
    from sense7.data.dataset import RatingData
    from sense7.data.items import trait_table, transcript_columns
    from sense7.model.bundle import train_bundle
    from sense7.model.live import LivePredictor, OnlinePosterior
    tax = taxonomy
    ids = [f"r{i:03d}" for i in range(1, n_raters + 1)]
    new = ids[n_raters - n_new:]
    noisy = set(new[len(new) - n_random:]) if n_random else set()
    synth = planted_study(n_conversations, n_raters, seed, tax, leniency_sd, slope_sd, noisy)
    data = synth.rating_data()
    old = ~data.ratings["rater_id"].isin(new)
    train = RatingData({k: v for k, v in data.conversations.items() if k[1] not in new}, data.ratings[old],
                       data.raters.drop(columns=["email"], errors="ignore"))
    bundle = train_bundle(train, "sim", tax)
    compiled = bundle.compile()
    live = LivePredictor(compiled)
    traits = trait_table(data.raters.drop(columns=["email"], errors="ignore"), tax)
    table = compiled.rater_table(traits)
    controls = compiled.controls
    wide = data.ratings.dropna(subset=["turn_index"]).pivot_table(
        index=["conversation_id", "turn_index", "rater_id"], columns="dimension", values="rating")
    curve_rows, after_rows = [], []
    for rater in new:
        convs = sorted((c for c in synth.conversations if c.rater_id == rater), key=lambda c: c.conversation_id)
        columns = transcript_columns(convs, tax)
        keys = list(zip(columns["conversation_id"], map(int, columns["turn_index"]), columns["rater_id"]))
        y = wide.reindex(pd.MultiIndex.from_tuples(keys)).reindex(columns=controls).to_numpy(float)
        if len(y) <= after:
            continue
        static, generic = compiled.predict(columns, table).best()[0], compiled.predict_generic(columns).best()[0]
        g = compiled.text_scores(columns)
        shift = compiled.assistant_shifts(columns["assistant_id"])
        state = OnlinePosterior(compiled.personalized, rater, traits)
        for i in range(len(y)):
            one = {name: values[i:i + 1] for name, values in columns.items()}
            level = live.predict_with(state, one).best()[0][0] if state.n_ratings else static[i]
            for j, c in enumerate(controls):
                if np.isfinite(y[i, j]):
                    curve_rows.append({"rater_id": rater, "random": rater in noisy, "own_ratings": i,
                                       "abs_error_live": abs(level[j] - y[i, j]),
                                       "abs_error_static": abs(static[i, j] - y[i, j]),
                                       "abs_error_generic": abs(generic[i, j] - y[i, j])})
            if i + 1 == after:  # the check: the posterior after `after` answers, on every later turn
                rest = {name: values[after:] for name, values in columns.items()}
                levels = live.predict_with(state.update(g[i], y[i], shift[i]), rest).best()[0]
                ok = np.isfinite(y[after:])
                after_rows.append({"rater_id": rater, "random": rater in noisy,
                                   "live": float(np.abs(levels - y[after:])[ok].mean()),
                                   "static": float(np.abs(static[after:] - y[after:])[ok].mean()),
                                   "generic": float(np.abs(generic[after:] - y[after:])[ok].mean())})
                continue
            state.update(g[i], y[i], shift[i])
    curve = pd.DataFrame(curve_rows)
    after_frame = pd.DataFrame(after_rows)
    return {
        "settings": {"n_conversations": n_conversations, "n_raters": n_raters, "n_new": n_new,
                     "n_random": n_random, "seed": seed, "after": after, "leniency_sd": leniency_sd,
                     "slope_sd": slope_sd, "n_boot": n_boot},
        "curve": gain_curve(curve[~curve["random"]], n_boot=n_boot, seed=seed),
        "curve_random": gain_curve(curve[curve["random"]], n_boot=n_boot, seed=seed) if n_random else None,
        "after": {"signal": _after_block(after_frame[~after_frame["random"]], n_boot, seed),
                  "random": _after_block(after_frame[after_frame["random"]], n_boot, seed) if n_random else None},
    }


def _after_block(frame: pd.DataFrame, n_boot: int, seed: int) -> dict:
    """Mean per-rater MAE of live, static (traits prior) and generic after the first answers, with
    rater-bootstrap intervals; relative_gain = 1 - live / static."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(frame), size=(n_boot, len(frame)))
    out = {"n_raters": int(len(frame))}
    values = {m: frame[m].to_numpy(float) for m in MODELS}
    for m in MODELS:
        out[m] = _value(values[m].mean(), values[m][picks].mean(axis=1))
    out["live_minus_static"] = _value(values["live"].mean() - values["static"].mean(),
                                      values["live"][picks].mean(axis=1) - values["static"][picks].mean(axis=1))
    out["relative_gain"] = _value(1 - values["live"].mean() / values["static"].mean(),
                                  1 - values["live"][picks].mean(axis=1) / values["static"][picks].mean(axis=1))
    return out
