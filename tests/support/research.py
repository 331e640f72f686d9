"""Small data sets with planted structure, generated in the tests (no file from outside the repo)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def planted_items(n_raters=24, n_conversations=10, n_turns=4, rater_sd=1.0, noise_sd=0.6, seed=0,
                  controls=("overall",), levels=(1, 5), shared_conversations=False):
    """(X, Y) items: rating = round(mid + rater leniency + noise), clipped to the scale.

    shared_conversations: every conversation id is rated by several raters (crossed design)."""
    rng = np.random.default_rng(seed)
    lo, hi = levels
    mid = (lo + hi) / 2
    leniency = rng.normal(0, rater_sd, n_raters)
    rows, ys = [], []
    for r in range(n_raters):
        for c in range(n_conversations):
            conv = f"c{c}" if shared_conversations else f"c{r}_{c}"
            for t in range(n_turns):
                rows.append({"conversation_id": conv, "turn_index": 2 * t + 1, "rater_id": f"r{r}",
                             "text": f"turn {t} of {conv}", "history_text": "user: hello",
                             "turn_position": float(t + 1), "n_turns": float(n_turns)})
                ys.append([np.clip(np.round(mid + leniency[r] + rng.normal(0, noise_sd)), lo, hi) for _ in controls])
    return pd.DataFrame(rows), pd.DataFrame(ys, columns=list(controls))
