"""Throwaway PostgreSQL databases on the machine's server (127.0.0.1:5432, trust auth) for store tests; the test
is skipped when no server answers."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextmanager
def throwaway_databases(prefix: str, count: int = 1):
    """Yields `count` SQLAlchemy URLs of new, empty databases; each is dropped afterwards (connections forced)."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = psycopg2.connect(ADMIN_URL, connect_timeout=3)
    except psycopg2.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432: {exc}")
    admin.autocommit = True
    names = [f"{prefix}_{uuid.uuid4().hex[:10]}" for _ in range(count)]
    try:
        for name in names:
            admin.cursor().execute(f"CREATE DATABASE {name}")
        yield [f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}" for name in names]
    finally:
        for name in names:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
