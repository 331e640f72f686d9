"""The ML backend reads a version's text vectors from the store (sense7.model.vector_cache): a task whose texts
are not embedded within the request's budget is answered by the lexical part and says so (`text_vectors`:
"lexical", also in the recorded prediction); once the embed job ran, the same task reads its vectors
("embedded") and the encoder computes nothing. The Label Studio answer keeps one result per task and the
served `model_version`."""

from __future__ import annotations

import pytest

from sense7.labelstudio.importer import plan_tasks
from sense7.ml_backend.app import create_app
from sense7.ml_backend.hot_model import HotModel
from sense7.ml_backend.model import Sense7Model
from sense7.ml_backend.rater_info import RaterInfoCache
from sense7.model.bundle import train_bundle
from sense7.model.registry import ModelRegistry
from sense7.model.vector_cache import CachedTextEncoder, VectorCache, embed_stored_conversations, encoders_to_embed
from sense7.store.database import Store
from sense7.store.study_design import StudyRecords
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy, render_rating_config
from tests.support.backend import auth_headers
from tests.support.tiny_bert import CountingEncoder, counting_encoders

TAXONOMY = load_taxonomy()


@pytest.fixture
def served(tmp_path, settings):
    study = generate(12, 4, seed=5, taxonomy=TAXONOMY)
    store = Store(f"sqlite:///{tmp_path / 'vectors-store.sqlite'}")
    registry = ModelRegistry(tmp_path / "vector-models", store)
    encoder = counting_encoders(tmp_path)()
    registry.add(train_bundle(study.rating_data(), "v1", TAXONOMY,
                              personalized_params={"text_encoder": encoder, "relational_weight": 1.0}), "v1")
    registry.promote("v1")
    store.upsert_conversations(study.conversations)
    # No time to embed in a request (budget 0): what a text not embedded yet gets under any budget.
    hot = HotModel(registry, check_interval=0.0, vectors=VectorCache.of_store(store), on_demand_seconds=0.0)
    hot.refresh()
    model = Sense7Model(hot, RaterInfoCache(store, TAXONOMY, refresh_seconds=0.0), TAXONOMY)
    app = create_app(settings, model=model)
    app.testing = True
    tasks = [{"id": i, "data": t["data"]} for i, t in enumerate(plan_tasks(study.conversations)[:12])]
    return app, model, registry, store, tasks


def _predict(app, tasks) -> list[dict]:
    response = app.test_client().post("/predict", json={"tasks": tasks, "label_config": render_rating_config(TAXONOMY)},
                                      headers=auth_headers())
    assert response.status_code == 200
    return response.get_json()["results"]


def test_predictions_say_whether_they_read_text_vectors(served, settings):
    app, model, registry, store, tasks = served
    loaded = model.hot_model.get()
    assert isinstance(loaded.bundle.personalized.features_.vectorizers_["encoder"], CachedTextEncoder)
    lexical = _predict(app, tasks)
    assert len(lexical) == len(tasks)
    assert {r["text_vectors"] for r in lexical} == {"lexical"} and {r["model_version"] for r in lexical} == {"v1"}
    answers, records = model.predict_and_record(tasks, render_rating_config(TAXONOMY))
    assert {r["text_vectors"] for r in records} == {"lexical"}
    StudyRecords(store).record_predictions([r for r in records if r])
    kept = StudyRecords(store).recorded(records[0]["task_key"], "v1")
    assert kept["text_vectors"] == "lexical"

    # The embed job's work (sense7.tasks.embedding), for the served version's encoder.
    embed_stored_conversations(store, encoders_to_embed(settings, registry))
    CountingEncoder.embedded.clear()
    embedded = _predict(app, tasks)
    assert {r["text_vectors"] for r in embedded} == {"embedded"}
    assert CountingEncoder.embedded == []  # read from the store, none computed in the request
    assert [r["result"] for r in embedded] != [r["result"] for r in lexical] \
        or [r["score"] for r in embedded] != [r["score"] for r in lexical]


def test_a_model_without_an_encoder_answers_as_before(tmp_path, settings):
    study = generate(12, 4, seed=5, taxonomy=TAXONOMY)
    store = Store(f"sqlite:///{tmp_path / 'ngram-store.sqlite'}")
    registry = ModelRegistry(tmp_path / "ngram-models", store)
    registry.add(train_bundle(study.rating_data(), "v1", TAXONOMY), "v1")
    registry.promote("v1")
    hot = HotModel(registry, check_interval=0.0, vectors=VectorCache.of_store(store), on_demand_seconds=0.0)
    hot.refresh()
    app = create_app(settings, model=Sense7Model(hot, RaterInfoCache(store, TAXONOMY, refresh_seconds=0.0), TAXONOMY))
    app.testing = True
    tasks = [{"id": i, "data": t["data"]} for i, t in enumerate(plan_tasks(study.conversations)[:4])]
    results = _predict(app, tasks)
    assert all("text_vectors" not in r for r in results)
    assert encoders_to_embed(settings, registry) == []
