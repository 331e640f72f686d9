"""An anonymized release of a study: what a study publishes, and the check that it is what it claims.

`build_release(data, taxonomy, k)` turns the store's `RatingData` into release tables:
- ratings: per turn (or whole conversation), every control and the expectation answer;
- conversations: the texts, scrubbed again here (sense7.privacy.pii; a batch imported with --no-scrub too);
- contexts: per (conversation, rater), the taxonomy's context fields, the assistant, the month it was held;
- raters: the traits, generalized (values merged into bands) field by field until every combination of
  traits is shared by at least k raters; raters still alone after that have all their traits suppressed
  ("*"). A fully suppressed row says nothing, so it is the one combination allowed to be rarer than k.
Rater and conversation ids are new random ones (nothing maps them back); free-text comments, titles,
e-mails, link secrets and Label Studio ids are not in it; excluded and withdrawn data are left out by the caller.

`write_release(release, out)` writes JSONL and CSV, a schema and a datasheet README whose YAML header is
the layout the Hugging Face `datasets` loader reads (`load_dataset(DIR, "ratings")`), and croissant.json
(Croissant 1.1 with the RAI fields: sense7.privacy.croissant). It writes into a
temporary sibling folder and renames it into place: a failure leaves nothing half-written.

Its check (`sense7.privacy.release_check.check_release`) reads the whole folder: `write_release` calls it on
the staging folder before the rename.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import secrets
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from sense7.files import spreadsheet_cell, spreadsheet_rows
from sense7.privacy.croissant import StudyFacts, release_document, write_croissant
from sense7.privacy.pii import scrub_conversations
from sense7.taxonomy import Taxonomy

SUPPRESSED = "*"
TABLES = ("ratings", "conversations", "contexts", "raters")
RATER_ID = re.compile(r"^r[0-9a-f]{10}$")
CONVERSATION_ID = re.compile(r"^c[0-9a-f]{10}$")
MAX_SUPPRESSED_SHARE = 0.1  # generalize further while more than this share of raters would be suppressed


class ReleaseError(ValueError):
    """A release that cannot be written (target folder not empty, nothing to release) or that fails its check."""


@dataclass
class Release:
    tables: dict[str, list[dict]]
    columns: dict[str, list[str]]
    k: int
    generalization: dict[str, int]  # trait field -> level (0 raw ... top = suppressed)
    suppressed_raters: int
    taxonomy: Taxonomy
    period: tuple[str, str] | None  # first and last month a conversation was held, when known
    redaction: dict = field(default_factory=dict)
    study: StudyFacts | None = None  # the store's facts for the Croissant RAI fields (sense7.privacy.croissant)

    def counts(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self.tables.items()}


# -- generalization of traits ------------------------------------------------------------------------------
def _hierarchy(fld) -> list[dict]:
    """For each level above 0, a map raw value -> generalized value: bands of a third, then halves, then "*"."""
    values = [str(v) for v in range(fld.min, fld.max + 1)] if fld.type == "int" else list(fld.choices)
    levels = []
    for parts in (3, 2):
        size = math.ceil(len(values) / parts)
        if size <= 1:
            continue
        mapping = {}
        for start in range(0, len(values), size):
            group = values[start:start + size]
            label = (f"{group[0]}-{group[-1]}" if fld.type == "int" else "/".join(group)) if len(group) > 1 else group[0]
            mapping.update({v: label for v in group})
        levels.append(mapping)
    levels.append({v: SUPPRESSED for v in values})
    return levels


def _raw_value(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""  # missing stays missing (its own value)
    return str(int(value)) if isinstance(value, float) and value == int(value) else str(value)


def _generalized(raw: list[tuple], levels: list[int], hierarchies: list[list[dict]]) -> list[tuple]:
    return [tuple(v if not level or not v else hierarchy[level - 1].get(v, SUPPRESSED)
                  for v, level, hierarchy in zip(row, levels, hierarchies)) for row in raw]


def _too_small(rows: list[tuple], k: int) -> list[int]:
    """Positions of the raters whose combination of (generalized) traits fewer than k raters share."""
    sizes = Counter(rows)
    return [i for i, row in enumerate(rows) if sizes[row] < k]


def k_anonymous_traits(raw: pd.DataFrame, taxonomy: Taxonomy, k: int) -> tuple[pd.DataFrame, dict[str, int], int]:
    """(generalized traits, level per field, raters suppressed): greedy full-domain generalization (the
    field whose next level leaves the fewest raters in classes smaller than k is raised first, until at
    most MAX_SUPPRESSED_SHARE of raters remain there), then those raters' traits suppressed."""
    fields = [f for f in taxonomy.profile_fields if f.key in raw.columns]
    hierarchies = [_hierarchy(f) for f in fields]
    rows = [tuple(_raw_value(v) for v in values) for values in raw[[f.key for f in fields]].itertuples(index=False)]
    levels = [0] * len(fields)
    budget = int(MAX_SUPPRESSED_SHARE * len(rows))
    while len(_too_small(_generalized(rows, levels, hierarchies), k)) > budget:
        options = []
        for i, fld in enumerate(fields):
            if levels[i] < len(hierarchies[i]):
                trial = levels[:i] + [levels[i] + 1] + levels[i + 1:]
                left = len(_too_small(_generalized(rows, trial, hierarchies), k))
                options.append((left, -len({row[i] for row in rows}), i))
        if not options:
            break
        levels[min(options)[2]] += 1
    generalized = _generalized(rows, levels, hierarchies)
    small = set(_too_small(generalized, k))
    generalized = [tuple(SUPPRESSED for _ in row) if i in small else row for i, row in enumerate(generalized)]
    frame = pd.DataFrame(generalized, index=raw.index, columns=[f.key for f in fields])
    return frame, {f.key: level for f, level in zip(fields, levels)}, len(small)


# -- building ------------------------------------------------------------------------------------------------
def _new_ids(old: list[str], prefix: str) -> dict[str, str]:
    out, used = {}, set()
    for value in old:
        while (new := f"{prefix}{secrets.token_hex(5)}") in used:
            pass
        used.add(new)
        out[value] = new
    return out


def month_of(value) -> str | None:
    """An ISO timestamp's year and month ("2026-11"), the only date a release or an export keeps; None when
    it is not one."""
    if not isinstance(value, str) or len(value) < 7:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%Y-%m")
    except ValueError:
        return None


def build_release(data, taxonomy: Taxonomy, k: int = 5, exclude_raters=(), exclude_conversations=(),
                  exclude_ratings=()) -> Release:
    """The release tables of a study's RatingData (store.rating_data(taxonomy)). `exclude_*`: raters who
    withdrew, conversations left out of the release (with everyone's ratings of them) and (conversation_id,
    rater_id) pairs whose ratings are left out (the rest of the conversation stays); their rows are absent,
    not anonymized."""
    if k < 2:
        raise ReleaseError(f"--k must be at least 2, got {k}")
    excluded_raters, excluded_convs, excluded_pairs = set(exclude_raters), set(exclude_conversations), set(exclude_ratings)
    ratings = data.ratings[~data.ratings["rater_id"].isin(excluded_raters)
                           & ~data.ratings["conversation_id"].isin(excluded_convs)]
    if excluded_pairs:
        ratings = ratings[[pair not in excluded_pairs for pair in zip(ratings["conversation_id"], ratings["rater_id"])]]
    pairs = sorted({(c, r) for c, r in zip(ratings["conversation_id"], ratings["rater_id"])
                    if (c, r) in data.conversations})
    stored = set(pairs)  # built once: a set per row made a large study's build quadratic
    ratings = ratings[[p in stored for p in zip(ratings["conversation_id"], ratings["rater_id"])]]
    if ratings.empty:
        raise ReleaseError("nothing to release: the store holds no ratings of stored conversations")
    rater_ids = _new_ids(sorted({r for _, r in pairs}), "r")
    conv_ids = _new_ids(sorted({c for c, _ in pairs}), "c")

    # Conversations: one text per conversation, scrubbed again (no participant list here: the generic detectors).
    texts = {}
    for cid, rid in pairs:
        texts.setdefault(cid, data.conversations[(cid, rid)])
    cleaned, report = scrub_conversations(list(texts.values()))
    conversations = [{"conversation_id": conv_ids[c.conversation_id],
                      "messages": [{"role": m.role, "content": m.content} for m in c.messages]}
                     for c in cleaned]
    conversations.sort(key=lambda row: row["conversation_id"])

    context_keys = [f.key for f in taxonomy.context_fields]
    contexts, months = [], []
    for cid, rid in pairs:
        ctx = data.conversations[(cid, rid)].context or {}
        month = month_of(ctx.get("created"))
        months += [month] if month else []
        row = {"conversation_id": conv_ids[cid], "rater_id": rater_ids[rid]}
        row.update({key: ctx.get(key) for key in context_keys})
        row["assistant_id"] = ctx.get("assistant_id") if isinstance(ctx.get("assistant_id"), str) else None
        row["month"] = month
        contexts.append(row)
    contexts.sort(key=lambda row: (row["conversation_id"], row["rater_id"]))

    rating_rows = [{"conversation_id": conv_ids[r.conversation_id],
                    "turn_index": None if pd.isna(r.turn_index) else int(r.turn_index),
                    "rater_id": rater_ids[r.rater_id], "dimension": r.dimension, "rating": int(r.rating)}
                   for r in ratings.itertuples(index=False)]
    rating_rows.sort(key=lambda row: (row["conversation_id"], -1 if row["turn_index"] is None else row["turn_index"],
                                      row["rater_id"], row["dimension"]))

    profile = [f.key for f in taxonomy.profile_fields]
    raw = data.raters.reindex(sorted(rater_ids)).reindex(columns=profile)
    traits, levels, suppressed = k_anonymous_traits(raw, taxonomy, k)
    raters = [{"rater_id": rater_ids[rid], **{key: (value or None) for key, value in row.items()}}
              for rid, row in traits.iterrows()]
    raters.sort(key=lambda row: row["rater_id"])
    return Release(
        tables={"ratings": rating_rows, "conversations": conversations, "contexts": contexts, "raters": raters},
        columns={"ratings": ["conversation_id", "turn_index", "rater_id", "dimension", "rating"],
                 "conversations": ["conversation_id", "messages"],
                 "contexts": ["conversation_id", "rater_id", *context_keys, "assistant_id", "month"],
                 "raters": ["rater_id", *profile]},
        k=k, generalization=levels, suppressed_raters=suppressed, taxonomy=taxonomy,
        period=(min(months), max(months)) if months else None, redaction=report.as_dict())


# -- writing -------------------------------------------------------------------------------------------------
def _schema(release: Release) -> dict:
    tax = release.taxonomy
    described = {
        "conversation_id": ("string", "random id of the conversation in this release"),
        "rater_id": ("string", "random id of the rater in this release (nothing maps it back)"),
        "turn_index": ("integer|null", "index in `messages` of the rated assistant turn; null = the whole conversation"),
        "dimension": ("string", f"a control ({', '.join(tax.controls)}) or {tax.expectation_key}"),
        "rating": ("integer", f"1-{tax.levels} for a control; for {tax.expectation_key} 1-"
                              f"{len(tax.expectation_choices)} = {', '.join(v for v, _ in tax.expectation_choices)}"),
        "messages": ("list of {role, content}", "the conversation, personal details replaced by [TYPE_n]"),
        "assistant_id": ("string|null", "the model that answered, when the export named it"),
        "month": ("string|null", "YYYY-MM the conversation was held, when known"),
    }
    for fld in tax.context_fields:
        described[fld.key] = ("string|null" if fld.type == "choice" else "integer|null", fld.title)
    for fld in tax.profile_fields:
        described[fld.key] = ("string|null", f"{fld.title} (generalized: a band or a/b/c; '*' = suppressed)")
    files = {}
    for name, columns in release.columns.items():
        files[name] = {"jsonl": f"data/{name}.jsonl", "csv": f"csv/{name}.csv", "rows": len(release.tables[name]),
                       "columns": {c: {"type": described[c][0], "description": described[c][1]} for c in columns}}
    files["conversations"]["csv_columns"] = list(CONVERSATION_CSV_COLUMNS)
    return {"k": release.k, "suppressed_raters": release.suppressed_raters,
            "generalization_levels": release.generalization, "files": files}


CONVERSATION_CSV_COLUMNS = ["conversation_id", "message_index", "role", "content"]


def csv_header(name: str, columns: list[str]) -> list[str]:
    """The header of a table's CSV: its columns, or one row per message for the conversations."""
    return list(CONVERSATION_CSV_COLUMNS) if name == "conversations" else list(columns)


def csv_rows_of(name: str, row: dict, columns: list[str]) -> list[list[str]]:
    """The CSV rows of one table row, as csv.reader reads them back (what `release --check` compares)."""
    if name == "conversations":
        messages = row.get("messages") if isinstance(row.get("messages"), list) else []
        return [[_cell(row.get("conversation_id")), str(index), _cell(m.get("role")), _cell(m.get("content"))]
                for index, m in enumerate(messages) if isinstance(m, dict)]
    return [[_cell(row.get(c)) for c in columns]]


def _cell(value) -> str:
    # The cell as written (sense7.files.spreadsheet_cell: a text that would start a formula gets its leading
    # apostrophe), so that the check compares what the writer wrote; data/*.jsonl keeps the exact text.
    return "" if value is None else spreadsheet_cell(str(value))


def _csv_rows(name: str, rows: list[dict], columns: list[str]):
    yield csv_header(name, columns)
    for row in rows:
        yield from csv_rows_of(name, row, columns)


def _readme(release: Release, schema: dict) -> str:
    tax = release.taxonomy
    counts = release.counts()
    configs = "\n".join(
        f"- config_name: {name}\n  data_files:\n  - split: train\n    path: data/{name}.jsonl"
        + ("\n  default: true" if name == "ratings" else "") for name in TABLES)
    period = f"{release.period[0]} to {release.period[1]}" if release.period else "not recorded"
    generalized = ", ".join(f"{key} (level {level})" for key, level in release.generalization.items() if level) or "none"
    replaced = ", ".join(f"{t} {n}" for t, n in release.redaction.get("replaced", {}).items() if n) or "none"
    dims = "\n".join(f"- **{d.key}** ({d.title}): {d.definition}" for d in tax.dimensions)
    profile = ", ".join(f"{f.key} ({f.title})" for f in tax.profile_fields)
    context = ", ".join(f"{f.key} ({f.title})" for f in tax.context_fields)
    return f"""---
pretty_name: sense7 study release
license: other
language:
- en
task_categories:
- text-classification
configs:
{configs}
---

# Per-turn empathy ratings of assistant conversations (anonymized release)

Released {datetime.now(timezone.utc).strftime("%Y-%m")} with `sense7 release`.
Load a table with `datasets.load_dataset("<this folder>", "ratings")` (configs: {", ".join(TABLES)});
the same tables are in `csv/` (where a text that a spreadsheet would run as a formula, one starting with
`=`, `+`, `-` or `@`, starts with an apostrophe; `data/` holds every text exactly); `schema.json` describes
every column, and `croissant.json` describes the same tables as Croissant 1.1 metadata with its Responsible-AI
fields (annotation protocol, platform, annotations per item, annotator demographics; `mlcroissant.Dataset`
reads it).

## What was collected and how
Participants rated the assistant turns of conversations (their own, donated from their assistants' data
exports, or assigned ones) on a {tax.levels}-point scale ({", ".join(tax.scale)}) in Label Studio through
sense7's rater page, answered whether each turn met their expectation, and filled in a profile questionnaire.
Conversations were collected {period} (months only).

## Taxonomy
{dims}
- **{tax.overall.key}** ({tax.overall.title}): {tax.overall.definition}
- **{tax.expectation_key}**: {tax.expectation_title} ({", ".join(label for _, label in tax.expectation_choices)})

## Questionnaire
Profile (the `raters` table): {profile}.
Context of each conversation (the `contexts` table): {context}.

## Counts
| table | rows |
| --- | --- |
""" + "\n".join(f"| {name} | {counts[name]} |" for name in TABLES) + f"""

## Anonymization
- Rater and conversation ids are new random ones; nothing in or outside the release maps them back.
- Personal details in the texts (e-mail addresses, phone numbers, URLs, IP addresses, card numbers, IBANs,
  participants' names and listed terms) were replaced by typed placeholders such as `[EMAIL_1]` at import,
  and the texts scrubbed again for this release (replaced here: {replaced}).
- Traits are {release.k}-anonymous: every combination of trait values is shared by at least {release.k}
  raters. Generalized: {generalized}. {release.suppressed_raters} rater(s) had all traits suppressed (`*`).
- Dates are given to the month. Free-text comments, conversation titles, e-mail addresses and Label Studio
  ids are not released. Participants who withdrew and conversations left out of the release are absent.

## Known limitations
- Names are found only when the participant listed them (or their account file held them): a third person
  named in a conversation may remain. Detectors are patterns with checks (Luhn, IBAN mod-97, phone metadata);
  unusual formats can be missed and number look-alikes replaced.
- Generalization and suppression lose trait detail; small studies lose most of it.

## Licence
TODO: the study's licence and terms of use (placeholder).
"""


def write_release(release: Release, out: str | Path, verify=None) -> Path:
    """Write the release into `out` (new or empty) atomically; ReleaseError when `out` holds anything.
    `verify(folder)`: called on the complete release before it is moved into place (check_release): when it
    raises, nothing is left behind."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ReleaseError(f"{out}: {'not a folder' if not out.is_dir() else 'not empty'}; "
                           "give a new or empty folder (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (staging / "data").mkdir()
        (staging / "csv").mkdir()
        for name in TABLES:
            with open(staging / "data" / f"{name}.jsonl", "w", encoding="utf-8", newline="\n") as fh:
                for row in release.tables[name]:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            with open(staging / "csv" / f"{name}.csv", "w", encoding="utf-8", newline="") as fh:
                csv.writer(fh, lineterminator="\n").writerows(
                    spreadsheet_rows(_csv_rows(name, release.tables[name], release.columns[name])))
        schema = _schema(release)
        (staging / "schema.json").write_text(json.dumps(schema, indent=1) + "\n", encoding="utf-8")
        (staging / "README.md").write_text(_readme(release, schema), encoding="utf-8")
        write_croissant(staging, release_document(release, staging, schema))  # last: it holds the files' checksums
        # The study's data until the team publishes it: the owner's only, like every data file sense7 writes.
        for path in staging.rglob("*"):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
        os.chmod(staging, 0o700)
        if verify is not None:
            verify(staging)
        if out.exists():
            out.rmdir()  # empty (checked above); rename needs the name free
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
