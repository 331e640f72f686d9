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
    out = pd.DataFrame(index=raters.index)
    tipi_top = fields["tipi_1"].max + 1 if "tipi_1" in fields else 8
    used = set()
    if all(f"tipi_{i}" in raters.columns for i in range(1, 11)):
        for name, (plain, reverse) in TIPI_SCALES.items():
            a = pd.to_numeric(raters[f"tipi_{plain}"], errors="coerce")
            b = tipi_top - pd.to_numeric(raters[f"tipi_{reverse}"], errors="coerce")
            out[f"big5_{name}"] = (a + b) / 2
        used.update(f"tipi_{i}" for i in range(1, 11))
    for column in raters.columns:
        if column in used or column in NON_TRAIT_COLUMNS:
            continue
        fld = fields.get(column)
        values = raters[column]
        if fld is not None and fld.type == "choice":
            if column in ORDINAL_PROFILE_FIELDS:
                out[column] = values.map({c: float(i) for i, c in enumerate(fld.choices)}).astype(float)
            else:
                known = values.notna()
                for choice in fld.choices:
                    out[f"{column}_{choice}"] = np.where(known, (values == choice).astype(float), np.nan)
        else:
            numeric = pd.to_numeric(values, errors="coerce")
            if numeric.notna().sum() == values.notna().sum():  # numeric (or all missing): pass through
                out[column] = numeric.astype(float)
    return out.astype(float)
