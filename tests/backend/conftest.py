"""Fixtures of the ML backend tests: a registry of fake bundles, a real SQLite store, the Flask app."""

from __future__ import annotations


import pytest
from sense7.ml_backend.app import create_app
from sense7.ml_backend.hot_model import HotModel
from sense7.ml_backend.model import Sense7Model
from sense7.ml_backend.rater_info import RaterInfoCache

from sense7.model.registry import ModelRegistry
from sense7.settings import Settings
from sense7.store.database import Store
from sense7.taxonomy import load_taxonomy, render_rating_config
from tests.support.fake_bundle import FakeBundle, load_fake, save_fake
from tests.support.backend import PASSWORD, SECRET, USER, auth_headers

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


@pytest.fixture
def label_config() -> str:
    return render_rating_config(load_taxonomy())


@pytest.fixture
def registry(tmp_path, store) -> ModelRegistry:
    return ModelRegistry(tmp_path / "models", store, loader=load_fake, saver=save_fake)


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.upsert_raters([
        {"rater_id": "r1", "traits": {"age_band": "25-34", "tipi_1": 5, "ai_trust": 4}},
        {"rater_id": "r2", "traits": {"ai_trust": 2}},
    ])
    return store


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.from_env({
        "SENSE7_HOME": str(tmp_path / "home"), "SENSE7_MODEL_DIR": str(tmp_path / "models"),
        "SENSE7_BACKEND_USER": USER, "SENSE7_BACKEND_PASSWORD": PASSWORD, "SENSE7_WEBHOOK_SECRET": SECRET,
        "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}",
    })


@pytest.fixture
def events() -> list:
    return []


@pytest.fixture
def make_app(registry, store, settings, events):
    def factory(check_interval=0.0, **kwargs):
        hot = HotModel(registry, check_interval=check_interval)
        hot.refresh()
        model = Sense7Model(hot, RaterInfoCache(store, TAXONOMY, refresh_seconds=0.0), TAXONOMY)
        app = create_app(settings, model=model, on_event=lambda action, payload: events.append((action, payload)),
                         **kwargs)
        app.testing = True
        return app
    return factory


@pytest.fixture
def served(registry):
    """A registry with v1 (known rater r1) promoted."""
    registry.add(FakeBundle("v1", level=2, known_raters=("r1",)))
    registry.promote("v1")
    return registry


@pytest.fixture
def client(served, make_app):
    app = make_app()
    test_client = app.test_client()
    test_client.environ_base.update({"HTTP_AUTHORIZATION": auth_headers()["Authorization"]})
    return test_client
