"""`sense7 release --check`: a release folder read whole, every file of it, before anything leaves the team.

The release's own layout is the allow-list (`LAYOUT`: what `write_release` writes): any other file or folder,
a symbolic link or a file that is not plain is refused, whatever its name or depth. Every file's text is
scanned: each value of the JSONL tables (keys too), each CSV cell, each string of `schema.json` and each
line of the README (its YAML front matter decoded as well, so an escape hides nothing), for:
- e-mail addresses (sense7.privacy.pii's pattern, internationalized addresses included) and the store's own
  rater e-mails (exactly, case-insensitively, wherever they appear);
- phone numbers, URLs, IP addresses, card numbers and IBANs (sense7.privacy.pii's detectors);
- link secrets: a 43-character url-safe token whose SHA-256 the store holds (`rater_links`), or any token
  of that shape; and the stored hashes themselves (link and resume-code hashes);
- the store's rater ids, conversation ids and platform ids (`crowd_completions`), inside texts too
  (`IdNeedles`: one Aho-Corasick automaton over all of them). An id too short to tell from an ordinary
  word or number (under 4 characters, or digits only under 8) is matched as a whole value of an id
  column only; the check's result counts them.
Each finding is `file:line: field: holds KIND at character N`: never the value found. The tables are also
read for what they claim: release ids, links between tables, every CSV cell equal to its JSONL row, k,
and the counts of the schema and the README. Nothing in the folder is written or changed.
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import ahocorasick
import yaml

from sense7.privacy.croissant import CROISSANT_FILE, croissant_problems
from sense7.privacy.pii import PLACEHOLDER, Scrubber
from sense7.privacy.release import (CONVERSATION_ID, RATER_ID, SUPPRESSED, TABLES, ReleaseError, csv_header,
                                    csv_rows_of)

# What write_release writes, and nothing else.
FOLDERS = ("data", "csv")
LAYOUT = {"schema.json", "README.md", CROISSANT_FILE, *(f"data/{name}.jsonl" for name in TABLES),
          *(f"csv/{name}.csv" for name in TABLES)}
# Read in this order so that ratings and contexts are checked against the tables they point into, row by row.
READ_ORDER = ("conversations", "raters", "contexts", "ratings")
ID_COLUMNS = {"rater_id": RATER_ID, "conversation_id": CONVERSATION_ID}

LINK_SECRET_LENGTH = 43  # secrets.token_urlsafe(32), sense7.store.rater_page_tables.TOKEN_BYTES
URL_SAFE_RUN = re.compile(r"[A-Za-z0-9_-]{%d,}" % LINK_SECRET_LENGTH)
MIN_ID_IN_TEXT = 4      # shorter store ids ("r1", "p07") are ordinary words: matched as whole id values only
MIN_NUMERIC_ID_IN_TEXT = 8  # an id of digits only ("1234") is an ordinary number below this length
JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
JSON_COLON = re.compile(r"\s*:")
JSON_SCALAR = re.compile(r"-?\d[\d.eE+-]*|true|false|null")
MAX_SHOWN = 50
MAX_STRANGER_BYTES = 64 << 20  # of a file the release does not hold: refused whatever it holds, scanned this far
DETECTED = {"EMAIL": "an e-mail address (EMAIL)", "PHONE": "a phone number (PHONE)", "URL": "a URL (URL)",
            "IP": "an IP address (IP)", "CARD": "a card number (CARD)", "IBAN": "an IBAN (IBAN)",
            "PERSON": "a name (PERSON)", "TERM": "a listed term (TERM)"}
RATER_EMAIL = "a rater's e-mail of the store"
RATER = "a rater id of the store"
CONVERSATION = "a conversation id of the store"
PLATFORM = "a platform id of the store"
HASH = "a link or resume-code hash of the store"
SECRET = "a link secret of the store"
SECRET_LIKE = "a token shaped like a link secret"


@dataclass(frozen=True)
class Originals:
    """What must never appear in a release: the store's rater ids, conversation ids, rater e-mails, link
    (and resume-code) hashes and platform ids."""

    rater_ids: frozenset = frozenset()
    conversation_ids: frozenset = frozenset()
    emails: frozenset = frozenset()
    link_hashes: frozenset = frozenset()
    platform_ids: frozenset = frozenset()


def originals_from_store(store) -> Originals:
    """Every rater id and conversation id any table of the store holds, the raters' e-mails, the hashes of
    links and resume codes, and the platform ids of crowd studies (`crowd_completions`)."""
    from sqlalchemy import select

    from sense7.store import tables

    found: dict[str, set] = {"rater_id": set(), "conversation_id": set()}
    with store.engine.connect() as conn:
        for table in tables.metadata.sorted_tables:
            for column in found:
                if column in table.c:
                    found[column].update(v for v in conn.execute(select(table.c[column]).distinct()).scalars() if v)
        emails = conn.execute(select(tables.raters.c.email).where(tables.raters.c.email.is_not(None))).scalars().all()
        hashes = set(conn.execute(select(tables.rater_links.c.token_hash)).scalars())
        hashes |= {h for h in conn.execute(select(tables.crowd_participants.c.resume_hash)).scalars() if h}
        platform = set()
        for row in conn.execute(select(tables.crowd_completions.c.platform_id,
                                       tables.crowd_completions.c.platform_session)):
            platform |= {v for v in row if v}
    return Originals(rater_ids=frozenset(map(str, found["rater_id"])),
                     conversation_ids=frozenset(map(str, found["conversation_id"])),
                     emails=frozenset(emails), link_hashes=frozenset(hashes), platform_ids=frozenset(platform))


def _searchable(value: str) -> bool:
    return len(value) >= (MIN_NUMERIC_ID_IN_TEXT if value.isdigit() else MIN_ID_IN_TEXT)


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class IdNeedles:
    """The store's values a release must not hold, found in any text at once (Aho-Corasick, lower case).
    E-mails match anywhere; ids and hashes only as whole words (not inside a longer word or number)."""

    def __init__(self, originals: Originals):
        self.automaton = ahocorasick.Automaton()
        kinds: dict[str, set] = {}
        self.whole_values: dict[str, str] = {}  # too short to search in text: matched as id values
        for values, kind in ((originals.rater_ids, RATER), (originals.conversation_ids, CONVERSATION),
                             (originals.platform_ids, PLATFORM), (originals.link_hashes, HASH)):
            for value in values:
                needle = str(value).strip().lower()
                if not needle:
                    continue
                if _searchable(needle):
                    kinds.setdefault(needle, set()).add(kind)
                else:
                    self.whole_values.setdefault(needle, kind)
        for email in originals.emails:
            if email and email.strip():
                kinds.setdefault(email.strip().lower(), set()).add(RATER_EMAIL)
        for needle, found in kinds.items():
            self.automaton.add_word(needle, (len(needle), tuple(sorted(found))))
        self.empty = not kinds
        if not self.empty:
            self.automaton.make_automaton()

    def find(self, lowered: str):
        """(kind, offset) of every needle in a lower-cased text."""
        if self.empty:
            return
        for end, (length, found) in self.automaton.iter(lowered):
            start = end - length + 1
            whole_word = ((start == 0 or not _word_char(lowered[start - 1]))
                          and (end + 1 == len(lowered) or not _word_char(lowered[end + 1])))
            for kind in found:
                if kind == RATER_EMAIL or whole_word:
                    yield kind, start


class ReleaseScanner:
    """What a text of a release holds that it must not: [(kind, offset)], each kind once (its first place).
    The same text (a dimension, a band, a message in both its JSONL and CSV form) is scanned once."""

    def __init__(self, originals: Originals | None = None, phone_region: str = "US"):
        originals = originals or Originals()
        self.needles = IdNeedles(originals)
        self.hashes = frozenset(h.lower() for h in originals.link_hashes)
        self.scrubber = Scrubber(phone_region=phone_region)
        self.cache: dict = {}
        self.verdicts: tuple[dict, dict, dict] = ({}, {}, {})  # per column kind: value (or digest) -> phrases
        self.modes: dict[str, int] = {}

    def scan(self, text: str) -> list[tuple[str, int]]:
        key = text if len(text) <= 64 else hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = self._scan(text)
        return found

    def _scan(self, text: str) -> list[tuple[str, int]]:
        found: dict[str, int] = {}
        for kind, offset in self.needles.find(text.lower()):
            found.setdefault(kind, offset)
        for span in self.scrubber.find(text):
            if not PLACEHOLDER.fullmatch(text[span.start:span.end]):
                found.setdefault(DETECTED.get(span.kind, span.kind), span.start)
        if len(text) >= LINK_SECRET_LENGTH:
            for kind, offset in self._secrets(text):
                found.setdefault(kind, offset)
        return sorted(found.items(), key=lambda item: item[1])

    def _secrets(self, text: str):
        for match in URL_SAFE_RUN.finditer(text):
            run = match.group()
            known = next((start for start in range(len(run) - LINK_SECRET_LENGTH + 1) if self.hashes and hashlib.sha256(
                run[start:start + LINK_SECRET_LENGTH].encode()).hexdigest() in self.hashes), None)
            if known is not None:
                yield SECRET, match.start() + known
            elif (len(run) == LINK_SECRET_LENGTH and re.search(r"[a-z]", run) and re.search(r"[A-Z]", run)
                    and re.search(r"\d", run)):
                yield SECRET_LIKE, match.start()

    def id_value(self, value) -> str | None:
        """A store id given as a whole value of an id column, however short."""
        return self.needles.whole_values.get(str(value).strip().lower())

    def verdict(self, value, column: str) -> tuple[str, ...]:
        """What a value of `column` holds, as finished phrases ("holds KIND at character N"); () when clean.
        A release id column (rater_id, conversation_id) is looked at for the store's ids only (a random hex
        id would pass for a phone number); an `*_id` column also for a short store id as its whole value."""
        mode = self.modes.get(column)
        if mode is None:
            mode = self.modes[column] = 2 if column in ID_COLUMNS else 1 if column.endswith("_id") else 0
        key = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).digest() \
            if isinstance(value, str) and len(value) > 64 else value
        found = self.verdicts[mode].get(key)
        if found is None:
            text = value if isinstance(value, str) else str(value)
            phrases = []
            if mode and (kind := self.id_value(text)):
                phrases.append(f"holds {kind}")
            hits = list(self.needles.find(text.lower())) if mode == 2 else self.scan(text)
            phrases += [f"holds {kind} at character {offset + 1}" for kind, offset in hits]
            found = self.verdicts[mode][key] = tuple(phrases)
        return found


@dataclass
class Findings:
    """Problems of one check, each once (file, line, field, what): never a value found."""

    problems: list[str] = field(default_factory=list)
    seen: set = field(default_factory=set)

    def add(self, where: str, line: int | None, column: str | None, what: str) -> None:
        key = (where, line, column, what)
        if key in self.seen:
            return
        self.seen.add(key)
        place = where + (f":{line}" if line is not None else "") + (f": {column}" if column else "")
        self.problems.append(f"{place}: {what}")

    def holds(self, where: str, line: int | None, column: str | None, found) -> None:
        for kind, offset in found:
            self.add(where, line, column, f"holds {kind} at character {offset + 1}")


def _walk(value, path: str = ""):
    """(path, scalar) of every value and key of a decoded JSON value; keys as (path + ' (key)', key)."""
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            yield f"{inner} (key)", key
            yield from _walk(item, inner)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")
    elif value is not None:
        yield path, value


def json_text_values(text: str):
    """(line, path, scalar) of every string (key or value) and other scalar of a JSON text, strings decoded:
    an escaped character (`\\u0040`) is scanned as what it stands for."""
    stack: list[list] = []  # [is_object, key or index]
    line, last = 1, 0

    def path() -> str:
        out = ""
        for is_object, at in stack:
            if is_object:
                out += f".{at}" if out else str(at)
            else:
                out += f"[{at}]"
        return out

    def gap(chunk: str):
        nonlocal line
        for scalar in JSON_SCALAR.finditer(chunk):
            yield line + chunk.count("\n", 0, scalar.start()), path(), scalar.group()
        for ch in chunk:
            if ch == "{":
                stack.append([True, None])
            elif ch == "[":
                stack.append([False, 0])
            elif ch in "}]" and stack:
                stack.pop()
            elif ch == "," and stack and not stack[-1][0]:
                stack[-1][1] += 1
        line += chunk.count("\n")

    for match in JSON_STRING.finditer(text):
        yield from gap(text[last:match.start()])
        literal = match.group()
        try:
            value = json.loads(literal) if "\\" in literal else literal[1:-1]
        except json.JSONDecodeError:
            value = literal
        is_key = bool(stack) and stack[-1][0] and JSON_COLON.match(text, match.end()) is not None
        if is_key:
            stack[-1][1] = value
            yield line, f"{path()} (key)", value
        else:
            yield line, path(), value
        line += literal.count("\n")
        last = match.end()
    yield from gap(text[last:])


def _layout(folder: Path, findings: Findings, scanner: ReleaseScanner) -> None:
    """Every entry of the folder, at any depth, against LAYOUT (symbolic links are never followed). A plain
    file the release does not hold is refused and its text scanned too, so the refusal says what it holds."""
    present = set()
    pending = [(folder, "")]
    while pending:
        here, prefix = pending.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as exc:
            findings.add(prefix or ".", None, None, f"cannot list ({exc.strerror})")
            continue
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                findings.add(rel, None, None, "a symbolic link: a release holds plain files only")
            elif stat.S_ISDIR(mode):
                if rel in FOLDERS:
                    pending.append((Path(entry.path), f"{rel}/"))
                else:
                    findings.add(rel, None, None, "a folder a release does not hold (its layout: data/*.jsonl, "
                                 "csv/*.csv, schema.json, README.md, croissant.json)")
            elif not stat.S_ISREG(mode):
                findings.add(rel, None, None, "not a plain file")
            elif rel in LAYOUT:
                present.add(rel)
            else:
                findings.add(rel, None, None, "a file a release does not hold (its layout: data/*.jsonl, "
                             "csv/*.csv, schema.json, README.md, croissant.json)")
                _scan_stranger(Path(entry.path), rel, scanner, findings)
    for rel in sorted(LAYOUT - present):
        findings.add(rel, None, None, "missing")


def _scan_stranger(path: Path, rel: str, scanner: ReleaseScanner, findings: Findings) -> None:
    """Line by line, up to MAX_STRANGER_BYTES; a file that is not UTF-8 text is refused unread."""
    read = 0
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            for number, line in enumerate(fh, start=1):
                findings.holds(rel, number, None, scanner.scan(line))
                read += len(line)
                if read > MAX_STRANGER_BYTES:
                    break
    except (UnicodeDecodeError, OSError):
        pass  # refused above; its bytes are not text to scan


def _plain_file(folder: Path, rel: str) -> bool:
    """Whether `rel` is a plain file reached through plain folders: a symbolic link (to /dev/zero, to the
    store) or a FIFO is never opened."""
    here = folder
    parts = rel.split("/")
    for index, part in enumerate(parts):
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except OSError:
            return False
        if not (stat.S_ISREG(mode) if index == len(parts) - 1 else stat.S_ISDIR(mode)):
            return False
    return True


def _jsonl_rows(path: Path, rel: str, findings: Findings, scanner: ReleaseScanner):
    """(line number, row) of each JSON object line; unreadable or malformed lines become problems (a
    malformed line's text is scanned as it is)."""
    number = 0
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            for number, raw in enumerate(fh, start=1):
                try:
                    row = json.loads(raw)
                except json.JSONDecodeError as exc:
                    findings.add(rel, number, None, f"malformed JSON ({exc.msg})")
                    findings.holds(rel, number, None, scanner.scan(raw))
                    continue
                if not isinstance(row, dict):
                    findings.add(rel, number, None, "not an object")
                    continue
                yield number, row
    except UnicodeDecodeError:
        findings.add(rel, number + 1, None, "not UTF-8 text")
    except OSError as exc:
        findings.add(rel, None, None, f"cannot read ({exc.strerror})")


class _TableCheck:
    """Links between the tables, read row by row: conversations first, then raters, contexts, ratings."""

    def __init__(self):
        self.assistant_turns: dict[str, set[int]] = {}
        self.raters: dict[str, dict] = {}
        self.rated: set = set()

    def row(self, name: str, row: dict, rel: str, number: int, findings: Findings) -> None:
        own_id = {"raters": "rater_id", "conversations": "conversation_id"}.get(name)
        if own_id and not (isinstance(row.get(own_id), str) and ID_COLUMNS[own_id].fullmatch(row[own_id])):
            findings.add(rel, number, own_id, "not a release id")
        if name == "conversations":
            messages = row.get("messages") if isinstance(row.get("messages"), list) else []
            self.assistant_turns[row.get("conversation_id")] = {
                i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"}
        elif name == "raters":
            self.raters[row.get("rater_id")] = row
        else:
            if row.get("rater_id") not in self.raters:
                findings.add(rel, number, "rater_id", "not in the raters table")
            if row.get("conversation_id") not in self.assistant_turns:
                findings.add(rel, number, "conversation_id", "not in the conversations table")
            elif name == "ratings" and row.get("turn_index") is not None:
                turn = row["turn_index"]
                if not isinstance(turn, int) or turn not in self.assistant_turns[row["conversation_id"]]:
                    findings.add(rel, number, "turn_index", "not an assistant turn of its conversation")
            if name == "ratings":
                self.rated.add(row.get("rater_id"))


def _check_table(folder: Path, name: str, spec: dict, scanner: ReleaseScanner, links: _TableCheck,
                 findings: Findings) -> int:
    """One table: its JSONL rows (columns, ids, links, every value scanned) and its CSV, cell by cell equal
    to the JSONL and every cell scanned. Returns the JSONL's row count."""
    jsonl_rel, csv_rel = f"data/{name}.jsonl", f"csv/{name}.csv"
    columns = list(spec.get("columns") or {}) if isinstance(spec.get("columns"), dict) else []
    count = 0
    csv_file = None
    reader = None
    csv_line = 0
    try:
        if _plain_file(folder, csv_rel):
            csv_file = open(folder / csv_rel, encoding="utf-8", newline="")
            reader = csv.reader(csv_file)
        header = csv_header(name, columns)
        if reader is not None:
            first = _next_csv(reader, csv_rel, findings)
            csv_line = reader.line_num
            if first is None or first != header:
                findings.add(csv_rel, 1, None, "header differs from the schema's columns")
                if first is not None and first[0] != header[0]:
                    reader = None  # not the release's CSV at all: scanned below, not compared
        rows = _jsonl_rows(folder / jsonl_rel, jsonl_rel, findings, scanner) if _plain_file(folder, jsonl_rel) else ()
        for number, row in rows:
            count += 1
            if list(row) != columns:
                findings.add(jsonl_rel, number, None, "columns differ from the schema's")
                for key in row:  # the schema's own column names are scanned in schema.json
                    _scan_value(scanner, findings, jsonl_rel, number, f"{key} (key)", key)
            links.row(name, row, jsonl_rel, number, findings)
            for column, value in row.items():
                if isinstance(value, (dict, list)):
                    for path, inner in _walk(value, column):
                        _scan_value(scanner, findings, jsonl_rel, number, path, inner)
                elif value is not None:
                    _scan_value(scanner, findings, jsonl_rel, number, column, value)
            if reader is None:
                continue
            for expected in csv_rows_of(name, row, columns):
                start = csv_line + 1
                cells = _next_csv(reader, csv_rel, findings)
                csv_line = reader.line_num
                if cells is None:
                    findings.add(csv_rel, None, None, f"fewer rows than {jsonl_rel}")
                    reader = None
                    break
                _scan_cells(scanner, findings, csv_rel, start, header, cells)
                if cells != expected:
                    differing = next((header[i] if i < len(header) else f"column {i + 1}"
                                      for i in range(max(len(cells), len(expected)))
                                      if i >= len(cells) or i >= len(expected) or cells[i] != expected[i]), None)
                    findings.add(csv_rel, start, differing, f"differs from {jsonl_rel} line {number}")
        if reader is not None:
            extra = False
            while True:
                start = csv_line + 1
                cells = _next_csv(reader, csv_rel, findings)
                if cells is None:
                    break
                csv_line = reader.line_num
                extra = True
                _scan_cells(scanner, findings, csv_rel, start, header, cells)
            if extra:
                findings.add(csv_rel, None, None, f"more rows than {jsonl_rel}")
        elif csv_file is not None:
            # A CSV not comparable to its table: still every cell is read and scanned.
            csv_file.seek(0)
            rest = csv.reader(csv_file)
            line = 0
            while (cells := _next_csv(rest, csv_rel, findings)) is not None:
                _scan_cells(scanner, findings, csv_rel, line + 1, header, cells)
                line = rest.line_num
    finally:
        if csv_file is not None:
            csv_file.close()
    return count


def _next_csv(reader, rel: str, findings: Findings):
    try:
        return next(reader)
    except StopIteration:
        return None
    except UnicodeDecodeError:
        findings.add(rel, reader.line_num + 1, None, "not UTF-8 text")
    except csv.Error as exc:
        findings.add(rel, reader.line_num, None, f"malformed CSV ({exc})")
    return None


def _scan_cells(scanner, findings, rel, line, header, cells) -> None:
    for index, cell in enumerate(cells):
        _scan_value(scanner, findings, rel, line, header[index] if index < len(header) else f"column {index + 1}", cell)


def _scan_value(scanner: ReleaseScanner, findings: Findings, rel: str, line, column: str, value) -> None:
    for phrase in scanner.verdict(value, column):
        findings.add(rel, line, column, phrase)


def _check_schema(folder: Path, scanner: ReleaseScanner, findings: Findings) -> dict | None:
    rel = "schema.json"
    try:
        if not _plain_file(folder, rel):
            raise FileNotFoundError(rel)
        text = (folder / rel).read_text(encoding="utf-8")
        schema = json.loads(text)
        files = schema["files"]
        int(schema["k"])
        if not isinstance(files, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError) as exc:
        findings.add(rel, None, None, f"missing or not a sense7 release schema ({type(exc).__name__})")
        return None
    for line, path, value in json_text_values(text):
        _scan_value(scanner, findings, rel, line, path, value)
    for name in sorted(set(files) - set(TABLES)):
        findings.add(rel, None, f"files.{name}", "a table a release does not hold")
    for name in TABLES:
        spec = files.get(name)
        if not isinstance(spec, dict):
            findings.add(rel, None, f"files.{name}", "missing")
            continue
        for kind, expected in (("jsonl", f"data/{name}.jsonl"), ("csv", f"csv/{name}.csv")):
            if spec.get(kind) != expected:
                findings.add(rel, None, f"files.{name}.{kind}", f"not the release's own {expected}")
    return schema


def _check_readme(folder: Path, counts: dict[str, int], scanner: ReleaseScanner, findings: Findings) -> None:
    """Every line scanned (HTML entities decoded: `&#64;` is an "@" to a reader); the YAML front matter's
    values decoded too. The loader's header and the counts must be there."""
    rel = "README.md"
    if not _plain_file(folder, rel):
        findings.add(rel, None, None, "missing or without the datasets loader's YAML header")
        return
    try:
        text = (folder / rel).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        findings.add(rel, None, None, "not UTF-8 text")
        return
    lines = text.split("\n")
    front_end = None
    if lines and lines[0].rstrip("\r") == "---":
        front_end = next((i for i in range(1, len(lines)) if lines[i].rstrip("\r") == "---"), None)
    if front_end is None or "configs:" not in text:
        findings.add(rel, None, None, "missing or without the datasets loader's YAML header")
    section = "front matter" if front_end is not None else "text"
    for index, raw in enumerate(lines):
        if front_end is not None and index > front_end and raw.startswith("#"):
            section = "section " + raw.lstrip("#").strip()[:60]
        elif front_end is not None and index == front_end + 1:
            section = "text"
        findings.holds(rel, index + 1, section, scanner.scan(html.unescape(raw)))
    if front_end is not None:
        try:
            root = yaml.compose("\n".join(lines[1:front_end]))
        except (yaml.YAMLError, RecursionError):
            findings.add(rel, None, "front matter", "not valid YAML")
            root = None
        seen, pending = set(), [root] if root is not None else []
        while pending:  # aliases point at nodes already seen: each node is read once
            node = pending.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode):
                findings.holds(rel, node.start_mark.line + 2, "front matter", scanner.scan(str(node.value)))
            elif isinstance(node, yaml.SequenceNode):
                pending.extend(node.value)
            elif isinstance(node, yaml.MappingNode):
                pending.extend(item for pair in node.value for item in pair)
    for name, n in counts.items():
        if f"| {name} | {n} |" not in text:
            findings.add(rel, None, "Counts", f"the count of {name} does not match data/{name}.jsonl ({n} rows)")


def _check_croissant(folder: Path, scanner: ReleaseScanner, findings: Findings) -> None:
    """croissant.json describes this release (it parses, conforms to Croissant 1.1, carries the RAI fields,
    names only the release's files with their checksums: sense7.privacy.croissant.croissant_problems), and its
    strings pass the same scan as every other file's, but for its vocabulary URLs (`@context`, `conformsTo`)
    and the files' `sha256` digests, which croissant_problems checks against the files themselves."""
    findings.problems += croissant_problems(folder)
    if not _plain_file(folder, CROISSANT_FILE):
        return
    try:
        text = (folder / CROISSANT_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # reported by croissant_problems
    for line, path, value in json_text_values(text):
        if path.split(".", 1)[0].split("[", 1)[0] in ("@context", "conformsTo") or path.endswith("sha256"):
            continue
        _scan_value(scanner, findings, CROISSANT_FILE, line, path, value)


def _check_k(raters: list[dict], fields: list[str], k: int) -> list[str]:
    combos = Counter(tuple(r.get(f) for f in fields) for r in raters)
    suppressed = tuple(SUPPRESSED for _ in fields)
    small = {combo: n for combo, n in combos.items() if n < k and combo != suppressed}
    if not small:
        return []
    return [f"data/raters.jsonl: {sum(small.values())} rater(s) in {len(small)} trait combination(s) shared by "
            f"fewer than {k}"]


def check_release(folder: str | Path, originals: Originals | None = None, k: int | None = None,
                  phone_region: str = "US") -> dict:
    """Verify a release, reading every file of it; returns {"k", "counts", "ids_matched_whole"} or raises
    ReleaseError listing every problem (file, line, field and kind: never a value found). `k`: the least k
    to accept (default: the one it claims). Nothing in the folder is written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReleaseError(f"{folder}: not a folder")
    findings = Findings()
    scanner = ReleaseScanner(originals, phone_region)
    _layout(folder, findings, scanner)
    schema = _check_schema(folder, scanner, findings)
    if schema is None:
        _fail(folder, findings.problems)
    files, claimed_k = schema["files"], int(schema["k"])
    want_k = max(k or 0, claimed_k)
    if k is not None and claimed_k < k:
        findings.add("schema.json", None, "k", f"the release claims k={claimed_k}, less than the {k} asked for")
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 28))  # a long message is one cell
    links = _TableCheck()
    counts = {}
    for name in READ_ORDER:
        spec = files.get(name) if isinstance(files.get(name), dict) else {}
        counts[name] = _check_table(folder, name, spec, scanner, links, findings)
        if spec and counts[name] != spec.get("rows"):
            findings.add(f"data/{name}.jsonl", None, None, f"{counts[name]} rows, the schema says {spec.get('rows')}")
    unrated = set(links.raters) - links.rated
    if unrated:
        findings.add("data/raters.jsonl", None, None, f"{len(unrated)} rater(s) without a rating")
    raters_spec = files.get("raters") if isinstance(files.get("raters"), dict) else {}
    trait_fields = list(raters_spec.get("columns") or {})[1:]
    findings.problems += _check_k(list(links.raters.values()), trait_fields, want_k)
    _check_readme(folder, {name: counts[name] for name in TABLES}, scanner, findings)
    _check_croissant(folder, scanner, findings)
    if findings.problems:
        _fail(folder, findings.problems)
    return {"k": claimed_k, "counts": {name: counts[name] for name in TABLES},
            "ids_matched_whole": len(scanner.needles.whole_values)}


def _fail(folder: Path, problems: list[str]):
    shown = "\n".join(f"  {p}" for p in problems[:MAX_SHOWN])
    more = f"\n  ... and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
    raise ReleaseError(f"{folder}: the release fails its check ({len(problems)} problem(s)):\n{shown}{more}")
