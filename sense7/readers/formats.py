"""Read and validate the files users give us: conversations (native JSONL, CSV, OpenAI-style JSONL),
assignments, rater traits (raters.csv) and ratings (ratings.csv). This is the one reader of every user
file: the importer, `sense7 evaluate`/`analyze` (through `load_native`) and the crowd pool all call it.

The whole file is checked before anything is written anywhere. Every problem names the file, the line,
the field and the reason; all problems are collected (up to a cap) so a user fixes a file in one pass.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sense7.data.conversations import ROLES, Conversation, Message
from sense7.files import FORMULA_START, forbidden_character
from sense7.taxonomy import Taxonomy

if TYPE_CHECKING:  # imported where used: reading a file needs neither pandas nor the scrubber
    from sense7.data.dataset import RatingData
    from sense7.privacy.pii import Identifiers

MAX_ID_CHARS = 200
MAX_JSON_DEPTH = 64  # nested objects and lists in one JSON value; a conversation line needs 4
MAX_CONTENT_CHARS = 50_000
MAX_MESSAGES = 1_000
MAX_LINE_BYTES = 5_000_000
MAX_PROBLEMS = 50
FORMATS = ("native", "csv", "openai")


@dataclass(frozen=True)
class Problem:
    path: str
    line: int | None
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.field}: {self.reason}"


class FormatError(ValueError):
    """One or more problems in an input file (each file:line: field: reason); nothing has been written.

    One problem is one line of text; several are listed one a line (at most MAX_PROBLEMS of them)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        if len(problems) == 1:
            super().__init__(str(problems[0]))
            return
        shown = "\n".join(f"  {p}" for p in problems[:MAX_PROBLEMS])
        more = f"\n  ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        super().__init__(f"{len(problems)} problems:\n{shown}{more}")


class _Collector:
    def __init__(self, path: Path):
        self.path = str(path)
        self.problems: list[Problem] = []

    def add(self, line: int | None, field: str, reason: str) -> None:
        self.problems.append(Problem(self.path, line, field, reason))

    def raise_if_any(self) -> None:
        if self.problems:
            raise FormatError(self.problems)


def _decoded_lines(path: Path, problems: _Collector):
    """(line number, text) for each line; a line that is not UTF-8 is reported, not guessed."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        problems.add(None, "file", f"cannot read: {exc.strerror}")
        return
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    for number, chunk in enumerate(raw.split(b"\n"), start=1):
        if len(chunk) > MAX_LINE_BYTES:
            problems.add(number, "line", f"longer than {MAX_LINE_BYTES:,} bytes")
            continue
        try:
            yield number, chunk.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            problems.add(number, "encoding", f"invalid UTF-8 at byte {exc.start}")


def id_problem(text: str) -> str | None:
    """Why `text` (stripped) cannot be an id (a conversation's, a rater's, anything a CSV shows later), or None."""
    if not text:
        return "empty"
    if len(text) > MAX_ID_CHARS:
        return f"longer than {MAX_ID_CHARS} characters"
    if "::" in text:
        return "must not contain '::' (it separates the parts of a task key)"
    if text.startswith(FORMULA_START):
        return "must not start with '=', '+', '-' or '@' (a spreadsheet opening a CSV of it would run a formula)"
    return forbidden_character(text)


def _check_id(value, line: int, field: str, problems: _Collector) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        problems.add(line, field, "missing" if value is None else f"must be a string, got {type(value).__name__}")
        return None
    text = str(value).strip()
    if (why := id_problem(text)) is not None:
        problems.add(line, field, why)
        return None
    return text


def _check_context(raw, line: int, tax: Taxonomy, problems: _Collector) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add(line, "context", f"must be an object, got {type(raw).__name__}")
        return {}
    fields = {f.key: f for f in tax.context_fields}
    context = {}
    for key, value in raw.items():
        if key not in fields:
            problems.add(line, f"context.{key}", f"unknown field (expected one of {', '.join(fields)})")
        elif value is None or value == "":
            continue
        elif isinstance(value, str) and (why := forbidden_character(value)) is not None:
            problems.add(line, f"context.{key}", why)
        else:
            try:
                context[key] = fields[key].validate(value)
            except ValueError as exc:
                problems.add(line, f"context.{key}", str(exc))
    return context


def _message_text(content) -> str | None:
    """Plain text of a message; OpenAI exports may use a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        texts = [p.get("text") for p in content if p.get("type") in ("text", None)]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    return None


def _check_message(msg, line: int, where: str, problems: _Collector) -> bool:
    if not isinstance(msg, dict):
        problems.add(line, where, "must be an object with role and content")
        return False
    ok = True
    role = msg.get("role")
    if role not in ROLES:
        problems.add(line, f"{where}.role", f"unknown role {role!r} (expected user, assistant or system)")
        ok = False
    text = _message_text(msg.get("content"))
    if text is None:
        problems.add(line, f"{where}.content", "missing or not text")
        ok = False
    elif not text.strip():
        problems.add(line, f"{where}.content", "empty")
        ok = False
    elif len(text) > MAX_CONTENT_CHARS:
        problems.add(line, f"{where}.content", f"longer than {MAX_CONTENT_CHARS:,} characters")
        ok = False
    elif (why := forbidden_character(text)) is not None:
        problems.add(line, f"{where}.content", why)
        ok = False
    return ok


def _check_messages(raw, line: int, problems: _Collector, field: str = "messages") -> list[Message] | None:
    if not isinstance(raw, list):
        problems.add(line, field, "missing" if raw is None else "must be a list of messages")
        return None
    if not raw:
        problems.add(line, field, "empty conversation")
        return None
    if len(raw) > MAX_MESSAGES:
        problems.add(line, field, f"more than {MAX_MESSAGES} messages")
        return None
    messages = [Message(m["role"], _message_text(m["content"])) for i, m in enumerate(raw)
                if _check_message(m, line, f"{field}[{i}]", problems)]
    if len(messages) != len(raw):
        return None
    if not any(m.role == "assistant" for m in messages):
        problems.add(line, field, "no assistant message: nothing to rate")
        return None
    return messages


class JSONTooDeep(ValueError):
    """A JSON text nested deeper than MAX_JSON_DEPTH; `line` and `column` (1-based, in that text) say where."""

    def __init__(self, line: int, column: int):
        self.line, self.column = line, column
        super().__init__(f"nested deeper than {MAX_JSON_DEPTH} levels (at line {line}, column {column})")


JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def parse_json(text: str):
    """json.loads with nesting bounded (MAX_JSON_DEPTH): every JSON text a user gives is read through this.
    Raises json.JSONDecodeError for malformed JSON and JSONTooDeep, naming where, for a value nested deeper
    (Python's own decoder would raise RecursionError from about 1,000 levels on)."""
    try:
        value = json.loads(text)
    except RecursionError:
        pass
    else:
        if _depth_within(value, MAX_JSON_DEPTH):
            return value
    depth = 0
    for token in JSON_TOKENS.finditer(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(token.group(), 0)
        if depth > MAX_JSON_DEPTH:
            line = text.count("\n", 0, token.start()) + 1
            raise JSONTooDeep(line, token.start() - text.rfind("\n", 0, token.start()))
    raise JSONTooDeep(1, 1)  # not reached: the value is deeper than the bound, so its text is too


def _depth_within(value, limit: int) -> bool:
    """Whether a parsed JSON value nests at most `limit` objects and lists (without recursion)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _parse_json_line(text: str, number: int, problems: _Collector):
    try:
        obj = parse_json(text)
    except json.JSONDecodeError as exc:
        problems.add(number, "json", f"malformed JSON ({exc.msg} at column {exc.colno})")
        return None
    except JSONTooDeep as exc:
        problems.add(number, "json", f"nested deeper than {MAX_JSON_DEPTH} levels (at column {exc.column})")
        return None
    if not isinstance(obj, dict):
        problems.add(number, "json", f"each line must be a JSON object, got {type(obj).__name__}")
        return None
    return obj


def _json_objects(path: Path, problems: _Collector):
    """(line number, object) for every non-blank line of a JSONL file that parses to a JSON object."""
    for number, text in _decoded_lines(path, problems):
        if text.strip() and (obj := _parse_json_line(text, number, problems)) is not None:
            yield number, obj


def _read_native(path: Path, problems: _Collector, tax: Taxonomy, rater: str | None) -> list[Conversation]:
    out = []
    for number, obj in _json_objects(path, problems):
        cid = _check_id(obj.get("conversation_id"), number, "conversation_id", problems)
        rid = _check_id(obj.get("rater_id", rater), number, "rater_id", problems)
        messages = _check_messages(obj.get("messages"), number, problems)
        context = _check_context(obj.get("context"), number, tax, problems)
        if cid and rid and messages:
            out.append(Conversation(cid, rid, messages, context, line=number))
    return out


def _read_openai(path: Path, problems: _Collector, tax: Taxonomy, rater: str | None) -> list[Conversation]:
    if rater is None:
        problems.add(None, "--rater", "an OpenAI-style export names no rater: pass --rater RATER_ID")
    rid = _check_id(rater, None, "--rater", problems) if rater is not None else None
    out = []
    for number, obj in _json_objects(path, problems):
        messages = _check_messages(obj.get("messages"), number, problems)
        given = obj.get("conversation_id", obj.get("id"))
        if given is not None:
            cid = _check_id(given, number, "conversation_id", problems)
        elif messages:
            # No id in the export: derive one from the content, so re-importing the file is idempotent.
            digest = hashlib.sha256(json.dumps([[m.role, m.content] for m in messages]).encode()).hexdigest()
            cid = f"oa-{digest[:16]}"
        else:
            cid = None
        context = _check_context(obj.get("context"), number, tax, problems)
        if cid and rid and messages:
            out.append(Conversation(cid, rid, messages, context, line=number))
    return out


def _csv_rows(path: Path, problems: _Collector, required: tuple[str, ...]):
    """(line number, row dict) for a CSV file with a header; validates encoding and the header."""
    lines = list(_decoded_lines(path, problems))
    if problems.problems:
        return
    text = "\n".join(t for _, t in lines)
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    missing = [c for c in required if c not in header]
    if missing:
        problems.add(1, "header", f"missing column(s): {', '.join(missing)}")
        return
    try:
        for row in reader:
            if None in row:
                problems.add(reader.line_num, "row", "more values than header columns")
                continue
            if all((v or "").strip() == "" for v in row.values()):
                continue
            refused = [(k, why) for k, v in row.items() if v and (why := forbidden_character(v)) is not None]
            for column, why in refused:
                problems.add(reader.line_num, column, why)
            if refused:
                continue
            yield reader.line_num, {k: (v or "").strip() if k != "content" else (v or "") for k, v in row.items()}
    except csv.Error as exc:
        problems.add(reader.line_num, "csv", str(exc))


def _read_csv(path: Path, problems: _Collector, tax: Taxonomy, rater: str | None) -> list[Conversation]:
    """One message per row: conversation_id, [rater_id], role, content, [context fields]."""
    required = ("conversation_id", "role", "content") + (() if rater else ("rater_id",))
    grouped: dict[str, dict] = {}
    context_keys = [f.key for f in tax.context_fields]
    for number, row in _csv_rows(path, problems, required):
        cid = _check_id(row.get("conversation_id"), number, "conversation_id", problems)
        rid = _check_id(row.get("rater_id") or rater, number, "rater_id", problems)
        if not cid or not rid:
            continue
        conv = grouped.setdefault(cid, {"rater": rid, "line": number, "messages": [], "context": {}})
        if conv["rater"] != rid:
            problems.add(number, "rater_id", f"conversation {cid} has rater {conv['rater']} on line {conv['line']}")
        conv["messages"].append((number, {"role": row.get("role"), "content": row.get("content")}))
        raw_ctx = {k: row[k] for k in context_keys if row.get(k)}
        conv["context"].update(_check_context(raw_ctx, number, tax, problems))
    out = []
    for cid, conv in grouped.items():
        messages = []
        for number, msg in conv["messages"]:
            if _check_message(msg, number, "message", problems):
                messages.append(Message(msg["role"], msg["content"]))
        if len(messages) != len(conv["messages"]):
            continue
        if not any(m.role == "assistant" for m in messages):
            problems.add(conv["line"], "conversation_id", f"conversation {cid} has no assistant message")
            continue
        out.append(Conversation(cid, conv["rater"], messages, conv["context"], line=conv["line"]))
    return out


def detect_format(path: Path) -> str:
    if path.suffix.lower() == ".csv":
        return "csv"
    try:
        with path.open("rb") as fh:
            for raw in fh:
                if raw.strip():
                    obj = parse_json(raw.decode("utf-8", errors="replace"))
                    if isinstance(obj, dict) and "conversation_id" not in obj and "messages" in obj \
                            and "rater_id" not in obj:
                        return "openai"
                    break
    except (OSError, ValueError):  # malformed or too deep: the reader names the line
        pass
    return "native"


def read_conversations(path: str | Path, taxonomy: Taxonomy, fmt: str | None = None,
                       rater: str | None = None) -> list[Conversation]:
    """Read and validate a whole batch against the study's taxonomy (its context fields). Raises
    FormatError listing every problem; returns nothing partial."""
    path = Path(path)
    problems = _Collector(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    reader = {"native": _read_native, "csv": _read_csv, "openai": _read_openai}[fmt]
    conversations = reader(path, problems, taxonomy, rater)
    seen: dict[str, int | None] = {}
    for conv in conversations:
        if conv.conversation_id in seen:
            problems.add(conv.line, "conversation_id",
                         f"duplicate id {conv.conversation_id!r} (first on line {seen[conv.conversation_id]})")
        seen.setdefault(conv.conversation_id, conv.line)
    if not conversations and not problems.problems:
        problems.add(None, "file", "no conversations found")
    problems.raise_if_any()
    return conversations


def read_assignments(path: str | Path, conversations: list[Conversation]) -> list[Conversation]:
    """Fan conversations out to the raters listed in an assignments CSV (conversation_id, rater_id).

    The conversation's own rater keeps it; each extra rater gets a copy without the owner's context
    (context is what *that* rater felt, so it is not shared)."""
    path = Path(path)
    problems = _Collector(path)
    by_id = {c.conversation_id: c for c in conversations}
    pairs = {(c.conversation_id, c.rater_id) for c in conversations}
    extra = []
    for number, row in _csv_rows(path, problems, ("conversation_id", "rater_id")):
        cid = _check_id(row["conversation_id"], number, "conversation_id", problems)
        rid = _check_id(row["rater_id"], number, "rater_id", problems)
        if not cid or not rid:
            continue
        if cid not in by_id:
            problems.add(number, "conversation_id", f"{cid!r} is not in the conversations file")
            continue
        if (cid, rid) in pairs:
            continue
        pairs.add((cid, rid))
        source = by_id[cid]
        extra.append(Conversation(cid, rid, source.messages, {}, line=source.line))
    problems.raise_if_any()
    return conversations + extra


def read_raters(path: str | Path, taxonomy: Taxonomy, extra_columns: bool = False) -> list[dict]:
    """Validate a rater-traits CSV: rater_id, optional email, and taxonomy profile fields (blank = unknown).

    Rows are {"rater_id", "email", "traits"}; traits in the file's column order. With extra_columns,
    columns that are not profile fields (e.g. a study's own numeric traits) are kept as text instead of
    being reported."""
    path = Path(path)
    problems = _Collector(path)
    fields = {f.key: f for f in taxonomy.profile_fields}
    rows, seen = [], {}
    header_checked = False
    columns: list[str] = []
    for number, row in _csv_rows(path, problems, ("rater_id",)):
        if not header_checked:
            header_checked = True
            columns = [c for c in row if c not in ("rater_id", "email")]
            unknown = [c for c in columns if c not in fields]
            if unknown and not extra_columns:
                problems.add(1, "header", f"unknown column(s) {', '.join(unknown)}; expected rater_id, email, "
                                          f"{', '.join(fields)}")
                break
        rid = _check_id(row["rater_id"], number, "rater_id", problems)
        if rid in seen:
            problems.add(number, "rater_id", f"duplicate {rid!r} (first on line {seen[rid]})")
            continue
        if rid:
            seen[rid] = number
        email = (row.get("email") or "").strip().lower()
        if email and ("@" not in email or len(email) > 320 or " " in email):
            problems.add(number, "email", f"not an email address: {email!r}")
        traits = {}
        for key in columns:
            value = row.get(key, "")
            if value == "":
                continue
            if key not in fields:
                traits[key] = value
                continue
            try:
                traits[key] = fields[key].validate(value)
            except ValueError as exc:
                problems.add(number, key, str(exc))
        if rid:
            rows.append({"rater_id": rid, "email": email or None, "traits": traits})
    if not rows and not problems.problems:
        problems.add(None, "file", "no raters found")
    emails = {}
    for row in rows:
        if row["email"] and row["email"] in emails:
            problems.add(seen[row["rater_id"]], "email", f"{row['email']} is also rater {emails[row['email']]}")
        emails.setdefault(row["email"], row["rater_id"])
    problems.raise_if_any()
    return rows


def raters_frame(rows: list[dict], taxonomy: Taxonomy):
    """read_raters' rows as the dataset layer's frame: index rater_id, columns email and the traits in file
    order, NaN where blank; extra (non-profile) columns become numbers when every value parses."""
    import numpy as np
    import pandas as pd

    profile = {f.key for f in taxonomy.profile_fields}
    columns = ["email"] if any(r["email"] for r in rows) else []
    for row in rows:
        columns += [k for k in row["traits"] if k not in columns]
    records = {r["rater_id"]: {"email": r["email"] or np.nan, **r["traits"]} for r in rows}
    frame = pd.DataFrame.from_dict(records, orient="index", columns=columns)
    frame.index.name = "rater_id"
    for column in frame.columns:
        if column in profile or column == "email":
            continue
        converted = pd.to_numeric(frame[column], errors="coerce")
        if converted.notna().sum() == frame[column].notna().sum():
            frame[column] = converted
    return frame


RATING_COLUMNS = ["conversation_id", "turn_index", "rater_id", "dimension", "rating"]
TAXONOMY_HINT = "pass the study's taxonomy with --taxonomy FILE or SENSE7_TAXONOMY"


def read_ratings(path: str | Path, taxonomy: Taxonomy, conversations=None):
    """Validate ratings.csv (conversation_id, turn_index, rater_id, dimension, rating) against the
    taxonomy's controls and scale, and (given the conversations, as a list or a {(conversation_id,
    rater_id): Conversation} dict) against the rated conversations' assistant turns.

    A rater with no line of their own for a conversation that has a line shares that line's text (several
    raters per conversation): a conversations dict given is completed in place with those pairs.

    Returns a frame with those columns (turn_index Int64, NA = the whole conversation). Raises FormatError
    listing every problem; a dimension that is not a control of the taxonomy is reported once per value."""
    import pandas as pd

    path = Path(path)
    problems = _Collector(path)
    if isinstance(conversations, (list, tuple)):
        conversations = {(c.conversation_id, c.rater_id): c for c in conversations}
    shared_texts = {cid: conv for (cid, _), conv in (conversations or {}).items()}
    known = taxonomy.controls + [taxonomy.expectation_key]
    n_expect = len(taxonomy.expectation_choices)
    unknown_dims: dict[str, list[int]] = {}
    records, first_seen, hinted = [], {}, False
    for number, row in _csv_rows(path, problems, RATING_COLUMNS):
        ok = True
        cid = _check_id(row["conversation_id"], number, "conversation_id", problems)
        rid = _check_id(row["rater_id"], number, "rater_id", problems)
        dim = row["dimension"]
        if not dim:
            problems.add(number, "dimension", "empty")
            ok = False
        elif dim not in known:
            unknown_dims.setdefault(dim, []).append(number)
            ok = False
        raw_turn = row["turn_index"]
        turn = None
        if raw_turn:
            if not raw_turn.isdigit():
                problems.add(number, "turn_index", f"expected a non-negative integer or blank, got {raw_turn!r}")
                ok = False
            else:
                turn = int(raw_turn)
        top = n_expect if dim == taxonomy.expectation_key else taxonomy.levels
        raw_rating = row["rating"]
        if not raw_rating.isdigit() or not 1 <= int(raw_rating) <= top:
            hint = ""
            if raw_rating.isdigit() and int(raw_rating) > top and dim != taxonomy.expectation_key and not hinted:
                # Probably another study's scale: say once how to pass the right taxonomy.
                hint, hinted = f" (taxonomy {taxonomy.source.name} has a {top}-point scale; {TAXONOMY_HINT})", True
            problems.add(number, "rating", f"expected an integer 1-{top}, got {raw_rating!r}{hint}")
            ok = False
        if conversations is not None and cid and rid:
            conv = conversations.get((cid, rid))
            if conv is None and cid in shared_texts:
                # One conversation line shared by every rater who rated it (a text rated by several people):
                # this rater gets its text without the owner's context (context is what *that* rater felt).
                source = shared_texts[cid]
                conv = conversations[(cid, rid)] = Conversation(cid, rid, source.messages, {}, line=source.line)
            if conv is None:
                problems.add(number, "conversation_id",
                             f"no conversation {cid!r} in the conversations file")
                ok = False
            elif turn is not None and turn not in conv.assistant_turns():
                problems.add(number, "turn_index", f"{turn} is not an assistant turn of conversation {cid!r}")
                ok = False
        if not (ok and cid and rid):
            continue
        key = (cid, turn, rid, dim)
        if key in first_seen:
            problems.add(number, "dimension", f"duplicate rating for {cid}/{'' if turn is None else turn}/{rid}/"
                                              f"{dim} (first on line {first_seen[key]})")
            continue
        first_seen[key] = number
        records.append((cid, pd.NA if turn is None else turn, rid, dim, int(raw_rating)))
    for dim, lines in unknown_dims.items():
        others = f" (and on {len(lines) - 1} more line(s))" if len(lines) > 1 else ""
        problems.add(lines[0], "dimension", f"{dim!r} is not a control of the taxonomy {taxonomy.source.name} "
                                            f"({', '.join(known)}){others}; {TAXONOMY_HINT}")
    problems.problems.sort(key=lambda p: (p.line is not None, p.line or 0))
    problems.raise_if_any()
    frame = pd.DataFrame.from_records(records, columns=RATING_COLUMNS)
    frame["turn_index"] = frame["turn_index"].astype("Int64")
    frame["rating"] = frame["rating"].astype(int)
    return frame


# ---------------------------------------------------------------------------------------------------
# A study's native files as one RatingData, and a participant's list of identifiers to scrub


def load_native(conversations_path, ratings_path, raters_path=None, *, taxonomy: Taxonomy,
                assignments_path=None) -> RatingData:
    """conversations.jsonl + ratings.csv (+ raters.csv) validated against the taxonomy. Raises FormatError
    listing every problem of a file as file:line: field: reason.

    Several raters per conversation: one line per conversation is enough (every rater in ratings.csv shares
    its text), or `assignments_path` (conversation_id, rater_id, as `sense7 import --assignments`)."""
    import pandas as pd

    from sense7.data.dataset import RatingData

    batch = read_conversations(conversations_path, taxonomy)
    if assignments_path:
        batch = read_assignments(assignments_path, batch)
    conversations = {}
    for conv in batch:
        conversations[(conv.conversation_id, conv.rater_id)] = conv
    if raters_path:
        raters = raters_frame(read_raters(raters_path, taxonomy, extra_columns=True), taxonomy)
    else:
        raters = pd.DataFrame(index=pd.Index([], name="rater_id"))
    ratings = read_ratings(ratings_path, taxonomy, conversations)
    return RatingData(conversations, ratings, raters)


def read_identifier_list(path) -> Identifiers:
    """A per-participant list, one entry a line: a name (`Jane Doe`, the default), or `term: Acme Corp`,
    `email: x@example.org`, `phone: +44 20 7946 0000`, `name: ...`. Blank lines and `#` comments are skipped.
    Raises FormatError (file:line: field: reason) for an unknown prefix or an empty entry."""
    from sense7.privacy.pii import Identifiers

    path = Path(path)
    kinds = {"name": [], "term": [], "email": [], "phone": []}
    problems = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FormatError([Problem(str(path), None, "file", f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError as exc:
        raise FormatError([Problem(str(path), None, "encoding", f"invalid UTF-8 at byte {exc.start}")]) from None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        kind, sep, value = text.partition(":")
        if sep and kind.strip().lower() in kinds:
            kind, value = kind.strip().lower(), value.strip()
        elif sep and " " not in kind.strip() and kind.strip().isalpha():
            problems.append(Problem(str(path), number, "entry",
                                    f"unknown kind {kind.strip()!r} (expected name, term, email or phone)"))
            continue
        else:
            kind, value = "name", text
        if not value:
            problems.append(Problem(str(path), number, kind, "empty"))
            continue
        kinds[kind].append(value)
    if problems:
        raise FormatError(problems)
    return Identifiers(tuple(kinds["name"]), tuple(kinds["term"]), tuple(kinds["email"]), tuple(kinds["phone"]))
