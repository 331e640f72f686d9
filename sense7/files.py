"""Small file helpers: durable private writes (the store of models and anything else that must survive a
crash), CSV files a spreadsheet opens without running a formula, YAML files read with bounds (aliases,
size, nesting), and the characters no stored text may hold."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

import yaml


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (best effort: some file systems cannot)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` as its owner's only (0600), atomically: a reader never sees half a file.
    For files that hold credentials (rating links) or data."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def create_private_file(path: Path) -> None:
    """Create `path` empty and its owner's only (0600), whatever the umask, unless it exists (an existing file
    keeps its mode). For a data file another library then writes (a SQLite database: SQLite gives its -wal and
    -shm files the database file's mode), which would otherwise get the umask's 0644."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass


# -- what no stored text may hold ----------------------------------------------------------------------------
# PostgreSQL's text and JSON types refuse U+0000, and a lone surrogate (which JSON's "\ud800" escape makes)
# cannot be encoded as UTF-8 by any store: both are refused where a user file is read, never met later.
FORBIDDEN_CHARACTERS = re.compile("[\x00\ud800-\udfff]")


def forbidden_character(text: str) -> str | None:
    """Why `text` cannot be stored (a NUL character or a lone surrogate, and where), or None."""
    found = FORBIDDEN_CHARACTERS.search(text)
    if found is None:
        return None
    what = "a NUL character" if found.group() == "\x00" else f"a lone surrogate (U+{ord(found.group()):04X})"
    return f"holds {what} at character {found.start() + 1}: the store cannot keep it"


# -- CSV files a spreadsheet opens -----------------------------------------------------------------------------
# A cell starting with one of these is run as a formula by Excel, LibreOffice and Google Sheets (OWASP's
# "CSV injection"): `=cmd|' /C calc'!A0`, `@SUM(..)`, `+1+1`, `-2+3`, a tab or carriage return before one.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_cell(value):
    """`value` as a CSV cell that a spreadsheet shows and never runs: a text that would start a formula gets
    a leading apostrophe (the spreadsheets' own "this is text" mark); numbers, plain numeric texts such as
    `-3` and everything else are left as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_START) and not PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def spreadsheet_rows(rows):
    """Every cell of `rows` through `spreadsheet_cell`: what every CSV sense7 writes goes through."""
    for row in rows:
        yield [spreadsheet_cell(cell) for cell in row]


def csv_text(rows) -> str:
    """`rows` (the header first) as CSV text with safe cells (`spreadsheet_cell`), lines ending in \\r\\n
    (RFC 4180: a cell holding either character is then quoted, so it survives being read back)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(spreadsheet_rows(rows))
    return buffer.getvalue()


# -- YAML files a user gives -----------------------------------------------------------------------------------
MAX_YAML_ALIASES = 50      # aliases (`*name`) in one file; sense7's own files use none
MAX_YAML_NODES = 100_000   # values in the document with every alias expanded: "billion laughs" stops here
MAX_YAML_DEPTH = 32        # nested mappings and lists; a taxonomy or study file needs 5


class YAMLInputError(ValueError):
    """A YAML file refused (not YAML, beyond a bound, a value that cannot be built): path:line: field: reason."""

    def __init__(self, path, line: int | None, field: str, reason: str):
        self.path, self.line, self.field, self.reason = str(path), line, field, reason
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {field}: {reason}")


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with every alias counted, the document's size with aliases expanded and its
    nesting bounded while it is composed, before anything is built from it (PyYAML bounds none of them)."""

    def __init__(self, stream, path: str):
        super().__init__(stream)
        self.path = path
        self.aliases = 0
        self.sizes: dict[int, int] = {}  # id(node) -> values under it, aliases expanded
        self.keys: list[str] = []        # where the composer is, as field names
        self.depth = 0                   # mappings and lists open around it

    def refuse(self, mark, reason: str) -> YAMLInputError:
        return YAMLInputError(self.path, mark.line + 1 if mark else None, self.field(), reason)

    def field(self) -> str:
        out = ""
        shown = self.keys if len(self.keys) <= 6 else self.keys[:6] + ["[...]"]
        for key in shown:
            out += key if key.startswith("[") or not out else f".{key}"
        return out or "file"

    def compose_node(self, parent, index):
        if isinstance(index, yaml.ScalarNode):
            self.keys.append(index.value)
        elif isinstance(index, int):
            self.keys.append(f"[{index + 1}]")
        try:
            return self._compose_counted(parent, index)
        finally:
            if isinstance(index, (yaml.ScalarNode, int)):
                self.keys.pop()

    def _compose_counted(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise self.refuse(event.start_mark, f"more than {MAX_YAML_ALIASES} aliases (*name)")
            node = super().compose_node(parent, index)
            if id(node) not in self.sizes:
                raise self.refuse(event.start_mark, f"the alias *{event.anchor} refers to a value that holds it")
            return node
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if collection and self.depth >= MAX_YAML_DEPTH:
            raise self.refuse(event.start_mark, f"nested deeper than {MAX_YAML_DEPTH} levels")
        self.depth += collection
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= collection
        if isinstance(node, yaml.ScalarNode):
            if (why := forbidden_character(node.value)) is not None:
                raise self.refuse(node.start_mark, why)
            size = 1
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self.sizes[id(item)] for item in node.value)
        else:
            size = 1 + sum(self.sizes[id(k)] + self.sizes[id(v)] for k, v in node.value)
        if size > MAX_YAML_NODES:
            raise self.refuse(node.start_mark, f"more than {MAX_YAML_NODES:,} values with its aliases expanded")
        self.sizes[id(node)] = size
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (YAMLInputError, yaml.YAMLError):
            raise
        except Exception as exc:  # PyYAML's safe constructors check the syntax only: 2020-13-01, `!!int x`, `!!int`
            raise YAMLInputError(self.path, node.start_mark.line + 1, "value",
                                 f"cannot be read ({type(exc).__name__}: {exc})") from None


def load_yaml(text: str, path) -> tuple[object, yaml.Node | None]:
    """(the values, the composed node tree for line numbers) of a user's YAML text, through PyYAML's safe
    loader with aliases, size and nesting bounded. Raises YAMLInputError (path:line: field: reason) for
    a file that is not YAML, holds more than one document, exceeds a bound or holds a character no
    store keeps; nothing is built from a refused file."""
    try:
        loader = _BoundedLoader(text, str(path))
    except yaml.reader.ReaderError as exc:
        raise _unreadable(exc, text, path) from None
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YAMLInputError(path, mark.line + 1 if mark else None, "file",
                             f"not valid YAML ({exc.problem or exc.context or 'syntax'})") from None
    except yaml.reader.ReaderError as exc:
        raise _unreadable(exc, text, path) from None
    except yaml.YAMLError as exc:
        raise YAMLInputError(path, None, "file", f"not valid YAML ({type(exc).__name__})") from None
    finally:
        loader.dispose()


def _unreadable(exc: yaml.reader.ReaderError, text: str, path) -> YAMLInputError:
    line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else None
    return YAMLInputError(path, line, "file", f"holds the character #x{exc.character:04x}, which YAML does not allow")


class FolderNotFree(ValueError):
    """The folder a command was asked to write is a file or holds something: nothing was written."""


@contextlib.contextmanager
def staged_folder(out: Path):
    """Write a new folder all at once: yields an empty staging folder next to `out` (0700); when the block
    ends, every file in it is made 0600 and every folder 0700, and it is renamed to `out`. `out` must be
    new or an empty folder (FolderNotFree otherwise, before anything is written). If the block raises, the
    staging folder and any parent folder made for it are removed: nothing is left behind."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FolderNotFree(f"{out}: {'not a folder' if not out.is_dir() else 'not empty'}; "
                            "give a new or empty folder (nothing was written)")
    made = [parent for parent in reversed(out.parents) if not parent.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield staging
        for path in staging.rglob("*"):
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
        os.chmod(staging, 0o700)
        if out.exists():
            out.rmdir()  # empty (checked above); the rename needs the name free
        os.rename(staging, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(made):
            try:
                parent.rmdir()
            except OSError:
                pass
        raise


def sha256_of(path: Path) -> str:
    """A file's SHA-256 (hex), read in 1 MiB blocks: the registry's manifests and Croissant's checksums."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
