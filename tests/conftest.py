"""Session fixtures shared by every test folder: one real Label Studio server for the whole run.

The server gets a private SENSE7_HOME (its SQLite database, our store, secrets) and a free port, so a test
run never touches a developer's own .sense7/ and never collides with a server already on 8080.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from sense7.settings import Settings
from sense7.taxonomy import load_taxonomy

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


SEVEN_POINT_CONTROLS = ("acknowledgement", "continuity", "overall")


def write_seven_point_taxonomy(directory: Path) -> Path:
    """A study taxonomy unlike the packaged one: the packaged YAML with only two dimensions (so three
    controls with the overall rating: SEVEN_POINT_CONTROLS) on a 7-point scale."""
    import yaml

    from sense7.taxonomy import DEFAULT_TAXONOMY_PATH

    raw = yaml.safe_load(DEFAULT_TAXONOMY_PATH.read_text(encoding="utf-8"))
    raw["dimensions"] = [d for d in raw["dimensions"] if d["key"] in SEVEN_POINT_CONTROLS]
    raw["scale"] = ["Not at all", "Barely", "Slightly", "Moderately", "Clearly", "Very clearly", "Exceptionally"]
    path = Path(directory) / "study-taxonomy.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def seven_point_taxonomy(tmp_path) -> Path:
    """Path of a 3-control, 7-point taxonomy YAML (write_seven_point_taxonomy) in the test's tmp_path."""
    return write_seven_point_taxonomy(tmp_path)
