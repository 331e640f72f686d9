"""What the deployment tests need beyond sense7.deployment (the one list of the several-host deployment's
services, which tests/deploy/test_multi_home.py runs, tests/jobs/test_compose.py holds docker-compose.yml to and the
crowd benchmark starts): HAProxy, or a skip naming the packages."""

from __future__ import annotations

import shutil

import pytest

from sense7.deployment import haproxy_executable


def haproxy_binary() -> str:
    """Debian's haproxy, or a skip naming the packages (openssl makes the test certificates)."""
    found = haproxy_executable()
    if found is None or shutil.which("openssl") is None:
        pytest.skip("HAProxy or openssl is not installed (Debian: apt-get install haproxy openssl)")
    return found
