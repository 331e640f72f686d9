"""Fixtures shared by every test folder: one real Label Studio server for the whole run, and each test's own
stack on it (job_stack: a private redis-server, Celery workers and the ML backend started on demand).

The server gets a private SENSE7_HOME (its SQLite database, our store, secrets) and a free port, so a test
run never touches a developer's own .sense7/ and never collides with a server already on 8080.
"""

from __future__ import annotations

import itertools
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest

from sense7.processes import free_port
from sense7.settings import BACKEND_HOST, Settings
from sense7.taxonomy import load_taxonomy
from tests.support.stack import JobStack, RedisHandle, stack_counter
from tests.support.taxonomy import write_seven_point_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

_counter = itertools.count(1)


@dataclass
class LabelStudioHandle:
    url: str
    token: str
    settings: Settings
    client: object  # label_studio_sdk.LabelStudio

    def settings_env(self) -> dict[str, str]:
        """Environment that points a subprocess (CLI, worker, backend) at this server and store."""
        return {
            "SENSE7_HOME": str(self.settings.home),
            "SENSE7_LS_PORT": str(self.settings.ls_port),
            "SENSE7_LS_URL": self.settings.ls_url,
            "SENSE7_LS_TOKEN": self.settings.ls_token,
            "SENSE7_STORE_URL": self.settings.store_url,
        }


@pytest.fixture(scope="session")
def label_studio(tmp_path_factory) -> LabelStudioHandle:
    from label_studio_sdk import LabelStudio

    from sense7.labelstudio.label_studio_process import LabelStudioServer
    from sense7.processes import free_port

    home = tmp_path_factory.mktemp("sense7-home")
    port = free_port()
    settings = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_LS_PORT": str(port)})
    server = LabelStudioServer(settings)
    server.start()
    client = LabelStudio(base_url=settings.ls_url, api_key=settings.ls_token)
    try:
        yield LabelStudioHandle(settings.ls_url, settings.ls_token, settings, client)
    finally:
        server.stop()


@pytest.fixture
def rating_project(label_studio) -> int:
    """A fresh rating project (own title) per test, with the rendered config."""
    from sense7.labelstudio.client import create_rating_project

    project = create_rating_project(label_studio.client, title=f"test rating {next(_counter)} {os.getpid()}", taxonomy=TAXONOMY)
    return project


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture
def seven_point_taxonomy(tmp_path) -> Path:
    """Path of a 3-control, 7-point taxonomy YAML (write_seven_point_taxonomy) in the test's tmp_path."""
    return write_seven_point_taxonomy(tmp_path)


@pytest.fixture
def redis_server(tmp_path) -> RedisHandle:
    handle = RedisHandle(tmp_path / "redis", free_port())
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def job_stack(label_studio, redis_server, tmp_path) -> JobStack:
    """Environment for one test's processes: the session's Label Studio, a fresh store and model dir,
    its own two Label Studio projects (unique titles), this test's Redis."""
    # A random part too: a counter restarts from 1 in each pytest process (or module imported twice), and a
    # title seen before would hand this test a project that already has annotations.
    n = f"{next(stack_counter)}-{secrets.token_hex(3)}"
    backend_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env.update(label_studio.settings_env())
    env.update({
        "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
        "SENSE7_MODEL_DIR": str(tmp_path / "models"),
        "SENSE7_REDIS_URL": redis_server.url,
        "SENSE7_BACKEND_PORT": str(backend_port),
        "SENSE7_BACKEND_URL": f"http://{BACKEND_HOST}:{backend_port}",
        "SENSE7_BACKEND_USER": "sense7-test",
        "SENSE7_BACKEND_PASSWORD": secrets.token_hex(12),
        "SENSE7_RATING_PROJECT_TITLE": f"jobs rating {n} {os.getpid()}",
        "SENSE7_PROFILE_PROJECT_TITLE": f"jobs profile {n} {os.getpid()}",
        # Fast retries so fault tests recover in seconds (production default: 2 s doubling to 300 s).
        "SENSE7_RETRY_BACKOFF": "1",
        "SENSE7_RETRY_BACKOFF_MAX": "4",
        "SENSE7_MAX_RETRIES": "20",
        "SENSE7_RETRAIN_EVERY": "0",
        "SENSE7_PREANNOTATE_AFTER_PROMOTE": "0",
        "PYTHONUNBUFFERED": "1",
    })
    stack = JobStack(env, tmp_path, redis_server)
    yield stack
    stack.close()


# The fast tier: `./run test --quick` (tests/README.md). Everything that needs no Label Studio, no browser and
# no slow real-process set-up; CI's `./run test -q` still runs everything.

QUICK_SKIPS = ("labelstudio", "browser", "slow")  # markers the fast tier leaves out


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help=f"the fast tier: leave out tests marked {', '.join(QUICK_SKIPS)} or needing Label Studio")


def needs_more_than_the_fast_tier(item) -> bool:
    """Marked labelstudio, browser or slow, or reaching the session's Label Studio through a fixture (a test
    that forgot its mark would otherwise start the server in the fast tier)."""
    return any(item.get_closest_marker(name) for name in QUICK_SKIPS) or "label_studio" in item.fixturenames


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--quick"):
        return
    left_out = [item for item in items if needs_more_than_the_fast_tier(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not needs_more_than_the_fast_tier(item)]
