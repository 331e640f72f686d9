"""Replaying a study on ratings that exist: what an assignment policy would have cost and learnt.

A multi-rater data set (`ReplayData`: one rating per (unit, rater)) is split into held-out units and a pool.
Raters then visit in a seeded random order; on each visit the policy (sense7.crowd.policies, the same
`choose` as in a running study) picks up to `per_visit` pool units for them *among the units that rater
actually rated in the data* (`allowed`), and the data's rating is revealed. At checkpoints of the ratings
spent, `checkpoint_metrics` measures:

- per-rater MAE on held-out units: each rater's rating of a held-out unit predicted from their posterior
  (intercept and slope, sense7.crowd.policies.rater_posterior, learnt from the collected ratings only) and
  the unit's level from the other raters' held-out ratings (leniency removed with the collected estimates);
- item-level MAE: each pool unit's mean collected rating (the collected grand mean while it has none)
  against its mean over every rating in the data;
- the collected ratings themselves (`collected_frame`), for agreement (Krippendorff's alpha and its CI,
  computed by the benchmark with sense7.research.agreement).

`planted_disagreement` makes data where raters disagree by design: rater leniency and scale use, and on
contested units two camps of raters pulling the level apart (the case where plain uncertainty sampling is
reported to do worse than random). `from_rating_data` turns a `RatingData` (ConvAbuse, WASSA) into units.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sense7.crowd.policies import Policy, item_levels, others_level, rater_posterior


@dataclass(frozen=True)
class ReplayData:
    """`ratings`: columns unit, rater, rating (one row per (unit, rater)); `levels`: the scale's values."""

    name: str
    ratings: pd.DataFrame
    levels: tuple

    def summary(self) -> dict:
        per_unit = self.ratings.groupby("unit").size()
        return {"units": int(len(per_unit)), "raters": int(self.ratings["rater"].nunique()),
                "ratings": int(len(self.ratings)), "raters_per_unit": [int(per_unit.min()), int(per_unit.max())],
                "levels": list(self.levels)}


def from_rating_data(name: str, data, dimension: str | None = None) -> ReplayData:
    """Units of a RatingData: (conversation, turn) for turn ratings, the conversation for whole-conversation
    ones; one control (`dimension`, default the first); a rater's first rating of a unit."""
    frame = data.ratings
    dimension = dimension or str(frame["dimension"].iloc[0])
    frame = frame[frame["dimension"] == dimension]
    turn = pd.to_numeric(frame["turn_index"], errors="coerce")
    unit = frame["conversation_id"].astype(str) + np.where(turn.isna(), "", "::" + turn.fillna(-1).astype(int).astype(str))
    out = pd.DataFrame({"unit": unit.to_numpy(), "rater": frame["rater_id"].astype(str).to_numpy(),
                        "rating": frame["rating"].astype(float).to_numpy()})
    out = out.drop_duplicates(["unit", "rater"], keep="first").reset_index(drop=True)
    return ReplayData(name, out, tuple(sorted(out["rating"].unique().tolist())))


def planted_disagreement(n_units: int = 400, n_raters: int = 30, rated_share: float = 0.5, n_levels: int = 5,
                         contested_share: float = 0.5, seed: int = 0) -> ReplayData:
    """Ratings on a 1..n_levels scale with high disagreement planted: y = level + leniency + (slope - 1)(level
    - centre) + camp * pull + noise, rounded and clipped; half the raters in each camp (+1/-1), `pull` large
    on `contested_share` of the units and 0 elsewhere. Each rater rated a random `rated_share` of the units."""
    rng = np.random.default_rng(seed)
    centre = (1 + n_levels) / 2
    level = rng.uniform(1, n_levels, n_units)
    pull = np.where(rng.random(n_units) < contested_share, rng.normal(0, 1.2, n_units), 0.0)
    leniency = rng.normal(0, 0.6, n_raters)
    slope = rng.normal(1, 0.3, n_raters)
    camp = np.where(np.arange(n_raters) % 2 == 0, 1.0, -1.0)
    rows = []
    for r in range(n_raters):
        units = np.flatnonzero(rng.random(n_units) < rated_share)
        y = (level[units] + leniency[r] + (slope[r] - 1) * (level[units] - centre) + camp[r] * pull[units]
             + rng.normal(0, 0.5, len(units)))
        y = np.clip(np.rint(y), 1, n_levels)
        rows += [(f"u{u:04d}", f"r{r:03d}", float(v)) for u, v in zip(units, y)]
    frame = pd.DataFrame(rows, columns=["unit", "rater", "rating"])
    return ReplayData("planted", frame, tuple(float(v) for v in range(1, n_levels + 1)))


@dataclass
class ReplayRun:
    """One policy on one split: the ratings collected in order and the metrics at each checkpoint."""

    policy: str
    seed: int
    order: list = field(default_factory=list)  # (unit, rater, rating) as collected
    checkpoints: list = field(default_factory=list)  # {"ratings", "per_rater_mae", "item_mae", ...}

    def collected_frame(self, upto: int | None = None) -> pd.DataFrame:
        rows = self.order if upto is None else self.order[:upto]
        return pd.DataFrame(rows, columns=["unit", "rater", "rating"])


def split_units(data: ReplayData, heldout_share: float, seed: int) -> tuple[set, set]:
    """(pool units, held-out units): held-out units are drawn among those with at least two raters."""
    rng = np.random.default_rng(seed)
    per_unit = data.ratings.groupby("unit").size()
    multi = np.array(sorted(per_unit[per_unit >= 2].index))
    heldout = set(rng.choice(multi, int(round(heldout_share * len(multi))), replace=False).tolist()) if len(multi) else set()
    return set(per_unit.index) - heldout, heldout


def replay(data: ReplayData, policy: Policy, seed: int, budget: int, checkpoints: list[int], heldout_share: float = 0.3,
           per_visit: int = 5) -> ReplayRun:
    """Run `policy` on `data` until `budget` ratings are collected or no rater can be given anything."""
    pool, heldout = split_units(data, heldout_share, seed)
    rng = np.random.default_rng(seed + 7919)
    pool_rows = data.ratings[data.ratings["unit"].isin(pool)]
    value = {(u, r): y for u, r, y in pool_rows[["unit", "rater", "rating"]].itertuples(index=False)}
    allowed = {r: frozenset(g["unit"]) for r, g in pool_rows.groupby("rater")}
    taken = {u: set() for u in sorted(pool)}
    collected: dict[str, dict[str, float]] = {}
    had: dict[str, set] = {r: set() for r in allowed}
    active = sorted(allowed)
    run = ReplayRun(policy.name, seed)
    marks = sorted(c for c in checkpoints if c <= budget)
    test = data.ratings[data.ratings["unit"].isin(heldout)]
    truth = pool_rows.groupby("unit")["rating"].mean()
    while marks and marks[0] <= 0:  # before any rating: what the priors alone give
        run.checkpoints.append({"ratings": marks.pop(0), **checkpoint_metrics(collected, test, truth, data.levels)})
    while active and len(run.order) < budget:
        rater = active[int(rng.integers(len(active)))]
        chosen = policy.choose(taken, rater, exclude=had[rater], ratings=collected if policy.uses_ratings else None,
                               allowed=allowed[rater])[:max(0, min(per_visit, budget - len(run.order)))]
        if not chosen:
            active.remove(rater)
            continue
        for unit, slot in chosen:
            assert len(taken[unit]) < policy.raters_per_conversation and slot not in taken[unit]
            taken[unit].add(slot)
            had[rater].add(unit)
            y = value[(unit, rater)]
            collected.setdefault(unit, {})[rater] = y
            run.order.append((unit, rater, y))
            while marks and len(run.order) >= marks[0]:
                run.checkpoints.append({"ratings": marks.pop(0), **checkpoint_metrics(collected, test, truth, data.levels)})
    if marks:  # ran out of raters before the budget: the last state stands for the remaining checkpoints
        metrics = checkpoint_metrics(collected, test, truth, data.levels)
        run.checkpoints += [{"ratings": m, **metrics, "exhausted": len(run.order)} for m in marks]
    return run


def checkpoint_metrics(collected: dict, test: pd.DataFrame, truth: pd.Series, levels: tuple) -> dict:
    """Per-rater MAE on held-out units and item-level MAE on the pool (see the module docstring)."""
    fit = item_levels(collected)
    low, high = min(levels), max(levels)
    errors = []
    posteriors = {}
    for unit, group in test.groupby("unit"):
        raters, ys = group["rater"].tolist(), group["rating"].to_numpy(float)
        for i, rater in enumerate(raters):
            others = [ys[j] - fit.leniency.get(raters[j], 0.0) for j in range(len(raters)) if j != i]
            level, _ = others_level(others, fit)
            if rater not in posteriors:
                posteriors[rater] = rater_posterior(rater, collected, fit)
            errors.append(abs(float(np.clip(posteriors[rater].predict(level), low, high)) - ys[i]))
    grand = fit.mean if np.isfinite(fit.mean) else float(np.mean(levels))
    estimate = np.array([np.mean(list(collected[u].values())) if u in collected else grand for u in truth.index])
    return {"per_rater_mae": float(np.mean(errors)) if errors else float("nan"),
            "item_mae": float(np.mean(np.abs(estimate - truth.to_numpy()))),
            "units_rated": len(collected)}


def ratings_to_reach(curve_x: list[float], curve_y: list[float], target: float) -> float | None:
    """The ratings spent when a decreasing-is-better curve first reaches `target` (linear between
    checkpoints; None if it never does)."""
    for i, (x, y) in enumerate(zip(curve_x, curve_y)):
        if np.isfinite(y) and y <= target:
            if i == 0 or not np.isfinite(curve_y[i - 1]) or curve_y[i - 1] == y:
                return float(x)
            x0, y0 = curve_x[i - 1], curve_y[i - 1]
            return float(x0 + (x - x0) * (y0 - target) / (y0 - y))
    return None
