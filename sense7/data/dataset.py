"""The shared dataset layer: rating data in memory, rater traits as numbers, and model items.

`build_items` (training, from files or the store) and `items_from_tasks` (serving, from Label Studio task
data) both go through `_item_row`, so a model sees exactly the same columns when it is trained and when it
predicts.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sense7.data.conversations import Conversation
from sense7.taxonomy import Taxonomy, load_taxonomy

ITEM_KEYS = ["conversation_id", "turn_index", "rater_id"]
RATING_COLUMNS = ["conversation_id", "turn_index", "rater_id", "dimension", "rating"]
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


class DataError(ValueError):
    """A user file is invalid; the message names the file, the line and the column."""


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
# Reading the native files


def read_conversations_file(path: str | Path) -> list[Conversation]:
    """Validated reading through sense7.data.formats when it exists; otherwise trust our own JSONL."""
    try:
        from sense7.data.formats import read_conversations
    except ImportError:  # the lead's formats module is not there yet
        read_conversations = None
    if read_conversations is not None:
        return read_conversations(path)
    out = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    out.append(Conversation.from_json(json.loads(line), line=line_no))
                except (ValueError, KeyError, TypeError) as exc:
                    raise DataError(f"{path}:{line_no}: invalid conversation: {exc}") from None
    return out


def load_native(conversations_path, ratings_path, raters_path=None, taxonomy: Taxonomy | None = None) -> RatingData:
    tax = taxonomy or load_taxonomy()
    conversations = {}
    for conv in read_conversations_file(conversations_path):
        conversations[(conv.conversation_id, conv.rater_id)] = conv
    raters = read_raters_csv(raters_path, tax) if raters_path else pd.DataFrame(index=pd.Index([], name="rater_id"))
    ratings = read_ratings_csv(ratings_path, tax, conversations)
    return RatingData(conversations, ratings, raters)


def _rows(path: Path, required: list[str]):
    """Yield (line number, row dict) with a clear error when the header lacks a required column."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path}:1: missing column(s) {', '.join(missing)} (header: {reader.fieldnames})")
        for row in reader:
            yield reader.line_num, row


def read_ratings_csv(path, taxonomy: Taxonomy | None = None, conversations: dict | None = None) -> pd.DataFrame:
    """Validate ratings.csv; every error names file:line, the column and the reason."""
    tax = taxonomy or load_taxonomy()
    path = Path(path)
    n_expect = len(tax.expectation_choices)
    records = []
    for line, row in _rows(path, RATING_COLUMNS):
        def fail(column, reason):
            raise DataError(f"{path}:{line}: column {column}: {reason}")

        conv_id = (row["conversation_id"] or "").strip()
        rater_id = (row["rater_id"] or "").strip()
        dim = (row["dimension"] or "").strip()
        if not conv_id:
            fail("conversation_id", "is empty")
        if not rater_id:
            fail("rater_id", "is empty")
        if dim not in tax.controls and dim != tax.expectation_key:
            fail("dimension", f"{dim!r} is not one of {', '.join(tax.controls + [tax.expectation_key])}")
        raw_turn = (row["turn_index"] or "").strip()
        turn = pd.NA
        if raw_turn:
            if not raw_turn.isdigit():
                fail("turn_index", f"expected a non-negative integer or blank, got {raw_turn!r}")
            turn = int(raw_turn)
        top = n_expect if dim == tax.expectation_key else tax.levels
        raw_rating = (row["rating"] or "").strip()
        if not raw_rating.isdigit() or not 1 <= int(raw_rating) <= top:
            fail("rating", f"expected an integer 1-{top}, got {raw_rating!r}")
        if conversations is not None:
            conv = conversations.get((conv_id, rater_id))
            if conv is None:
                fail("conversation_id", f"no conversation {conv_id!r} for rater {rater_id!r} in the conversations file")
            if turn is not pd.NA and turn not in conv.assistant_turns():
                fail("turn_index", f"{turn} is not an assistant turn of conversation {conv_id!r}")
        records.append((conv_id, turn, rater_id, dim, int(raw_rating)))
    frame = pd.DataFrame.from_records(records, columns=RATING_COLUMNS)
    frame["turn_index"] = frame["turn_index"].astype("Int64")
    frame["rating"] = frame["rating"].astype(int)
    dup = frame.duplicated(["conversation_id", "turn_index", "rater_id", "dimension"])
    if dup.any():
        first = frame[dup].iloc[0]
        raise DataError(f"{path}: duplicate rating for {first['conversation_id']}/{first['turn_index']}/"
                        f"{first['rater_id']}/{first['dimension']}")
    return frame


def read_raters_csv(path, taxonomy: Taxonomy | None = None) -> pd.DataFrame:
    """Validate raters.csv against the taxonomy's profile fields; blank = missing (NaN)."""
    tax = taxonomy or load_taxonomy()
    path = Path(path)
    fields = {f.key: f for f in tax.profile_fields}
    rows = {}
    columns = None
    for line, row in _rows(path, ["rater_id"]):
        columns = columns or list(row)
        rater_id = (row["rater_id"] or "").strip()
        if not rater_id:
            raise DataError(f"{path}:{line}: column rater_id: is empty")
        if rater_id in rows:
            raise DataError(f"{path}:{line}: column rater_id: duplicate rater {rater_id!r}")
        values = {}
        for column, raw in row.items():
            if column == "rater_id" or column is None:
                continue
            text = (raw or "").strip()
            if not text:
                values[column] = np.nan
            elif column in fields:
                try:
                    values[column] = fields[column].validate(text)
                except ValueError as exc:
                    raise DataError(f"{path}:{line}: column {column}: {exc}") from None
            else:
                values[column] = text
        rows[rater_id] = values
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=[c for c in (columns or []) if c != "rater_id"])
    frame.index.name = "rater_id"
    for column in frame.columns:  # unknown extra columns: numeric when every value parses
        if column not in fields and column != "email":
            converted = pd.to_numeric(frame[column], errors="coerce")
            if converted.notna().sum() == frame[column].notna().sum():
                frame[column] = converted
    return frame


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
            raise DataError(f"ratings name conversation {conv_id!r} for rater {rater_id!r}, which is not loaded")
        rows.append(_conversation_item(conv, pd.NA if turn == -1 else turn))
    X = pd.DataFrame(rows, columns=ITEM_COLUMNS)
    contexts = {key: conv.context for key, conv in data.conversations.items()}
    X = _attach(X, data.raters, _context_columns(X["conversation_id"], X["rater_id"], contexts, tax), tax)
    Y = pd.DataFrame(wide.to_numpy(), columns=controls)
    Y.columns.name = None
    return X, Y
