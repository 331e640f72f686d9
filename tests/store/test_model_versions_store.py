"""Model versions in the store (revision 0002, issue 40 item 1): a store at revision 0001 with rows in every table
upgrades with every row intact and then holds the registry; on SQLite and, when it is there, on PostgreSQL."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, text

from sense7.model.registry import ModelRegistry
from sense7.store.database import Store
from sense7.store.migrations import current_revision, head_revision
from tests.support.fake_bundle import FakeBundle, load_fake, save_fake
from tests.support.postgres import throwaway_databases
from tests.support.store_fixtures.make_old_stores import STORE_7820ADD, fill, old_sqlite_store

BASELINE = importlib.import_module("sense7.store.migrations.versions.0001_baseline")


def rows_by_table(engine) -> dict[str, list]:
    with engine.connect() as conn:
        names = [r[0] for r in conn.execute(text(
            "SELECT name FROM sqlite_master WHERE type='table'" if engine.dialect.name == "sqlite" else
            "SELECT tablename FROM pg_tables WHERE schemaname='public'"))]
        # (rows as {column: value}: a later revision's new columns are told apart from the old ones)
        return {name: sorted((dict(r) for r in conn.execute(text(f'SELECT * FROM "{name}"')).mappings()), key=repr)
                for name in names}


def stamp_0001(engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('0001')"))


def check_upgrade_and_registry(url: str, engine, tmp_path: Path) -> None:
    before = rows_by_table(engine)
    assert current_revision(engine) == "0001" and set(before) - {"alembic_version"} == set(BASELINE.baseline_schema().tables)
    assert all(len(rows) == 2 for name, rows in before.items() if name != "alembic_version")
    store = Store(url)
    assert (store.upgraded.from_revision, store.upgraded.to_revision) == ("0001", head_revision())
    after = rows_by_table(engine)
    assert {"model_versions", "model_pointer"} <= set(after) and not after["model_versions"]
    after["staff_log"] = [r for r in after["staff_log"] if "store upgrade" not in repr(r)]
    for name, rows in before.items():  # every row kept as it was; a column added since is NULL
        if name == "alembic_version":
            continue
        kept = sorted(({k: r[k] for k in rows[0]} for r in after[name]), key=repr) if rows else after[name]
        assert kept == rows, name
        assert all(r[k] is None for r in after[name] for k in set(r) - set(rows[0] if rows else r)), name
    registry = ModelRegistry(tmp_path / "cache", store, loader=load_fake, saver=save_fake)
    registry.promote(registry.add(FakeBundle("v1", level=4)).name)
    other_host = ModelRegistry(tmp_path / "other-cache", Store(url), loader=load_fake, saver=save_fake)
    assert other_host.current() == "v1" and other_host.load("v1").level == 4
    store.engine.dispose()
    other_host.store.engine.dispose()


def test_a_sqlite_store_at_0001_upgrades_with_every_row_intact(tmp_path):
    path = old_sqlite_store(tmp_path, STORE_7820ADD)  # rows in every table of 0001's day
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:  # the baseline's own upgrade, as sense7 at revision 0001 ran it
        from alembic.operations import Operations
        from alembic.runtime.migration import MigrationContext

        with Operations.context(MigrationContext.configure(conn)):
            BASELINE.upgrade()
    stamp_0001(engine)
    check_upgrade_and_registry(f"sqlite:///{path}", engine, tmp_path)


def test_a_postgresql_store_at_0001_upgrades_with_every_row_intact(tmp_path):
    with throwaway_databases("sense7_model_versions") as (url,):
        engine = create_engine(url)
        BASELINE.baseline_schema().create_all(engine)
        reflected = MetaData()
        reflected.reflect(engine)
        fill(engine, reflected, explicit_ids=False)
        stamp_0001(engine)
        check_upgrade_and_registry(url, engine, tmp_path)
        engine.dispose()
