"""Decision rules: which single level a predicted distribution over ordered levels stands for.

- `mode`: the most likely level. Right for accuracy (exact hits) and QWK's confusion counts.
- `median`: the lowest level whose cumulative probability reaches 1/2. It minimizes the expected absolute
  distance to the rating, so it is the right point for MAE and LeWiDi's ANAD; on a skewed or flat
  distribution it sits nearer the bulk of the mass than the mode (docs/BENCHMARKS.md measures both).

A study picks the rule its pre-fill uses (sense7.settings.StudyDesign.prefill_rule, SENSE7_PREFILL_RULE).
"""

from __future__ import annotations

import numpy as np

DECISION_RULES = ("mode", "median")
# Probabilities come from floating-point sums: a cumulative 0.4999999999 is a half.
_HALF = 0.5 - 1e-9


def decide(probs, rule: str = "mode") -> np.ndarray:
    """Index of the chosen level along the last axis of `probs` (rows sum to 1)."""
    probs = np.asarray(probs, float)
    if rule == "mode":
        return probs.argmax(axis=-1)
    if rule == "median":
        reached = np.cumsum(probs, axis=-1) >= _HALF
        return np.where(reached.any(axis=-1), reached.argmax(axis=-1), probs.shape[-1] - 1)
    raise ValueError(f"unknown decision rule {rule!r}; choose from {', '.join(DECISION_RULES)}")
