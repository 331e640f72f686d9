"""Fixtures of the jobs tests (the stack's own, job_stack and redis_server, are in tests/conftest.py): two
fresh PostgreSQL databases for Label Studio and the store, skipped without a server."""

from __future__ import annotations

import pytest

from tests.support.postgres import throwaway_databases


@pytest.fixture
def pg_databases():
    """The names of two new databases, {"ls": ..., "store": ...}, dropped after the test."""
    with throwaway_databases("sense7_jobs", count=2) as (ls_url, store_url):
        yield {"ls": ls_url.rsplit("/", 1)[1], "store": store_url.rsplit("/", 1)[1]}
