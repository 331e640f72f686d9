"""The LeWiDi 2025 shared task's own scores for ordinal ratings, exactly as its scoring script computes them.

LeWiDi 2025 (Leonardelli et al., "LeWiDi-2025 at NLPerspectives", arXiv 2510.08460; scoring script of the
Codabench competition 7192, linked from le-wi-di.github.io) scores ordinal data sets (CSC 1-6, Par -5..5) two
ways:

- **ANAD** (perspectivist, average normalized absolute distance): for each *item*, the mean over that item's
  annotators of |predicted label - annotator's label|, divided by the *number of levels* K (6 for CSC, 11
  for Par; not K - 1); then the mean over items. An item with many annotators counts as much as one with
  two; a prolific annotator counts once per item.
- **Soft-label Wasserstein**: for each item, the earth mover's distance between the predicted distribution
  over the K levels and the item's observed distribution of labels, with ground cost |i - j| in levels (so
  0..K-1, not normalized); then the mean over items. On a line this is sum_k |CDF_p(k) - CDF_q(k)|.

sense7's "item" is a turn (`sense7.research.perspectivist.TURN_KEY`), its annotators the raters who rated
it; the predicted soft label is the mean of those raters' predicted distributions. These are reported next
to sense7's own summaries (per-rater distance over K - 1, Wasserstein normalized to 0-1), which are not the
task's figures and cannot be set next to published ones.
"""

from __future__ import annotations

import numpy as np


def item_anad(item_codes, y_true, y_pred, n_levels: int) -> np.ndarray:
    """Per item (code 0..n-1): the mean of |y_pred - y_true| over its rows, divided by n_levels (NaN for an
    item without rows)."""
    item_codes = np.asarray(item_codes, int)
    d = np.abs(np.asarray(y_pred, float) - np.asarray(y_true, float)) / n_levels
    n_items = int(item_codes.max()) + 1 if len(item_codes) else 0
    sums = np.bincount(item_codes, weights=d, minlength=n_items)
    counts = np.bincount(item_codes, minlength=n_items)
    with np.errstate(all="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def anad(item_codes, y_true, y_pred, n_levels: int) -> float:
    """The task's ANAD: the mean over items of `item_anad` (lower is better, 0 = every label hit)."""
    per_item = item_anad(item_codes, y_true, y_pred, n_levels)
    per_item = per_item[np.isfinite(per_item)]
    return float(per_item.mean()) if len(per_item) else float("nan")


def soft_label_wasserstein(p, q) -> np.ndarray:
    """Earth mover's distance between distributions over the same K ordered levels, ground cost |i - j| in
    levels (range 0..K-1): sum over levels of |CDF_p - CDF_q|. Rows of 2-d inputs are separate pairs."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    return np.abs(np.cumsum(p - q, axis=-1)).sum(axis=-1)


def mean_soft_label_wasserstein(targets, predictions) -> float:
    """The task's soft-label score: the mean over items of `soft_label_wasserstein`."""
    values = soft_label_wasserstein(targets, predictions)
    return float(np.mean(values)) if np.size(values) else float("nan")
