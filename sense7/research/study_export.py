"""A study's data as researchers load it (`sense7 export`): tidy tables in Parquet and CSV with a schema,
a datasheet README (whose YAML header is what Hugging Face `datasets` reads) and Croissant 1.1 metadata.

`build_export(store, taxonomy, ...)` reads the store:
- ratings: one row per rater x turn x control with everything the rating carries: the rater's traits and
  the conversation's context, the expectation answer, the task's pre-fill arm and the level the rater was
  shown, the static (served version's), generic and live predictions recorded before the rating, the model
  versions, the rater page's timing (seconds on the page, revisions, when submitted) and the rater's
  quality flags (sense7.research.quality). Test-retest repeats are rows too (`is_repeat`); a pilot's
  imported ratings are rows with `source` = imported and no task data. A prediction is paired with a
  rating the way the study's analysis pairs them (sense7.research.study_analysis.with_predictions: the
  record made last at or before the rating was created).
- conversations: one row per message (texts scrubbed again, as the release does: sense7.privacy.pii);
- raters: traits as answered (not generalized: this is the staff's export, not a release), rated tasks,
  median seconds and quality flags;
- predictions: every recorded prediction, one row per task x version x control.
Raters and conversations carry pseudonyms (`Ann<n>`, `Conv<n>`, numbered in a random order drawn for this
export: stable within it, unrelated to the store's ids and to another export's). The store's ids, Label
Studio's task and annotation ids are added only with `with_ids`. E-mail addresses, platform ids, link
secrets and free-text comments are never read. Withdrawn raters (not erased yet) and conversations their
rater left out of the study are left out.

`write_export(export, out, fmt, leaks)` writes the tidy layout or the LeWiDi one
(sense7.research.lewidi_format) into a staging folder (sense7.files.staged_folder: 0600 files in a 0700
folder, renamed into place at the end), after checking the Croissant file and that no forbidden value
(`leaks`: e-mails, link hashes, platform ids, store ids) is in any file written; a failure leaves nothing.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import select

from sense7.data.conversations import Conversation
from sense7.files import staged_folder
from sense7.privacy.croissant import (CROISSANT_FILE, AnnotationCounts, Column, RecordTable, StudyFacts,
                                      annotation_counts, croissant_document, croissant_problems, datasheet_lines,
                                      rai_fields, study_facts, write_croissant)
from sense7.privacy.participation import ConversationChoices, Withdrawals
from sense7.privacy.pii import scrub_conversations
from sense7.research.lewidi_format import write_lewidi
from sense7.research.quality import QualityPolicy, rater_quality
from sense7.research.study_analysis import quality_inputs, rated_tasks, static_predictions, with_predictions
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, Outbox
from sense7.store.study_design import LIVE_KIND, REPEAT_SUFFIX, StudyRecords
from sense7.store.tables import annotations, crowd_completions, rater_links, raters as raters_table

TABLES = ("ratings", "conversations", "raters", "predictions")
FORMATS = ("tidy", "lewidi")
RATER_PREFIX, CONVERSATION_PREFIX = "Ann", "Conv"
TOKEN = re.compile(r"[\w.:@+-]+")


class ExportError(ValueError):
    """An export that cannot be written (nothing to export, a format unknown, a value that must not leave)."""


@dataclass
class StudyExport:
    frames: dict[str, pd.DataFrame]
    columns: dict[str, tuple[Column, ...]]
    taxonomy: object
    facts: StudyFacts
    counts: AnnotationCounts
    with_ids: bool
    period: tuple[str, str] | None = None
    redaction: dict = field(default_factory=dict)

    def row_counts(self) -> dict[str, int]:
        return {name: len(frame) for name, frame in self.frames.items()}


@dataclass(frozen=True)
class Leaks:
    """Values no file of an export may hold (store ids only when the export was not asked for them)."""

    emails: frozenset = frozenset()
    secrets: frozenset = frozenset()  # link hashes and platform ids
    store_ids: frozenset = frozenset()


def forbidden_values(store: Store, with_ids: bool) -> Leaks:
    """The store's e-mail addresses, link hashes, crowd platform ids and (without `with_ids`) rater and
    conversation ids: what `write_export` refuses to write."""
    with store.engine.connect() as conn:
        emails = conn.execute(select(raters_table.c.email).where(raters_table.c.email.is_not(None))).scalars().all()
        hashes = conn.execute(select(rater_links.c.token_hash)).scalars().all()
        platform = conn.execute(select(crowd_completions.c.platform_id)).scalars().all()
        ids = [] if with_ids else [*_store_ids(store), *conn.execute(select(annotations.c.rater_id).distinct()).scalars()]
    return Leaks(emails=frozenset(e.lower() for e in emails), secrets=frozenset(hashes) | frozenset(platform),
                 store_ids=frozenset(i for i in ids if i))


# -- building ------------------------------------------------------------------------------------------------
def _pseudonyms(ids, prefix: str, taken: set) -> dict:
    """id -> prefix + a number, numbered in a random order (nothing in the number says which id it is);
    the prefix grows while a pseudonym would equal one of the store's ids."""
    ids = sorted(set(ids))
    secrets.SystemRandom().shuffle(ids)
    while any(f"{prefix}{n}" in taken for n in range(1, len(ids) + 1)):
        prefix += "_"
    return {value: f"{prefix}{n}" for n, value in enumerate(ids, start=1)}


def _store_ids(store: Store) -> set:
    from sense7.store.tables import conversations as conversations_table

    with store.engine.connect() as conn:
        return {*conn.execute(select(raters_table.c.rater_id)).scalars(),
                *conn.execute(select(conversations_table.c.conversation_id)).scalars()}


def _expectations(store: Store, annotation_ids: list[int]) -> dict[int, str | None]:
    out = {}
    with store.engine.connect() as conn:
        for start in range(0, len(annotation_ids), 500):
            chunk = [int(a) for a in annotation_ids[start:start + 500]]
            out.update(dict(conn.execute(select(annotations.c.annotation_id, annotations.c.expectation)
                                         .where(annotations.c.annotation_id.in_(chunk))).all()))
    return out


def _by_annotation(tasks: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """with_predictions indexed by annotation id (empty, with the columns used, when nothing pairs)."""
    joined = with_predictions(tasks, predictions) if len(predictions) else pd.DataFrame()
    if joined.empty:
        return pd.DataFrame(columns=["version", "kind", "levels", "expected", "generic_levels", "generic_expected",
                                     "own_ratings"], index=pd.Index([], name="annotation_id"))
    return joined.set_index("annotation_id")


def _level(record, key: str, control: str):
    if record is None:
        return None
    values = record[key]
    return values.get(control) if isinstance(values, dict) else None


class StudyExporter:
    """Reads a study's store once (the rated tasks, imported ratings, recorded predictions, arms, the rater
    page's timing, quality) and builds each table of its export from what it read."""

    def __init__(self, store: Store, taxonomy, design=None, policy: QualityPolicy | None = None,
                 with_ids: bool = False):
        self.store, self.taxonomy, self.design, self.with_ids = store, taxonomy, design, with_ids
        self.policy = policy or QualityPolicy()
        self.controls = list(taxonomy.controls)
        self.profile = [f.key for f in taxonomy.profile_fields]
        self.context_keys = [f.key for f in taxonomy.context_fields]

    def build(self) -> StudyExport:
        """The export's tables (see the module docstring). ExportError when the store holds no rating."""
        self._read()
        ratings = self._typed_sorted(self._rating_rows() + self._imported_rows(), _rating_columns(self.taxonomy, self.with_ids),
                                     ["conversation", "turn_index", "rater", "dimension", "is_repeat"])
        conversations, report = self._conversations()
        frames = {"ratings": ratings, "conversations": conversations,
                  "raters": _typed(pd.DataFrame(self._rater_rows()), _rater_columns(self.taxonomy, self.with_ids)),
                  "predictions": self._typed_sorted(self._prediction_rows(), _prediction_columns(self.with_ids),
                                                    ["conversation", "turn_index", "rater", "version", "dimension"])}
        counted = ratings[~ratings["is_repeat"]]
        counts = annotation_counts(((c, t if pd.notna(t) else None), r)
                                   for c, t, r in zip(counted["conversation"], counted["turn_index"], counted["rater"]))
        months = sorted(m for m in (_month((self.contexts.get(p) or {}).get("created")) for p in self.pairs) if m)
        return StudyExport(
            frames=frames,
            columns={"ratings": _rating_columns(self.taxonomy, self.with_ids),
                     "conversations": _conversation_columns(self.with_ids),
                     "raters": _rater_columns(self.taxonomy, self.with_ids),
                     "predictions": _prediction_columns(self.with_ids)},
            taxonomy=self.taxonomy, facts=study_facts(self.store, self.taxonomy, self.design), counts=counts,
            with_ids=self.with_ids, period=(months[0], months[-1]) if months else None, redaction=report.as_dict())

    # -- reading ---------------------------------------------------------------------------------------------
    def _read(self) -> None:
        store = self.store
        withdrawn = Withdrawals(store).pending_raters()
        left_out = ConversationChoices(store).out_of_study()

        def kept(frame: pd.DataFrame) -> pd.DataFrame:
            if frame.empty:
                return frame
            keep = [r not in withdrawn and (c, r) not in left_out
                    for c, r in zip(frame["conversation_id"], frame["rater_id"])]
            return frame[keep].reset_index(drop=True)

        self.tasks = kept(rated_tasks(store))
        self.imported = kept(store.imported_frame())
        self.predictions = kept(StudyRecords(store).predictions_frame())
        if self.tasks.empty and self.imported.empty:
            raise ExportError("nothing to export: the store holds no ratings (nothing was written)")
        frames = (self.tasks, self.imported, self.predictions)
        self.rater_ids = set().union(*(set(f["rater_id"]) for f in frames))
        self.conversation_ids = set().union(*(set(f["conversation_id"]) for f in frames))
        taken = _store_ids(store) | self.rater_ids | self.conversation_ids  # no pseudonym reads as a store id
        self.rater_of = _pseudonyms(self.rater_ids, RATER_PREFIX, taken)
        self.conversation_of = _pseudonyms(self.conversation_ids, CONVERSATION_PREFIX, taken)
        traits = store.raters_frame(self.rater_ids).reindex(sorted(self.rater_ids)).reindex(columns=self.profile)
        self.traits = {rid: {k: plain_value(v) for k, v in row.items()} for rid, row in traits.to_dict("index").items()}
        self.carried: dict = {}
        self.pairs = set(zip(self.tasks["conversation_id"], self.tasks["rater_id"])) | \
            set(zip(self.imported["conversation_id"], self.imported["rater_id"]))
        self.contexts = store.contexts_for(self.pairs)
        self.quality = self._quality()
        self.flags_of = {r: ",".join(f["flag"] for f in q["flags"]) for r, q in self.quality.items()}

    def _quality(self) -> dict:
        if self.tasks.empty:
            return {}
        frame, repeats = quality_inputs(self.tasks)
        instructed = InstructedAnswers(self.store).frame()
        instructed = instructed[instructed["rater_id"].isin(self.rater_ids)]
        return rater_quality(frame, self.policy, repeats=repeats, instructed=instructed if len(instructed) else None)

    def _ids(self, rater, conversation, **more) -> dict:
        """The store's ids of a row, with --with-ids only."""
        if not self.with_ids:
            return {}
        return {"store_rater_id": rater, "store_conversation_id": conversation, **more} if rater is not None \
            else {"store_conversation_id": conversation, **more}

    def _carried(self, rater, conversation) -> dict:
        """What every rating of (rater, conversation) carries: the context and the rater's traits, flags."""
        if (rater, conversation) not in self.carried:
            ctx = self.contexts.get((conversation, rater)) or {}
            row = {f"context_{k}": ctx.get(k) for k in self.context_keys}
            row["assistant_id"] = ctx.get("assistant_id") if isinstance(ctx.get("assistant_id"), str) else None
            row.update({f"trait_{k}": self._trait(rater, k) for k in self.profile})
            row["quality_flags"] = self.flags_of.get(rater, "")
            self.carried[(rater, conversation)] = row
        return self.carried[(rater, conversation)]

    def _trait(self, rater, key):
        return (self.traits.get(rater) or {}).get(key)

    # -- tables ----------------------------------------------------------------------------------------------
    def _rating_rows(self) -> list[dict]:
        tasks, predictions = self.tasks, self.predictions
        if tasks.empty:
            return []
        arms = StudyRecords(self.store).arms_frame()
        policy_of = dict(zip(arms["task_key"], arms["policy"])) if len(arms) else {}
        # Each rating with the prediction recorded last before it (study_analysis.with_predictions): the
        # one its rater saw (live ones included), the served version's own, the live one.
        seen = _by_annotation(tasks, predictions)
        static = _by_annotation(tasks, static_predictions(predictions))
        live = _by_annotation(tasks, predictions[predictions["kind"] == LIVE_KIND] if len(predictions) else predictions)
        expectation_of = _expectations(self.store, list(tasks["annotation_id"]))
        timing = Outbox(self.store).timings().set_index(["rater_id", "task_id"])
        rows = []
        for r in tasks.itertuples(index=False):
            a = r.annotation_id
            shown, stat, lv = (found.loc[a] if a in found.index else None for found in (seen, static, live))
            shown = shown if r.arm == "shown" else None
            clock = timing.loc[(r.rater_id, r.task_id)] if (r.rater_id, r.task_id) in timing.index else None
            # The page's own clock (its newest answer) first; Label Studio's lead time for other tasks.
            seconds = clock["seconds"] if clock is not None and pd.notna(clock["seconds"]) else r.lead_time
            base = {"rater": self.rater_of[r.rater_id], "conversation": self.conversation_of[r.conversation_id],
                    "turn_index": int(r.turn_index), "expectation": expectation_of.get(a),
                    "is_repeat": isinstance(r.repeat_of, str) and bool(r.repeat_of), "source": "annotation",
                    "arm": r.arm, "prefill_policy": policy_of.get(r.task_key),
                    "prefill_version": _value(shown, "version"), "prefill_kind": _value(shown, "kind"),
                    "model_version": _value(stat, "version"), "static_kind": _value(stat, "kind"),
                    "live_version": _value(lv, "version"), "live_own_ratings": plain_value(_value(lv, "own_ratings")),
                    "rated_at": r.created, "seconds_on_page": plain_value(seconds),
                    "page_seconds_total": plain_value(_value(clock, "seconds_total")),
                    "page_revisions": plain_value(_value(clock, "revisions")),
                    "first_submitted_at": _value(clock, "first_submitted_at"),
                    "last_submitted_at": _value(clock, "last_submitted_at"),
                    **self._carried(r.rater_id, r.conversation_id),
                    **self._ids(r.rater_id, r.conversation_id, task_id=int(r.task_id), annotation_id=int(a))}
            for control in self.controls:
                if control in r.values:
                    rows.append({**base, "dimension": control, "rating": int(r.values[control]),
                                 "prefill_shown": _level(shown, "levels", control),
                                 "static_level": _level(stat, "levels", control),
                                 "static_expected": _level(stat, "expected", control),
                                 "generic_level": _level(stat, "generic_levels", control),
                                 "generic_expected": _level(stat, "generic_expected", control),
                                 "live_level": _level(lv, "levels", control),
                                 "live_expected": _level(lv, "expected", control)})
        return rows

    def _imported_rows(self) -> list[dict]:
        """A pilot's imported ratings the store has not synced for the same turn and control (the store's
        own precedence, Store.rating_data), with their expectation answer."""
        tasks, imported, tax = self.tasks, self.imported, self.taxonomy
        synced = {(c, float(t), rid, d) for c, t, rid, values in zip(
            tasks["conversation_id"], tasks["turn_index"], tasks["rater_id"], tasks["values"]) for d in values}
        expectation = {(r.conversation_id, _turn(r.turn_index), r.rater_id): int(r.rating)
                       for r in imported[imported["dimension"] == tax.expectation_key].itertuples(index=False)}
        rows = []
        for r in imported[imported["dimension"].isin(self.controls)].itertuples(index=False):
            turn = _turn(r.turn_index)
            if (r.conversation_id, None if turn is None else float(turn), r.rater_id, r.dimension) in synced:
                continue
            score = expectation.get((r.conversation_id, turn, r.rater_id))
            rows.append({"rater": self.rater_of[r.rater_id], "conversation": self.conversation_of[r.conversation_id],
                         "turn_index": turn, "dimension": r.dimension, "rating": int(r.rating),
                         "expectation": tax.expectation_values[score - 1]
                         if score is not None and 1 <= score <= len(tax.expectation_values) else None,
                         "is_repeat": False, "source": "imported", **self._carried(r.rater_id, r.conversation_id),
                         **self._ids(r.rater_id, r.conversation_id)})
        return rows

    def _conversations(self):
        """Every message of every conversation named, scrubbed again (a batch imported with --no-scrub too)."""
        messages = self.store.conversations_by_id()
        cleaned, report = scrub_conversations([Conversation(c, "", messages[c], {})
                                               for c in sorted(self.conversation_ids) if c in messages])
        rows = [{"conversation": self.conversation_of[c.conversation_id], "message_index": i, "role": m.role,
                 "content": m.content, **self._ids(None, c.conversation_id)}
                for c in cleaned for i, m in enumerate(c.messages)]
        return self._typed_sorted(rows, _conversation_columns(self.with_ids), ["conversation", "message_index"]), report

    def _rater_rows(self) -> list[dict]:
        rows = []
        for rid in sorted(self.rater_ids, key=lambda r: self.rater_of[r]):
            q = self.quality.get(str(rid)) or {}
            rows.append({"rater": self.rater_of[rid], **{k: self._trait(rid, k) for k in self.profile},
                         "n_rated_tasks": q.get("n_tasks"), "median_seconds": q.get("median_seconds"),
                         "quality_flags": self.flags_of.get(rid, ""),
                         **({"store_rater_id": rid} if self.with_ids else {})})
        return rows

    def _prediction_rows(self) -> list[dict]:
        rows = []
        for p in self.predictions.itertuples(index=False):
            for control in self.controls:
                if control in (p.levels or {}):
                    rows.append({
                        "rater": self.rater_of[p.rater_id], "conversation": self.conversation_of[p.conversation_id],
                        "turn_index": int(p.turn_index), "is_repeat": str(p.task_key).endswith(REPEAT_SUFFIX),
                        "version": p.version, "kind": p.kind, "arm": p.arm, "dimension": control,
                        "level": p.levels.get(control), "expected": (p.expected or {}).get(control),
                        "generic_level": (p.generic_levels or {}).get(control),
                        "generic_expected": (p.generic_expected or {}).get(control),
                        "own_ratings": plain_value(p.own_ratings), "recorded_at": p.recorded_at,
                        **self._ids(p.rater_id, p.conversation_id)})
        return rows

    @staticmethod
    def _typed_sorted(rows: list[dict], columns: tuple[Column, ...], order: list[str]) -> pd.DataFrame:
        frame = _typed(pd.DataFrame(rows), columns)
        return frame.sort_values(order, na_position="first", kind="stable").reset_index(drop=True) if rows else frame


def build_export(store: Store, taxonomy, design=None, policy: QualityPolicy | None = None,
                 with_ids: bool = False) -> StudyExport:
    """The export's tables from the study's store (StudyExporter; see the module docstring)."""
    return StudyExporter(store, taxonomy, design, policy, with_ids).build()


def _value(record, key: str):
    return None if record is None else record[key]


def _turn(value):
    return None if value is None or pd.isna(value) else int(value)


def plain_value(value):
    """A pandas/numpy scalar as a plain Python value (None for missing)."""
    if value is None:
        return None
    if isinstance(value, float) and np.isnan(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.generic):
        value = value.item()
        return None if isinstance(value, float) and np.isnan(value) else value
    return value


def _month(value) -> str | None:
    from datetime import datetime

    if not isinstance(value, str) or len(value) < 7:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%Y-%m")
    except ValueError:
        return None


# -- columns -------------------------------------------------------------------------------------------------
PANDAS_TYPES = {"text": "string", "integer": "Int64", "float": "Float64", "boolean": "boolean",
                "datetime": "datetime64[ns, UTC]"}


def _typed(frame: pd.DataFrame, columns: tuple[Column, ...]) -> pd.DataFrame:
    """The frame with exactly `columns`, in order, each of its declared type (missing values as <NA>)."""
    out = pd.DataFrame(index=frame.index)
    for column in columns:
        values = frame[column.name] if column.name in frame else pd.Series([None] * len(frame), index=frame.index)
        if column.data_type == "datetime":
            out[column.name] = pd.to_datetime(values, utc=True, format="ISO8601")
        elif column.data_type == "text":
            out[column.name] = values.astype(object).where(values.notna(), None).map(
                lambda v: v if v is None else str(v)).astype("string")
        elif column.data_type == "boolean":
            out[column.name] = values.astype("boolean")
        else:
            out[column.name] = pd.to_numeric(values.astype(object).where(values.notna(), None)).astype(
                PANDAS_TYPES[column.data_type])
    return out


def _id_columns(*names: str) -> list[Column]:
    described = {"store_rater_id": "the store's rater id (--with-ids only)",
                 "store_conversation_id": "the store's conversation id (--with-ids only)",
                 "task_id": "Label Studio's task id (--with-ids only)",
                 "annotation_id": "Label Studio's annotation id (--with-ids only)"}
    types = {"task_id": "integer", "annotation_id": "integer"}
    return [Column(n, types.get(n, "text"), described[n]) for n in names]


def _rating_columns(taxonomy, with_ids: bool) -> tuple[Column, ...]:
    levels = f"1-{taxonomy.levels} ({', '.join(taxonomy.scale)})"
    columns = [
        Column("rater", "text", "the rater's pseudonym in this export (Ann<n>; the raters table's `rater`)"),
        Column("conversation", "text", "the conversation's pseudonym in this export (Conv<n>)"),
        Column("turn_index", "integer", "index in the conversation's messages of the rated assistant turn; "
                                        "empty = the whole conversation (imported ratings only)"),
        Column("dimension", "text", f"the control rated: {', '.join(taxonomy.controls)}"),
        Column("rating", "integer", f"the rater's rating, {levels}"),
        Column("expectation", "text", f"{taxonomy.expectation_title} ({', '.join(taxonomy.expectation_values)}); "
                                      "the same on every control of the turn"),
        Column("is_repeat", "boolean", "a test-retest repeat of a turn the rater rated before (never pre-filled)"),
        Column("source", "text", "annotation (rated in the study) or imported (a pilot's ratings.csv)"),
        Column("arm", "text", "the task's pre-fill arm: shown (the model's level pre-filled) or hidden"),
        Column("prefill_policy", "text", "the pre-fill policy the arm was drawn under (randomized, shown, hidden); "
                                         "empty: the task predates policies (shown)"),
        Column("prefill_shown", "integer", "the level pre-filled for this control (shown arm); empty when hidden "
                                           "or nothing was recorded before the rating"),
        Column("prefill_version", "text", "the model version of the pre-fill shown (<v>+live: a live pre-fill)"),
        Column("prefill_kind", "text", "which model the pre-fill shown came from: personalized, traits, generic, live"),
        Column("model_version", "text", "the served model version whose prediction was recorded last before the rating"),
        Column("static_kind", "text", "the kind of that version's prediction: personalized, traits or generic"),
        Column("static_level", "integer", "that version's predicted level (the one it would pre-fill)"),
        Column("static_expected", "float", "that version's expected rating (mean of its predicted distribution)"),
        Column("generic_level", "integer", "the generic model's predicted level (no rater information)"),
        Column("generic_expected", "float", "the generic model's expected rating"),
        Column("live_version", "text", "the version of the live prediction recorded before the rating, if any"),
        Column("live_level", "integer", "the live prediction's level (updated with the rater's newer answers)"),
        Column("live_expected", "float", "the live prediction's expected rating"),
        Column("live_own_ratings", "integer", "the rater's answers the live prediction used"),
        Column("rated_at", "datetime", "when Label Studio first held the rating (UTC)"),
        Column("seconds_on_page", "float", "seconds the rater spent on the task: the rater page's time for its "
                                           "newest answer (else Label Studio's lead time)"),
        Column("page_seconds_total", "float", "the rater page's seconds summed over every answer to the task"),
        Column("page_revisions", "integer", "answers the rater page stored for the task (1 = never changed)"),
        Column("first_submitted_at", "datetime", "the rater page's first answer to the task (UTC)"),
        Column("last_submitted_at", "datetime", "the rater page's latest answer to the task (UTC)"),
        Column("quality_flags", "text", "the rater's quality flags, comma-separated (too_fast, straight_lining, "
                                        "inconsistent, failed_instructed); empty: none"),
    ]
    columns += [Column(f"context_{f.key}", "integer" if f.type == "int" else "text", f"conversation context: {f.title}")
                for f in taxonomy.context_fields]
    columns.append(Column("assistant_id", "text", "the assistant model that answered, when the export named it"))
    columns += [Column(f"trait_{f.key}", "integer" if f.type == "int" else "text", f"rater trait: {f.title}")
                for f in taxonomy.profile_fields]
    if with_ids:
        columns += _id_columns("store_rater_id", "store_conversation_id", "task_id", "annotation_id")
    return tuple(columns)


def _conversation_columns(with_ids: bool) -> tuple[Column, ...]:
    columns = [Column("conversation", "text", "the conversation's pseudonym (the ratings' `conversation`)"),
               Column("message_index", "integer", "the message's index (a rating's turn_index names one)"),
               Column("role", "text", "user or assistant"),
               Column("content", "text", "the message, personal details replaced by [TYPE_n] placeholders")]
    return tuple(columns + (_id_columns("store_conversation_id") if with_ids else []))


def _rater_columns(taxonomy, with_ids: bool) -> tuple[Column, ...]:
    columns = [Column("rater", "text", "the rater's pseudonym (the ratings' `rater`)")]
    columns += [Column(f.key, "integer" if f.type == "int" else "text", f"{f.title} (as answered)")
                for f in taxonomy.profile_fields]
    columns += [Column("n_rated_tasks", "integer", "tasks the rater rated (repeats included)"),
                Column("median_seconds", "float", "the rater's median seconds per task"),
                Column("quality_flags", "text", "quality flags, comma-separated; empty: none")]
    return tuple(columns + (_id_columns("store_rater_id") if with_ids else []))


def _prediction_columns(with_ids: bool) -> tuple[Column, ...]:
    columns = [Column("rater", "text", "the rater's pseudonym"), Column("conversation", "text", "the conversation's pseudonym"),
               Column("turn_index", "integer", "the predicted turn"),
               Column("is_repeat", "boolean", "a prediction for a test-retest repeat task"),
               Column("version", "text", "model version (<v>+live: a live prediction)"),
               Column("kind", "text", "personalized, traits, generic or live"),
               Column("arm", "text", "the task's arm when recorded (shown or hidden)"),
               Column("dimension", "text", "the control predicted"),
               Column("level", "integer", "the predicted level (what a shown task pre-fills)"),
               Column("expected", "float", "the expected rating"),
               Column("generic_level", "integer", "the generic model's level"),
               Column("generic_expected", "float", "the generic model's expected rating"),
               Column("own_ratings", "integer", "live predictions: the rater's answers used"),
               Column("recorded_at", "datetime", "when the prediction was recorded (before its rater saw the task)")]
    return tuple(columns + (_id_columns("store_rater_id", "store_conversation_id") if with_ids else []))


# -- writing -------------------------------------------------------------------------------------------------
def _write_tables(export: StudyExport, folder: Path) -> None:
    (folder / "data").mkdir()
    (folder / "csv").mkdir()
    for name in TABLES:
        frame = export.frames[name]
        frame.to_parquet(folder / "data" / f"{name}.parquet", index=False)
        frame.to_csv(folder / "csv" / f"{name}.csv", index=False, lineterminator="\n",
                     date_format="%Y-%m-%dT%H:%M:%S.%fZ")


def _schema(export: StudyExport) -> dict:
    files = {name: {"parquet": f"data/{name}.parquet", "csv": f"csv/{name}.csv", "rows": len(export.frames[name]),
                    "columns": {c.name: {"type": c.data_type, "description": c.description}
                                for c in export.columns[name]}} for name in TABLES}
    return {"format": "tidy", "with_ids": export.with_ids, "files": files,
            "pseudonyms": "raters Ann<n>, conversations Conv<n>: numbered in a random order drawn for this export",
            "redaction": export.redaction}


TABLE_TEXT = {
    "ratings": "one row per rater x turn x control, with everything the rating carries",
    "conversations": "one row per message of every conversation rated or predicted",
    "raters": "one row per rater: traits as answered, rated tasks, median seconds, quality flags",
    "predictions": "every recorded prediction: one row per task x model version x control",
}


def _rai(export: StudyExport) -> dict:
    return rai_fields(export.taxonomy, export.facts, export.counts, export.period, traits="as answered")


def _readme(export: StudyExport, rai: dict) -> str:
    counts = export.row_counts()
    configs = "\n".join(f"- config_name: {name}\n  data_files:\n  - split: train\n    path: data/{name}.parquet"
                        + ("\n  default: true" if name == "ratings" else "") for name in TABLES)
    tax = export.taxonomy
    dims = "\n".join(f"- **{key}**" for key in tax.controls)
    profile = ", ".join(f.key for f in tax.profile_fields)
    ids = ("This export holds the store's ids (`--with-ids`): keep it inside the study's team."
           if export.with_ids else "Raters and conversations carry pseudonyms drawn for this export; no store id.")
    return f"""---
pretty_name: sense7 study export
license: other
configs:
{configs}
---

# Per-turn empathy ratings: the study's export

Written by `sense7 export`: the study team's working copy, not a release (traits are as answered, not
k-anonymous; use `sense7 release` to publish). {ids}
Load a table with `datasets.load_dataset("<this folder>", "ratings")`, `pandas.read_parquet("data/ratings.parquet")`
or the same table in `csv/`; `schema.json` describes every column, `{CROISSANT_FILE}` is the Croissant 1.1 description.

## Controls
{dims}

## Questionnaire
Profile (the `raters` table): {profile}.

## Counts
| table | rows |
| --- | --- |
""" + "\n".join(f"| {name} | {counts[name]} |" for name in TABLES) + """

## Responsible-AI fields (the same as in croissant.json)
""" + "\n".join(datasheet_lines(rai)) + "\n"


def _tidy_croissant(export: StudyExport, folder: Path, rai: dict) -> dict:
    files = {}
    for name in TABLES:
        files[f"data/{name}.parquet"] = f"{name} ({TABLE_TEXT[name]}), Parquet"
        files[f"csv/{name}.csv"] = f"{name}, the same rows as CSV"
    tables = [RecordTable(name, f"data/{name}.parquet", TABLE_TEXT[name], export.columns[name]) for name in TABLES]
    return croissant_document(folder, "sense7 study export", "Per-turn empathy ratings of assistant conversations "
                              "by the study's raters, with their traits, the pre-fills they saw and the models' "
                              "recorded predictions (perspectivist: one row per rater).", files, tables, rai,
                              "Not for redistribution: the study team's export (see README.md)",
                              keywords=["empathy", "perspectivism", "human-AI conversation", "ratings"])


def scan_for_leaks(folder: Path, leaks: Leaks) -> list[str]:
    """Files of `folder` (text ones: CSV, JSON, JSONL, Markdown) holding a forbidden value: "file: holds
    <kind>" (never the value). Parquet files hold the same rows as their CSV."""
    problems = []
    long_ids = {i for i in leaks.store_ids if len(i) >= 6}  # ("r1" would match ordinary words and numbers)
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix == ".parquet":
            continue
        text = path.read_text(encoding="utf-8")
        tokens = set(TOKEN.findall(text))
        lowered = text.lower()
        found = set()
        if any(e in lowered for e in leaks.emails):
            found.add("a rater's e-mail")
        if tokens & leaks.secrets:
            found.add("a link hash or platform id")
        if tokens & long_ids or any(i in text for i in long_ids if not TOKEN.fullmatch(i)):
            found.add("an id of the study's store")
        problems += [f"{path.relative_to(folder)}: holds {kind}" for kind in sorted(found)]
    return problems


def write_export(export: StudyExport, out: str | Path, fmt: str = "tidy", leaks: Leaks | None = None) -> Path:
    """Write the export into `out` (new or empty; FolderNotFree otherwise) in `fmt` (FORMATS); ExportError
    when the Croissant file fails its check or a file would hold a forbidden value: nothing is written."""
    if fmt not in FORMATS:
        raise ExportError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r} (nothing was written)")
    out = Path(out)
    with staged_folder(out) as staging:
        if fmt == "tidy":
            rai = _rai(export)
            _write_tables(export, staging)
            (staging / "schema.json").write_text(json.dumps(_schema(export), indent=1) + "\n", encoding="utf-8")
            (staging / "README.md").write_text(_readme(export, rai), encoding="utf-8")
            write_croissant(staging, _tidy_croissant(export, staging, rai))
        else:
            write_lewidi(export, staging, _rai(export))
        problems = croissant_problems(staging)
        problems += scan_for_leaks(staging, leaks or Leaks())
        if problems:
            raise ExportError(f"{out}: the export fails its check (nothing was written):\n"
                              + "\n".join(f"  {p}" for p in problems[:20]))
    return out
