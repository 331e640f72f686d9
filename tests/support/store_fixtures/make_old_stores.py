"""The pre-Alembic stores the migration tests upgrade, and how they were made.

- `store-7820add.sql`: a store as the code of commit 7820add (before issue 40's migrations) made it, every table
  of its schema with two rows in each. Made once with that code: `python tests/support/store_fixtures/
  make_old_stores.py`, from the repository's root. Kept as SQL text (sqlite3's iterdump) so a review sees every
  row. Do not regenerate it with newer code: it stands for stores made before the migrations existed.
- `BEFORE_ADDED_COLUMNS`, a store from before the columns that code added to older stores (its
  `Store._ADDED_COLUMNS`), rows and all: built at test time from `store-7820add.sql` by dropping those columns
  (`drop_added_columns`). That is the very step that once wrote it as a second file, and that file was
  byte for byte the iterdump of this result (checked on SQLite 3.40 when the file was retired), so the tests
  upgrade the same store as before without a second copy of 300 lines.

`tests/store/test_store_migrations.py` loads them (`old_sqlite_store`), upgrades them and compares every row.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, Text

HERE = Path(__file__).resolve().parent
STORE_7820ADD = "store-7820add.sql"
BEFORE_ADDED_COLUMNS = "store-before-added-columns"  # derived from STORE_7820ADD, see the module's doc
OLD_STORES = [STORE_7820ADD, BEFORE_ADDED_COLUMNS]


def value_for(column, n: int):
    """A value for `column` in row n (1 or 2): distinct per row, so unique keys hold."""
    kind = column.type
    if isinstance(kind, Boolean):
        return n == 1
    if isinstance(kind, Integer):
        return n
    if isinstance(kind, Float):
        return n + 0.5
    if isinstance(kind, DateTime):
        return datetime(2026, 11, 20 + n, 12, 0, n, tzinfo=timezone.utc)
    if isinstance(kind, JSON):
        return {"row": n, "name": column.name, "values": {"warmth": n}}
    if isinstance(kind, (String, Text)):
        value = f"{column.table.name}-{column.name}-{n}"
        return value if not kind.length or len(value) <= kind.length else f"{n}-{column.name}"[:kind.length]
    raise TypeError(f"{column}: {kind}")


# The columns commit 7820add's `Store._ADDED_COLUMNS` added to older stores, in that order.
ADDED_COLUMNS_OF_7820ADD = (("annotations", "author_id"), ("annotations", "quarantine"), ("annotations", "lead_time"),
                            ("annotations", "created_at"), ("annotations", "repeat_of"),
                            ("recorded_predictions", "own_ratings"), ("annotations", "held"), ("rating_history", "via"),
                            ("crowd_released", "tasks_cleared_at"))


def drop_added_columns(conn: sqlite3.Connection) -> None:
    """Make a 7820add store one from before the columns that code added to older stores."""
    for table, column in ADDED_COLUMNS_OF_7820ADD:
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.commit()


def old_sqlite_store(folder: Path, name: str) -> Path:
    """The old store `name` (one of OLD_STORES) as a SQLite file `store.sqlite` in `folder`."""
    path = folder / "store.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript((HERE / STORE_7820ADD).read_text())
    if name == BEFORE_ADDED_COLUMNS:
        drop_added_columns(conn)
    elif name != STORE_7820ADD:
        raise ValueError(f"{name}: not one of {OLD_STORES}")
    conn.close()
    return path


def fill(engine, metadata, explicit_ids: bool = True) -> None:
    """Two rows in every table. Without `explicit_ids`, serial `id` keys are left to the database (PostgreSQL's
    sequences then stay in step, as in a store that grew by itself)."""
    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            columns = [c for c in table.columns if explicit_ids or not (c.primary_key and c.name == "id")]
            conn.execute(table.insert(), [{c.name: value_for(c, n) for c in columns} for n in (1, 2)])


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from sense7.store.database import Store
    from sense7.store.tables import metadata

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.sqlite"
        store = Store(f"sqlite:///{path}")
        fill(store.engine, metadata)
        store.engine.dispose()
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode=DELETE")
        (HERE / STORE_7820ADD).write_text("\n".join(conn.iterdump()) + "\n")
        conn.close()


if __name__ == "__main__":
    main()
