"""The store's versioned schema: Alembic revisions shipped in the package (`versions/`, plain Python files), run
from here (no alembic.ini, no env.py).

Every process that opens a store (`sense7.store.database.Store`) brings it to the newest revision this code knows
(`head_revision()`), once: processes starting together take one lock (SQLite: the write lock of a
`BEGIN IMMEDIATE` transaction; PostgreSQL: a transaction-scoped advisory lock), and whoever gets it second finds
the store already upgraded. A whole upgrade is one transaction. A store at a revision this code does not know was
upgraded by a newer sense7: it is refused (`StoreTooNewError`), never touched.

A store made before migrations existed (tables, no `alembic_version`) is upgraded by revision 0001, which adds
what it lacks and keeps every row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

VERSIONS_DIR = Path(__file__).resolve().parent / "versions"
VERSION_TABLE = "alembic_version"
# The PostgreSQL advisory lock every sense7 process takes to upgrade a store: one 64-bit key, "sense7 migrate".
ADVISORY_LOCK_KEY = int.from_bytes(b"s7migrat", "big") & 0x7FFFFFFFFFFFFFFF
# How long a process waits for another one's upgrade of an SQLite store before it gives up (seconds).
SQLITE_LOCK_WAIT = 600.0


class StoreTooNewError(RuntimeError):
    """The store is at a revision this code does not know (a newer sense7 upgraded it)."""


@dataclass(frozen=True)
class Upgrade:
    """What one call of `upgrade` did: from (None: a fresh store, or one made before migrations) to."""
    from_revision: str | None
    to_revision: str
    had_tables: bool  # the store had sense7's tables before (an existing store, not a fresh one)


@functools.cache
def _scripts():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("path_separator", "os")
    config.set_main_option("script_location", str(VERSIONS_DIR.parent))
    config.set_main_option("version_locations", str(VERSIONS_DIR))
    return ScriptDirectory.from_config(config)


def head_revision() -> str:
    """The newest revision this code knows."""
    return _scripts().get_current_head()


def known_revisions() -> list[str]:
    """Every revision this code knows, oldest first."""
    return [script.revision for script in reversed(list(_scripts().walk_revisions()))]


def display_url(engine: Engine) -> str:
    """The store's URL without its password (for messages and logs)."""
    return engine.url.render_as_string(hide_password=True)


def current_revision(engine_or_conn) -> str | None:
    """The store's revision; None when it has none (a fresh store, or one made before migrations)."""
    from alembic.runtime.migration import MigrationContext

    if isinstance(engine_or_conn, Engine):
        with engine_or_conn.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    return MigrationContext.configure(engine_or_conn).get_current_revision()


def check_known(revision: str | None, engine: Engine) -> None:
    """StoreTooNewError unless `revision` is one of this code's (or None)."""
    if revision is not None and revision not in known_revisions():
        from sense7 import __version__

        raise StoreTooNewError(
            f"the store {display_url(engine)} is at revision {revision}, newer than this sense7 {__version__} knows "
            f"(its newest is {head_revision()}): run the sense7 that upgraded it, or restore a backup made before")


def _steps(start: str | None):
    from alembic.runtime.migration import MigrationStep

    scripts = _scripts()
    revisions = reversed(list(scripts.revision_map.iterate_revisions("heads", start, implicit_base=True)))
    return [MigrationStep.upgrade_from_script(scripts.revision_map, script) for script in revisions]


def _migrate(conn, engine: Engine) -> Upgrade | None:
    """In `conn`'s transaction, holding the lock: the upgrade still needed, if any."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    start = current_revision(conn)
    check_known(start, engine)
    head = head_revision()
    if start == head:
        return None
    had_tables = bool(set(inspect(conn).get_table_names()) - {VERSION_TABLE})
    context = MigrationContext.configure(conn, opts={"fn": lambda rev, _context: _steps(start),
                                                     "version_table": VERSION_TABLE})
    with Operations.context(context):
        context.run_migrations()
    return Upgrade(start, head, had_tables)


def _sqlite_file(engine: Engine) -> bool:
    database = engine.url.database
    return bool(database) and database != ":memory:" and not database.startswith("file::memory:")


def _locked_sqlite_engine(engine: Engine) -> Engine:
    """An engine of its own on the same SQLite file whose transactions start with BEGIN IMMEDIATE (the
    database's write lock, held from the first statement), DDL included: pysqlite would otherwise run each
    CREATE/ALTER outside any transaction."""
    locked = create_engine(engine.url, poolclass=NullPool, connect_args={"timeout": SQLITE_LOCK_WAIT})

    @event.listens_for(locked, "connect")
    def _no_implicit_transactions(dbapi_conn, _record):
        dbapi_conn.isolation_level = None

    @event.listens_for(locked, "begin")
    def _begin_immediate(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return locked


def upgrade(engine: Engine) -> Upgrade | None:
    """Bring the store to `head_revision()` under the lock; None when it already was there (the common case: one
    read, no lock). StoreTooNewError for a store newer than this code."""
    start = current_revision(engine)
    check_known(start, engine)
    if start == head_revision():
        return None
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
            return _migrate(conn, engine)
    if engine.dialect.name == "sqlite" and _sqlite_file(engine):
        locked = _locked_sqlite_engine(engine)
        try:
            with locked.begin() as conn:
                return _migrate(conn, engine)
        finally:
            locked.dispose()
    with engine.begin() as conn:  # a private in-memory database: nobody else to wait for
        return _migrate(conn, engine)


def revision_status(engine: Engine) -> dict:
    """{"revision": the store's (None: none yet), "head": this code's newest, "up_to_date"}: read only."""
    revision, head = current_revision(engine), head_revision()
    return {"revision": revision, "head": head, "up_to_date": revision == head}
