"""The store's versioned migrations (issue 40 item 2): a fresh store is exactly `sense7.store.tables`; stores
made before migrations (fixtures written by that code, tests/support/store_fixtures/) upgrade with every row
intact; processes opening one store at once upgrade it once; a store newer than the code is refused in one
line and left untouched. On SQLite and, when it is there, on PostgreSQL (127.0.0.1:5432)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, inspect, select, text

from sense7.store.database import Store
from sense7.store.migrations import (StoreTooNewError, current_revision, head_revision, known_revisions,
                                     revision_status)
from sense7.store.tables import metadata, staff_log
from tests.support.postgres import throwaway_databases
from tests.support.store_fixtures.make_old_stores import (ADDED_COLUMNS_OF_7820ADD, BEFORE_ADDED_COLUMNS, OLD_STORES,
                                                          STORE_7820ADD, fill, old_sqlite_store)

SENSE7 = str(Path(sys.executable).parent / "sense7")
# The tables of revision 0001 (the old fixtures hold every one; later revisions add tables they cannot hold).
BASELINE_TABLES = set(importlib.import_module("sense7.store.migrations.versions.0001_baseline").baseline_schema().tables)


def rows_by_table(engine) -> dict[str, list[dict]]:
    """Every row of every table, as the database returns it (no type conversion), sorted."""
    found = {}
    with engine.connect() as conn:
        for name in inspect(conn).get_table_names():
            rows = [dict(r) for r in conn.execute(text(f'SELECT * FROM "{name}"')).mappings()]
            found[name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
    return found


def schema_differences(engine) -> list:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), metadata)


def assert_rows_kept(before: dict, after: dict) -> None:
    """Every table and row of `before` is in `after` with the same values; new columns are NULL."""
    for table, rows in before.items():
        assert len(after[table]) == len(rows), table
        for old, new in zip(rows, after[table]):
            assert {k: new[k] for k in old} == old, table
            assert all(new[k] is None for k in set(new) - set(old)), table


# -- SQLite ------------------------------------------------------------------------------------------------------
def test_a_fresh_store_is_exactly_the_tables_module(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    assert store.upgraded is not None and store.upgraded.had_tables is False
    assert current_revision(store.engine) == head_revision() == known_revisions()[-1]
    assert schema_differences(store.engine) == []
    assert store.staff_entries() == []  # a fresh store's creation is no upgrade of anything


@pytest.mark.parametrize("fixture", OLD_STORES)
def test_a_store_from_before_migrations_upgrades_with_every_row_intact(tmp_path, fixture):
    path = old_sqlite_store(tmp_path, fixture)
    raw = create_engine(f"sqlite:///{path}")
    before = rows_by_table(raw)
    assert set(before) == BASELINE_TABLES and all(len(rows) == 2 for rows in before.values())
    assert current_revision(raw) is None

    store = Store(f"sqlite:///{path}")
    assert store.upgraded.from_revision is None and store.upgraded.had_tables
    assert current_revision(store.engine) == head_revision()
    assert schema_differences(store.engine) == []
    after = rows_by_table(raw)
    after.pop("alembic_version")
    new_log = after["staff_log"][2:]
    after["staff_log"] = after["staff_log"][:2]
    assert_rows_kept(before, after)
    [entry] = new_log
    assert entry["action"] == "store upgrade"
    assert json.loads(entry["detail"]) == {"from_revision": None, "to_revision": head_revision()}
    # the upgraded store works: a new annotation with the added columns, and the old ones read back
    assert store.upsert_annotation(99, 9, "c", 0, "r", "2026-11-28T00:00:00", {"warmth": 4}, lead_time=3.0,
                                   via="rater page")
    assert sorted(store.annotation_versions(include_deleted=True)) == [1, 2, 99]
    assert Store(f"sqlite:///{path}").upgraded is None  # the second opening finds nothing to do


def test_an_upgrade_that_fails_half_way_changes_nothing(tmp_path, monkeypatch):
    """One transaction under BEGIN IMMEDIATE: the first added column is rolled back with the failed second one,
    and the error is not swallowed (the next opening tries again, and succeeds)."""
    from alembic.operations import Operations

    path = old_sqlite_store(tmp_path, BEFORE_ADDED_COLUMNS)
    raw = create_engine(f"sqlite:///{path}")
    before = rows_by_table(raw)
    real, calls = Operations.add_column, []

    def second_fails(self, table, column, **kw):
        calls.append(column.name)
        if len(calls) == 2:
            raise RuntimeError("disk full (planted)")
        return real(self, table, column, **kw)

    monkeypatch.setattr(Operations, "add_column", second_fails)
    with pytest.raises(RuntimeError, match="planted"):
        Store(f"sqlite:///{path}")
    assert calls == ["author_id", "quarantine"]
    assert rows_by_table(raw) == before and current_revision(raw) is None
    assert "author_id" not in {c["name"] for c in inspect(raw).get_columns("annotations")}
    monkeypatch.setattr(Operations, "add_column", real)
    assert Store(f"sqlite:///{path}").upgraded.had_tables and current_revision(raw) == head_revision()


def _open_together(url: str, count: int, tmp_path: Path) -> list[dict]:
    """`count` processes wait for one signal, then each opens the store; what each reports."""
    go = tmp_path / f"go-{uuid.uuid4().hex}"
    probe = ("import json, os, sys, time\n"
             "from sense7.store.database import Store\n"
             "while not os.path.exists(sys.argv[2]): time.sleep(0.005)\n"
             "done = Store(sys.argv[1]).upgraded\n"
             "print(json.dumps(None if done is None else [done.from_revision, done.to_revision]))\n")
    procs = [subprocess.Popen([sys.executable, "-c", probe, url, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(count)]
    time.sleep(3)  # let every interpreter import sense7 and wait at the line (not a timing assertion)
    go.touch()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


@pytest.mark.slow  # real processes (sense7 interpreters)
@pytest.mark.parametrize("fixture", [None, BEFORE_ADDED_COLUMNS])
def test_processes_opening_a_store_at_once_upgrade_it_once(tmp_path, fixture):
    path = old_sqlite_store(tmp_path, fixture) if fixture else tmp_path / "store.sqlite"
    before = rows_by_table(create_engine(f"sqlite:///{path}")) if fixture else None
    reports = _open_together(f"sqlite:///{path}", 5, tmp_path)
    assert reports.count([None, head_revision()]) == 1 and reports.count(None) == 4
    store = Store(f"sqlite:///{path}")
    assert schema_differences(store.engine) == []
    upgrades = [e for e in store.staff_entries() if e["action"] == "store upgrade"]
    assert len(upgrades) == (1 if fixture else 0)
    if fixture:
        after = rows_by_table(store.engine)
        after.pop("alembic_version")
        after["staff_log"] = after["staff_log"][:2]
        assert_rows_kept(before, after)


@pytest.mark.slow  # real processes (sense7 interpreters)
def test_a_store_newer_than_the_code_is_refused_and_left_alone(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Store(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9001'"))
    before = rows_by_table(engine)
    with pytest.raises(StoreTooNewError, match="revision 9001, newer than this sense7"):
        Store(url)
    env = {**os.environ, "SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": url}
    for command in (["store", "upgrade"], ["store", "revision"]):
        done = subprocess.run([SENSE7, *command], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().startswith("error: the store sqlite:///") and "revision 9001" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert rows_by_table(engine) == before


@pytest.mark.slow  # real processes (sense7 interpreters)
def test_store_upgrade_and_revision_commands(tmp_path):
    path = old_sqlite_store(tmp_path, STORE_7820ADD)
    env = {**os.environ, "SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": f"sqlite:///{path}"}

    def run(*args):
        done = subprocess.run([SENSE7, "store", *args, "--json"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert run("revision") == {"revision": None, "head": head_revision(), "up_to_date": False,
                               "store": f"sqlite:///{path}"}
    first = run("upgrade")
    assert first["upgraded"] is True and first["from_revision"] is None and first["revision"] == head_revision()
    again = run("upgrade")
    assert again["upgraded"] is False and again["up_to_date"] is True
    assert run("revision")["up_to_date"] is True
    with create_engine(f"sqlite:///{path}").connect() as conn:
        actions = [row.action for row in conn.execute(select(staff_log.c.action))]
    assert actions.count("store upgrade") == 1


# -- PostgreSQL ------------------------------------------------------------------------------------------------
@pytest.fixture
def pg_store_url():
    with throwaway_databases("sense7_migrations") as (url,):
        yield url


@pytest.mark.slow  # a throwaway PostgreSQL database (and real processes)
def test_postgresql_processes_opening_a_fresh_store_at_once_upgrade_it_once(pg_store_url, tmp_path):
    reports = _open_together(pg_store_url, 5, tmp_path)
    assert reports.count([None, head_revision()]) == 1 and reports.count(None) == 4
    engine = create_engine(pg_store_url)
    assert schema_differences(engine) == [] and revision_status(engine)["up_to_date"]
    engine.dispose()


@pytest.mark.slow  # a throwaway PostgreSQL database (and real processes)
def test_postgresql_store_from_before_migrations_upgrades_with_every_row_intact(pg_store_url, tmp_path):
    engine = create_engine(pg_store_url)
    # what the code before migrations did (the tables of then), then the store before its added columns
    metadata.create_all(engine, tables=[metadata.tables[name] for name in sorted(BASELINE_TABLES)])
    with engine.begin() as conn:
        for table, column in ADDED_COLUMNS_OF_7820ADD:
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
    reflected = MetaData()
    reflected.reflect(engine)
    fill(engine, reflected, explicit_ids=False)
    before = rows_by_table(engine)
    assert set(before) == BASELINE_TABLES and all(len(rows) == 2 for rows in before.values())

    reports = _open_together(pg_store_url, 4, tmp_path)
    assert reports.count([None, head_revision()]) == 1 and reports.count(None) == 3
    assert schema_differences(engine) == []
    after = rows_by_table(engine)
    after.pop("alembic_version")
    after["staff_log"] = [r for r in after["staff_log"] if r["action"] != "store upgrade"]
    assert_rows_kept(before, after)
    engine.dispose()


def test_the_revisions_ship_in_the_package(repo_root):
    """The revisions are modules of a package inside sense7/, so setup.py's finder ships them (the wheel's own
    test, tests/wheel, installs the wheel and imports every module): a sense7 without them could not build
    its store."""
    versions = repo_root / "sense7" / "store" / "migrations" / "versions"
    assert (versions / "__init__.py").is_file() and (versions.parent / "__init__.py").is_file()
    assert [p.name.split("_")[0] for p in sorted(versions.glob("[0-9]*.py"))] == known_revisions()
    assert known_revisions()[0] == "0001"
