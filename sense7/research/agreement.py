"""How far raters agree with each other: Krippendorff's alpha (ordinal) per control.

Only turns that several raters rated say anything about agreement, so alpha is computed on the
"pairable" units (a unit = one conversation's turn, or the whole conversation for turn_index NA / -1)
that at least two raters rated. Alpha itself comes from the `krippendorff` package; this module only
turns the long ratings frame into the package's input and bootstraps it.

The input is a value-counts matrix (units x levels: how many raters gave each level to each unit)
rather than a raters x units matrix: it has no NaN padding, and a bootstrap resample is just a repeat
of its rows. The confidence interval resamples conversations, not units: the turns of one conversation
share its content (and usually its raters), so they are not independent, and resampling single turns
would give intervals that are too narrow.
"""

from __future__ import annotations

from typing import Sequence

import krippendorff
import numpy as np
import pandas as pd

from sense7.research.metrics import cluster_draws, percentile_ci

LEVEL = "ordinal"


def _alpha(counts: np.ndarray, levels: np.ndarray) -> float:
    """Ordinal alpha of a value-counts matrix; NaN when undefined (nothing to compare, or every rating
    the same level so there is no expected disagreement to measure against)."""
    if len(counts) == 0 or (counts.sum(axis=1) < 2).all():
        return float("nan")
    with np.errstate(all="ignore"):
        return float(krippendorff.alpha(value_counts=counts, value_domain=levels, level_of_measurement=LEVEL))


def _value_counts(rows: pd.DataFrame, levels: Sequence[int]) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """(counts, conversation codes, rows used) for the pairable units of one control's ratings.

    counts[u, v]: how many raters gave level levels[v] to unit u; the codes give each unit's conversation
    (0..n-1) for the bootstrap. A rater who rated a unit more than once counts once, with their last
    rating: alpha compares raters, and a second copy of one rater would look like agreement."""
    levels = np.asarray(levels)
    rows = rows[rows["rating"].notna()]
    unit_turn = pd.to_numeric(rows["turn_index"], errors="coerce").fillna(-1).astype(int)
    rows = rows.assign(conversation_id=rows["conversation_id"].astype(str), unit_turn=unit_turn,
                       rater_id=rows["rater_id"].astype(str))
    rows = rows.drop_duplicates(["conversation_id", "unit_turn", "rater_id"], keep="last")
    outside = ~np.isin(rows["rating"].to_numpy(float), levels)
    if outside.any():
        raise ValueError(f"ratings outside the scale {levels.tolist()}: {sorted(set(rows['rating'][outside]))}")
    raters_per_unit = rows.groupby(["conversation_id", "unit_turn"])["rater_id"].transform("size")
    rows = rows[raters_per_unit >= 2]
    units = rows.groupby(["conversation_id", "unit_turn"]).ngroup().to_numpy()
    n_units = int(units.max()) + 1 if len(units) else 0
    value_index = np.searchsorted(levels, rows["rating"].to_numpy(float))
    counts = np.zeros((n_units, len(levels)))
    np.add.at(counts, (units, value_index), 1)
    conversation = np.zeros(n_units, int)
    conversation[units] = pd.factorize(rows["conversation_id"])[0]
    return counts, conversation, rows


def krippendorff_alpha(ratings: pd.DataFrame, levels: Sequence[int], n_boot: int = 1000, seed: int = 0) -> dict:
    """{"controls": {dimension: {"alpha", "ci", "n_units", "n_raters", "n_ratings"}}, "n_boot", "level",
    "cluster"}.

    `ratings`: the long ratings.csv frame (conversation_id, turn_index, rater_id, dimension, rating).
    n_units, n_raters and n_ratings count the pairable units and the raters and ratings in them.
    alpha is None for a control without a pairable unit (or where every rating is the same level); ci is
    the 95% percentile interval over `n_boot` resamples of conversations ([None, None] when undefined).
    A conversation drawn twice counts twice, with all of its units.
    """
    levels = np.asarray(sorted(levels))
    out = {"controls": {}, "n_boot": n_boot, "level": LEVEL, "cluster": "conversation_id"}
    for dimension in pd.unique(ratings["dimension"]):
        counts, conversation, rows = _value_counts(ratings[ratings["dimension"] == dimension], levels)
        alpha = _alpha(counts, levels)
        n_conversations = int(conversation.max()) + 1 if len(conversation) else 0
        boot = [_alpha(np.repeat(counts, draw[conversation].astype(int), axis=0), levels)
                for draw in cluster_draws(n_conversations, n_boot, seed)] if n_conversations else []
        out["controls"][str(dimension)] = {
            "alpha": alpha if np.isfinite(alpha) else None,
            "ci": percentile_ci(boot) if np.isfinite(alpha) else [None, None],
            "n_units": int(len(counts)),
            "n_raters": int(rows["rater_id"].nunique()),
            "n_ratings": int(len(rows)),
        }
    return out
