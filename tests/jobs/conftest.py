"""Fixtures of the jobs tests (the stack's own, job_stack and redis_server, are in tests/conftest.py): two
fresh PostgreSQL databases for Label Studio and the store, skipped without a server."""

from __future__ import annotations

import uuid

import pytest

from tests.support.jobs import PG, pg_admin


@pytest.fixture
def pg_databases():
    import psycopg2

    try:
        psycopg2.connect(f"{PG}/postgres", connect_timeout=3).close()
    except psycopg2.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432: {exc}")
    suffix = uuid.uuid4().hex[:10]
    names = {"ls": f"sense7_jobs_ls_{suffix}", "store": f"sense7_jobs_store_{suffix}"}
    for name in names.values():
        pg_admin(f'CREATE DATABASE "{name}"')
    yield names
    for name in names.values():
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
