"""A real trained bundle behind the HTTP app: /predict answers exactly what the reference model path
(ModelBundle.predict_items on sense7.labelstudio.protocol.items_from_tasks) predicts, with traits and contexts from the
store, for known, traits-only and unknown raters."""

from __future__ import annotations

import math

import pytest
from sense7.ml_backend.app import create_app
from sense7.ml_backend.hot_model import HotModel
from sense7.ml_backend.model import Sense7Model
from sense7.ml_backend.rater_info import RaterInfoCache

from sense7.data.items import items_from_tasks
from sense7.labelstudio.importer import plan_tasks
from sense7.model.bundle import train_bundle
from sense7.model.registry import ModelRegistry
from sense7.store.database import Store
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy, render_rating_config
from tests.support.backend import auth_headers

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


@pytest.fixture(scope="module")
def study():
    return generate(40, 8, seed=11, taxonomy=TAXONOMY)


STATIC = {"text_encoder": "static", "relational_weight": "cv"}  # the static encoder, relational weight by CV


# The static encoder's table is made on its first use in an installation (minutes of CPU): slow.
@pytest.fixture(params=[None, {"rater_ridge": 3.0, "rater_ridge_from": "text"},
                        pytest.param(STATIC, marks=pytest.mark.slow)],
                ids=["default", "rater-ridge", "static-encoder"])
def served_app(study, tmp_path, settings, request):
    """The default version, one with each known rater's own content weights (SENSE7_MODEL_RATER_RIDGE), or
    one reading the static encoder."""
    return _served_app(study, tmp_path, settings, request.param)


def _served_app(study, tmp_path, settings, params):
    store = Store(f"sqlite:///{tmp_path / 'real-store.sqlite'}")
    registry = ModelRegistry(tmp_path / "real-models", store)
    registry.add(train_bundle(study.rating_data(), "v1", TAXONOMY, personalized_params=params), "v1")
    registry.promote("v1")
    raters = study.raters.drop(columns=["email"]).set_index("rater_id")

    def profile(row) -> dict:  # plain Python values, answered fields only
        return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if v == v}

    # Two of the known raters have no profile in the store: they are still served as personalized.
    store.upsert_raters([{"rater_id": r, "traits": profile(row)} for r, row in raters.iloc[:6].iterrows()])
    store.upsert_raters([{"rater_id": "newcomer", "traits": profile(raters.iloc[0])}])
    store.upsert_conversations(study.conversations)
    hot = HotModel(registry, check_interval=0.0)
    hot.refresh()
    app = create_app(settings, model=Sense7Model(hot, RaterInfoCache(store, TAXONOMY, refresh_seconds=0.0), TAXONOMY))
    app.testing = True
    return app, registry, store


def test_served_predictions_equal_the_reference_model(study, served_app):
    app, registry, store = served_app
    datas = [t["data"] for t in plan_tasks(study.conversations)][:60]
    for i, data in enumerate(datas):
        if i % 3 == 1:
            datas[i] = dict(data, rater_id="newcomer")
        elif i % 3 == 2:
            datas[i] = dict(data, rater_id="stranger")
    tasks = [{"id": i, "data": d} for i, d in enumerate(datas)]
    config = render_rating_config(load_taxonomy())
    client = app.test_client()
    response = client.post("/predict", json={"tasks": tasks, "label_config": config}, headers=auth_headers())
    results = response.get_json()["results"]

    contexts = store.contexts_for({(d["conversation_id"], d["rater_id"]) for d in datas})
    bundle = registry.load("v1")
    expected = bundle.predict_items(items_from_tasks(datas, store.raters_frame(), contexts, TAXONOMY))
    assert len(results) == len(expected) == 60
    assert {r["kind"] for r in results} == {"personalized", "traits", "generic"}
    for got, want in zip(results, expected):
        assert got["kind"] == want.kind and got["model_version"] == "v1"
        assert {r["from_name"]: r["value"]["rating"] for r in got["result"]} == \
            {c: p.level for c, p in want.controls.items()}
        want_score = sum(p.confidence for p in want.controls.values()) / len(want.controls)
        assert math.isclose(got["score"], round(want_score, 4), abs_tol=2e-4)



@pytest.mark.slow  # the static encoder's packaged table (see above)
def test_a_served_model_reads_meaning_through_the_static_encoder(study, tmp_path, settings):
    """A version fitted with the static encoder has it in its text model, the compiled path scores it itself
    (no fallback to the estimator), and /predict tells apart two turns made of words the n-grams never saw
    (with n-grams alone both would be an empty text and get the same prediction)."""
    from sense7.model.static_embeddings import StaticEmbeddingEncoder

    app, registry, store = _served_app(study, tmp_path, settings, STATIC)
    bundle = registry.load("v1")
    assert isinstance(bundle.personalized.features_.vectorizers_["encoder"], StaticEmbeddingEncoder)
    compiled = bundle.compile()
    assert compiled._text.fast and compiled._text.encoder is not None
    vocabulary = set(bundle.personalized.features_.vectorizers_["text"].vocabulary_)
    unseen = ["Bereavement, grief, mourning.", "Spreadsheet, invoice, ledger."]
    assert not {w.strip(",.").lower() for t in unseen for w in t.split()} & vocabulary
    data = [t["data"] for t in plan_tasks(study.conversations)][0]
    tasks = [{"id": i, "data": dict(data, rater_id="stranger", turn=[{"role": "assistant", "content": text}])}
             for i, text in enumerate(unseen)]
    response = app.test_client().post("/predict", json={"tasks": tasks, "label_config": render_rating_config(TAXONOMY)},
                                      headers=auth_headers())
    results = response.get_json()["results"]
    assert results[0]["score"] != results[1]["score"]
