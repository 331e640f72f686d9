"""An anonymized release of a study: what a study publishes, and the check that it is what it claims.

`build_release(data, taxonomy, k)` turns the store's `RatingData` into release tables:
- ratings: per turn (or whole conversation), every control and the expectation answer;
- conversations: the texts, scrubbed again here (sense7.data.pii; a batch imported with --no-scrub too);
- contexts: per (conversation, rater), the taxonomy's context fields, the assistant, the month it was held;
- raters: the traits, generalized (values merged into bands) field by field until every combination of
  traits is shared by at least k raters; raters still alone after that have all their traits suppressed
  ("*"). A fully suppressed row says nothing, so it is the one combination allowed to be rarer than k.
Rater and conversation ids are new random ones (nothing maps them back); free-text comments, titles,
e-mails, link secrets and Label Studio ids are not in it; excluded and withdrawn data are left out by the caller.

`write_release(release, out)` writes JSONL and CSV, a schema and a datasheet README whose YAML header is
the layout the Hugging Face `datasets` loader reads (`load_dataset(DIR, "ratings")`), and croissant.json
(Croissant 1.1 with the RAI fields: sense7.data.croissant). It writes into a
temporary sibling folder and renames it into place: a failure leaves nothing half-written.

`check_release(dir, originals)` verifies k, that no e-mail address, link secret, original rater or
conversation id or detected personal detail appears, and that the counts add up.
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

from sense7.data.croissant import (CROISSANT_FILE, StudyFacts, croissant_problems, croissant_texts, release_document,
                                   write_croissant)
from sense7.data.pii import Scrubber, detected_values, scrub_conversations
from sense7.taxonomy import Taxonomy

SUPPRESSED = "*"
TABLES = ("ratings", "conversations", "contexts", "raters")
# Files at a release's root besides data/ and csv/ (issue 42 added the Croissant metadata; check_release
# verifies it with sense7.data.croissant.croissant_problems and scans its strings like every other file).
KNOWN_FILES = ("schema.json", "README.md", CROISSANT_FILE)
RATER_ID = re.compile(r"^r[0-9a-f]{10}$")
CONVERSATION_ID = re.compile(r"^c[0-9a-f]{10}$")
SECRET_LIKE = re.compile(r"[A-Za-z0-9_-]{40,}")  # a link secret (43 url-safe chars) or a SHA-256 hex digest
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
    study: StudyFacts | None = None  # the store's facts for the Croissant RAI fields (sense7.data.croissant)

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


def _month(value) -> str | None:
    if not isinstance(value, str) or len(value) < 7:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%Y-%m")
    except ValueError:
        return None


def build_release(data, taxonomy: Taxonomy, k: int = 5, exclude_raters=(), exclude_conversations=()) -> Release:
    """The release tables of a study's RatingData (store.rating_data(taxonomy)). `exclude_*`: raters who
    withdrew and conversations left out of the release (their rows are absent, not anonymized)."""
    if k < 2:
        raise ReleaseError(f"--k must be at least 2, got {k}")
    excluded_raters, excluded_convs = set(exclude_raters), set(exclude_conversations)
    ratings = data.ratings[~data.ratings["rater_id"].isin(excluded_raters)
                           & ~data.ratings["conversation_id"].isin(excluded_convs)]
    pairs = sorted({(c, r) for c, r in zip(ratings["conversation_id"], ratings["rater_id"])
                    if (c, r) in data.conversations})
    ratings = ratings[[p in set(pairs) for p in zip(ratings["conversation_id"], ratings["rater_id"])]]
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
        month = _month(ctx.get("created"))
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
    files["conversations"]["csv_columns"] = ["conversation_id", "message_index", "role", "content"]
    return {"k": release.k, "suppressed_raters": release.suppressed_raters,
            "generalization_levels": release.generalization, "files": files}


def _csv_rows(name: str, rows: list[dict], columns: list[str]):
    if name == "conversations":
        yield ["conversation_id", "message_index", "role", "content"]
        for row in rows:
            for index, message in enumerate(row["messages"]):
                yield [row["conversation_id"], index, message["role"], message["content"]]
        return
    yield columns
    for row in rows:
        yield ["" if row[c] is None else row[c] for c in columns]


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
the same tables are in `csv/`; `schema.json` describes every column.

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
                csv.writer(fh, lineterminator="\n").writerows(_csv_rows(name, release.tables[name], release.columns[name]))
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


# -- checking ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Originals:
    """What must never appear in a release: the store's rater ids, e-mails, conversation ids and link hashes."""

    rater_ids: frozenset = frozenset()
    conversation_ids: frozenset = frozenset()
    emails: frozenset = frozenset()
    link_hashes: frozenset = frozenset()


def _read_jsonl(path: Path, problems: list[str]) -> list[dict]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path}: cannot read ({exc})")
        return rows
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{number}: malformed JSON ({exc.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"{path}:{number}: not an object")
            continue
        rows.append(row)
    return rows


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def check_release(folder: str | Path, originals: Originals | None = None, k: int | None = None) -> dict:
    """Verify a release; returns {"k", "counts"} or raises ReleaseError listing every problem (never a value
    found: only the file, row, field and kind). `k`: the least k to accept (default: the one it claims)."""
    folder = Path(folder)
    originals = originals or Originals()
    problems: list[str] = []
    schema_path = folder / "schema.json"
    if not folder.is_dir():
        raise ReleaseError(f"{folder}: not a folder")
    try:
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
        files = schema["files"]
        claimed_k = int(schema["k"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"{schema_path}: missing or not a sense7 release schema ({type(exc).__name__})") from None
    want_k = max(k or 0, claimed_k)
    if k is not None and claimed_k < k:
        problems.append(f"{schema_path}: k: the release claims k={claimed_k}, less than the {k} asked for")
    tables = {}
    for name in TABLES:
        if name not in files:
            problems.append(f"{schema_path}: files.{name}: missing")
            continue
        path = folder / files[name]["jsonl"]
        rows = tables[name] = _read_jsonl(path, problems)
        columns = list(files[name]["columns"])
        for number, row in enumerate(rows, start=1):
            if list(row) != columns:
                problems.append(f"{path}:{number}: columns {sorted(row)} differ from the schema's")
                break
        if len(rows) != files[name]["rows"]:
            problems.append(f"{path}: {len(rows)} rows, the schema says {files[name]['rows']}")
        csv_path = folder / files[name]["csv"]
        try:
            with open(csv_path, encoding="utf-8", newline="") as fh:
                reader = list(csv.reader(fh))
        except OSError as exc:
            problems.append(f"{csv_path}: cannot read ({exc.strerror})")
            continue
        header = files[name].get("csv_columns", columns)
        expected_rows = sum(len(r["messages"]) for r in rows) if name == "conversations" else len(rows)
        if not reader or reader[0] != header or len(reader) - 1 != expected_rows:
            problems.append(f"{csv_path}: header or row count differs from {files[name]['jsonl']}")
    readme = folder / "README.md"
    readme_text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if not readme_text.startswith("---\n") or "configs:" not in readme_text:
        problems.append(f"{readme}: missing or without the datasets loader's YAML header")
    for name, rows in tables.items():
        if f"| {name} | {len(rows)} |" not in readme_text:
            problems.append(f"{readme}: the count of {name} does not match {files[name]['jsonl']} ({len(rows)} rows)")
    problems += _check_croissant(folder, originals)  # croissant.json (KNOWN_FILES)
    if len(tables) == len(TABLES):
        problems += _check_links(tables, files)
        problems += _check_k(tables["raters"], list(files["raters"]["columns"])[1:], want_k, folder / files["raters"]["jsonl"])
        problems += _check_contents(tables, files, folder, originals)
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        raise ReleaseError(f"{folder}: the release fails its check ({len(problems)} problem(s)):\n{shown}{more}")
    return {"k": claimed_k, "counts": {name: len(rows) for name, rows in tables.items()}}


def _check_links(tables, files) -> list[str]:
    problems = []
    raters = {r.get("rater_id") for r in tables["raters"]}
    messages = {r.get("conversation_id"): r.get("messages") or [] for r in tables["conversations"]}
    for name in ("ratings", "contexts"):
        for number, row in enumerate(tables[name], start=1):
            where = f"{files[name]['jsonl']}:{number}"
            if row.get("rater_id") not in raters:
                problems.append(f"{where}: rater_id: not in the raters table")
            if row.get("conversation_id") not in messages:
                problems.append(f"{where}: conversation_id: not in the conversations table")
            elif name == "ratings" and row.get("turn_index") is not None:
                turn = row["turn_index"]
                conv = messages[row["conversation_id"]]
                if not isinstance(turn, int) or not 0 <= turn < len(conv) or conv[turn].get("role") != "assistant":
                    problems.append(f"{where}: turn_index: not an assistant turn of its conversation")
    for name, pattern, column in (("raters", RATER_ID, "rater_id"), ("conversations", CONVERSATION_ID, "conversation_id")):
        for number, row in enumerate(tables[name], start=1):
            if not isinstance(row.get(column), str) or not pattern.match(row[column]):
                problems.append(f"{files[name]['jsonl']}:{number}: {column}: not a release id")
    rated = {r.get("rater_id") for r in tables["ratings"]}
    if raters - rated:
        problems.append(f"{files['raters']['jsonl']}: {len(raters - rated)} rater(s) without a rating")
    return problems


def _check_k(raters: list[dict], fields: list[str], k: int, path: Path) -> list[str]:
    combos = Counter(tuple(r.get(f) for f in fields) for r in raters)
    suppressed = tuple(SUPPRESSED for _ in fields)
    small = {combo: n for combo, n in combos.items() if n < k and combo != suppressed}
    if not small:
        return []
    return [f"{path}: {sum(small.values())} rater(s) in {len(small)} trait combination(s) shared by fewer than {k}"]


def _secret_like(text: str, hashes: frozenset) -> bool:
    """A run of 43 url-safe characters mixing cases and digits (a link secret) or a stored link hash."""
    for match in SECRET_LIKE.finditer(text):
        token = match.group()
        if token in hashes:
            return True
        if len(token) == 43 and re.search(r"[a-z]", token) and re.search(r"[A-Z]", token) and re.search(r"\d", token):
            return True
    return False


def _check_contents(tables, files, folder: Path, originals: Originals) -> list[str]:
    problems = []
    scrubber = Scrubber()
    ids = originals.rater_ids | originals.conversation_ids
    long_ids = {i for i in ids if len(i) >= 6}  # short ones ("r1") would match ordinary words and numbers
    emails = {e.lower() for e in originals.emails}
    seen: dict[str, set] = {}  # the same value (a dimension, a band) is scanned once
    for name, rows in tables.items():
        for number, row in enumerate(rows, start=1):
            where = f"{files[name]['jsonl']}:{number}"
            for key in ("rater_id", "conversation_id"):
                if row.get(key) in ids:
                    problems.append(f"{where}: {key}: an id of the study's store")
            found = set()
            # Release ids are checked against their pattern in _check_links; every other string is scanned.
            for text in _strings({k: v for k, v in row.items() if k not in ("rater_id", "conversation_id")}):
                if text not in seen:
                    seen[text] = {kind for kind, _ in detected_values(text, scrubber)}
                found |= seen[text]
                if _secret_like(text, originals.link_hashes):
                    found.add("a link secret or hash")
                lowered = text.lower()
                if emails and any(e in lowered for e in emails):
                    found.add("a rater's e-mail")
                if long_ids and set(re.findall(r"[\w.:@-]+", text)) & long_ids:
                    found.add("an id of the study's store")
            problems += [f"{where}: holds {kind}" for kind in sorted(found)]
    return problems


def _check_croissant(folder: Path, originals: Originals) -> list[str]:
    """croissant.json: it parses, conforms to Croissant 1.1, has the RAI fields, names only the release's
    files with their right checksums (croissant_problems); and its texts pass the same scan as the tables'."""
    problems = croissant_problems(folder)
    try:
        document = json.loads((folder / CROISSANT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return problems  # already reported
    texts = {CROISSANT_FILE: [{"texts": list(croissant_texts(document))}]} if isinstance(document, dict) else {}
    return problems + _check_contents(texts, {CROISSANT_FILE: {"jsonl": CROISSANT_FILE}}, folder, originals)


def originals_from_store(store) -> Originals:
    """The store's rater ids, e-mails, conversation ids and link hashes (what a release must not contain)."""
    from sqlalchemy import select

    from sense7.data.store import conversations, rater_links, raters

    with store.engine.connect() as conn:
        rater_rows = conn.execute(select(raters.c.rater_id, raters.c.email)).all()
        conversation_ids = conn.execute(select(conversations.c.conversation_id)).scalars().all()
        hashes = conn.execute(select(rater_links.c.token_hash)).scalars().all()
        linked = conn.execute(select(rater_links.c.rater_id)).scalars().all()
    return Originals(rater_ids=frozenset([r.rater_id for r in rater_rows] + list(linked)),
                     conversation_ids=frozenset(conversation_ids),
                     emails=frozenset(r.email for r in rater_rows if r.email), link_hashes=frozenset(hashes))
