"""The shared dataset layer: rating data in memory, rater traits as numbers, and model items.

`build_items` (training, from files or the store) and `items_from_tasks` (serving, from Label Studio task
data) both go through `_item_row`, so a model sees exactly the same columns when it is trained and when it
predicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sense7.data.conversations import Conversation
from sense7.data.formats import raters_frame, read_assignments, read_conversations, read_raters, read_ratings
from sense7.taxonomy import Taxonomy, load_taxonomy

ITEM_KEYS = ["conversation_id", "turn_index", "rater_id"]
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

    def controls(self, taxonomy: Taxonomy | None = None) -> list[str]:
        """The rated controls (model targets), taxonomy order first; the expectation answer is not one."""
        return _controls_of(self.ratings, taxonomy)


def _controls_of(ratings: pd.DataFrame, taxonomy: Taxonomy | None) -> list[str]:
    tax = taxonomy or load_taxonomy()
    present = [d for d in pd.unique(ratings["dimension"]) if d != tax.expectation_key]
    ordered = [c for c in tax.controls if c in present]
    return ordered + sorted(c for c in present if c not in ordered)


# ---------------------------------------------------------------------------------------------------
# Reading the native files (through sense7.data.formats, the one reader of user files)


def load_native(conversations_path, ratings_path, raters_path=None, taxonomy: Taxonomy | None = None,
                assignments_path=None) -> RatingData:
    """conversations.jsonl + ratings.csv (+ raters.csv) validated against the taxonomy. Raises FormatError
    listing every problem of a file as file:line: field: reason.

    Several raters per conversation: one line per conversation is enough (every rater in ratings.csv shares
    its text), or `assignments_path` (conversation_id, rater_id, as `sense7 import --assignments`)."""
    tax = taxonomy or load_taxonomy()
    batch = read_conversations(conversations_path, taxonomy=tax)
    if assignments_path:
        batch = read_assignments(assignments_path, batch)
    conversations = {}
    for conv in batch:
        conversations[(conv.conversation_id, conv.rater_id)] = conv
    if raters_path:
        raters = raters_frame(read_raters(raters_path, tax, extra_columns=True), tax)
    else:
        raters = pd.DataFrame(index=pd.Index([], name="rater_id"))
    ratings = read_ratings(ratings_path, tax, conversations)
    return RatingData(conversations, ratings, raters)


# ---------------------------------------------------------------------------------------------------
# Traits


def trait_features(raters: pd.DataFrame, taxonomy: Taxonomy | None = None) -> pd.DataFrame:
    """Numeric trait features per rater (index rater_id); NaN where the answer is missing.

    TIPI items become the five Big Five scores, ordinal answers their rank, other choices one-hot columns;
    unknown numeric columns (e.g. WASSA's iri_* and personality_*) pass through unchanged.
    """
    tax = taxonomy or load_taxonomy()
    fields = {f.key: f for f in tax.profile_fields}
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


def trait_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("trait_")]


def context_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("ctx_")]


# ---------------------------------------------------------------------------------------------------
# Items: one row per (conversation_id, turn_index, rater_id)

def _join(messages) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _assistant_id(value):
    """An optional assistant (ratee) id as a string; None when unknown."""
    if value is None or (np.ndim(value) == 0 and pd.isna(value)):
        return None
    text = str(value).strip()
    return text or None


def _item_row(conversation_id, turn_index, rater_id, history: list[dict], turn: list[dict],
              turn_position: int, n_turns: int, assistant_id=None) -> dict:
    return {
        "conversation_id": str(conversation_id),
        "turn_index": turn_index,
        "rater_id": str(rater_id),
        "text": "\n".join(m["content"] for m in turn),
        "history_text": _join(history),
        "turn_position": float(turn_position),
        "n_turns": float(n_turns),
        # Who is rated (a model version; in WASSA the other person): optional, None when unknown.
        "assistant_id": _assistant_id(assistant_id),
    }


ITEM_COLUMNS = list(_item_row("", 0, "", [], [], 0, 0))


def _conversation_item(conv: Conversation, turn_index) -> dict:
    """The item for one turn (or, with turn_index NA, the whole conversation) of a conversation."""
    turns = conv.assistant_turns()
    assistant_id = (conv.context or {}).get("assistant_id")
    messages = [{"role": m.role, "content": m.content} for m in conv.messages]
    if turn_index is pd.NA or turn_index is None or (isinstance(turn_index, float) and math.isnan(turn_index)):
        # A rating of the whole conversation: the rated text is every assistant turn, the rest is context.
        assistant = [m for m in messages if m["role"] == "assistant"]
        others = [m for m in messages if m["role"] != "assistant"]
        return _item_row(conv.conversation_id, pd.NA, conv.rater_id, others, assistant, 0, len(turns),
                         assistant_id)
    turn_index = int(turn_index)
    return _item_row(conv.conversation_id, turn_index, conv.rater_id, messages[:turn_index],
                     [messages[turn_index]], turns.index(turn_index) + 1, len(turns), assistant_id)


def _context_columns(conversation_ids, rater_ids, contexts: dict, taxonomy: Taxonomy) -> dict[str, list]:
    """ctx_<field>: each item's raw context answer (None when the pair has no context or no answer)."""
    pairs = list(zip(conversation_ids, rater_ids))
    return {f"ctx_{fld.key}": [contexts.get(pair, {}).get(fld.key) for pair in pairs]
            for fld in taxonomy.context_fields}


def _attach(items: pd.DataFrame, raters: pd.DataFrame, context_columns: dict[str, list],
            taxonomy: Taxonomy) -> pd.DataFrame:
    """Add the ctx_<field> columns (`_context_columns`; numeric fields as numbers) and trait_<name>
    (numeric, NaN when unknown) columns."""
    types = {f"ctx_{fld.key}": fld.type for fld in taxonomy.context_fields}
    for name, values in context_columns.items():
        column = pd.Series(values, index=items.index, dtype=object)
        items[name] = pd.to_numeric(column, errors="coerce") if types[name] == "int" else column
    traits = trait_features(raters, taxonomy) if len(raters.columns) else pd.DataFrame(index=raters.index)
    traits = traits.add_prefix("trait_")
    joined = traits.reindex(items["rater_id"].to_numpy())
    for column in traits.columns:
        items[column] = joined[column].to_numpy(dtype=float)
    items["turn_index"] = items["turn_index"].astype("Int64")
    return items


def build_items(data: RatingData, taxonomy: Taxonomy | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(X, Y) for training: X as in DESIGN.md, Y one float column per control (NaN = not rated)."""
    tax = taxonomy or load_taxonomy()
    controls = data.controls(tax)
    ratings = data.ratings[data.ratings["dimension"].isin(controls)]
    # Pivot with a sentinel for the whole-conversation rows (pivot drops NA keys).
    keyed = ratings.assign(turn_index=ratings["turn_index"].astype("Int64").fillna(-1).astype(int))
    wide = keyed.pivot_table(index=ITEM_KEYS, columns="dimension", values="rating", aggfunc="mean")
    wide = wide.reindex(columns=controls).astype(float)
    rows = []
    for conv_id, turn, rater_id in wide.index:
        conv = data.conversations.get((conv_id, rater_id))
        if conv is None:
            raise ValueError(f"ratings name conversation {conv_id!r} for rater {rater_id!r}, which is not loaded")
        rows.append(_conversation_item(conv, pd.NA if turn == -1 else turn))
    X = pd.DataFrame(rows, columns=ITEM_COLUMNS)
    contexts = {key: conv.context for key, conv in data.conversations.items()}
    X = _attach(X, data.raters, _context_columns(X["conversation_id"], X["rater_id"], contexts, tax), tax)
    Y = pd.DataFrame(wide.to_numpy(), columns=controls)
    Y.columns.name = None
    return X, Y
