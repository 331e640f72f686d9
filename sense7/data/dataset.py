"""The shared dataset layer: rating data in memory (`RatingData`, read from the native files by
`sense7.readers.formats.load_native`) and rater traits as numbers (`trait_features`). Model items (X, Y)
are built from these by `sense7.data.items`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sense7.taxonomy import Taxonomy

# Ordinal profile answers: position in the taxonomy's choice list is the number.
ORDINAL_PROFILE_FIELDS = ("age_band", "llm_use")
# TIPI (Gosling et al., 2003): each Big Five score is the mean of one item and one reverse-keyed item.
TIPI_SCALES = {
    "extraversion": (1, 6),
    "agreeableness": (7, 2),
    "conscientiousness": (3, 8),
    "emotional_stability": (9, 4),
    "openness": (5, 10),
}
# Columns of raters.csv that are identities, not traits.
NON_TRAIT_COLUMNS = {"rater_id", "email"}



@dataclass
class RatingData:
    conversations: dict  # (conversation_id, rater_id) -> Conversation
    ratings: pd.DataFrame  # conversation_id, turn_index (Int64, NA = whole conversation), rater_id, dimension, rating
    raters: pd.DataFrame  # indexed by rater_id, raw trait columns

    def controls(self, taxonomy: Taxonomy) -> list[str]:
        """The rated controls (model targets), taxonomy order first; the expectation answer is not one."""
        return _controls_of(self.ratings, taxonomy)


def _controls_of(ratings: pd.DataFrame, taxonomy: Taxonomy) -> list[str]:
    present = [d for d in pd.unique(ratings["dimension"]) if d != taxonomy.expectation_key]
    ordered = [c for c in taxonomy.controls if c in present]
    return ordered + sorted(c for c in present if c not in ordered)


# ---------------------------------------------------------------------------------------------------
# Traits


def trait_features(raters: pd.DataFrame, taxonomy: Taxonomy) -> pd.DataFrame:
    """Numeric trait features per rater (index rater_id); NaN where the answer is missing.

    TIPI items become the five Big Five scores, ordinal answers their rank, other choices one-hot columns;
    unknown numeric columns (e.g. WASSA's iri_* and personality_*) pass through unchanged.
    """
    fields = {f.key: f for f in taxonomy.profile_fields}
    # Plain arrays in the raters' row order, framed once at the end: pandas' per-operation cost (a new column
    # index per insert, a Series per step) was most of a live pre-fill for a rater new to the rater page.
    cells = {column: raters[column].to_numpy(dtype=object) for column in raters.columns}
    out: dict[str, np.ndarray] = {}
    tipi_top = fields["tipi_1"].max + 1 if "tipi_1" in fields else 8
    used = set()
    if all(f"tipi_{i}" in cells for i in range(1, 11)):
        for name, (plain, reverse) in TIPI_SCALES.items():
            a = _numbers(cells[f"tipi_{plain}"])
            b = tipi_top - _numbers(cells[f"tipi_{reverse}"])
            out[f"big5_{name}"] = (a + b) / 2
        used.update(f"tipi_{i}" for i in range(1, 11))
    for column, values in cells.items():
        if column in used or column in NON_TRAIT_COLUMNS:
            continue
        fld = fields.get(column)
        if fld is not None and fld.type == "choice":
            if column in ORDINAL_PROFILE_FIELDS:
                rank = {c: float(i) for i, c in enumerate(fld.choices)}
                out[column] = np.array([rank.get(v, np.nan) if _hashable(v) else np.nan for v in values], dtype=float)
            else:
                known = ~pd.isna(values)
                for choice in fld.choices:
                    out[f"{column}_{choice}"] = np.where(known, values == choice, np.nan).astype(float)
        else:
            numeric = _numbers(values)
            if np.count_nonzero(~np.isnan(numeric)) == np.count_nonzero(~pd.isna(values)):  # numeric or all missing
                out[column] = numeric
    if not out:
        return pd.DataFrame(index=raters.index).astype(float)
    return pd.DataFrame(out, index=raters.index, columns=list(out), dtype=float)


def _numbers(values: np.ndarray) -> np.ndarray:
    """pd.to_numeric(errors="coerce") of an object array, as floats (NaN where not a number)."""
    return np.asarray(pd.to_numeric(pd.Series(values, dtype=object), errors="coerce"), dtype=float)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
