"""New tasks get their pre-annotations in the same bulk import request that creates them (issue 13)."""

from __future__ import annotations

import pytest

from sense7.labelstudio import client as ls_client
from sense7.labelstudio.importer import import_conversations
from sense7.store.database import Store
from sense7.taxonomy import load_taxonomy
from tests.support.release import labelstudio_settings, small_synthetic_study

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = pytest.mark.labelstudio


@pytest.fixture(scope="module")
def study():
    return small_synthetic_study()


@pytest.fixture(scope="module")
def bundle(study):
    from sense7.model.bundle import train_bundle

    return train_bundle(study.rating_data(), "v1", TAXONOMY)


def test_import_with_a_served_model_creates_tasks_with_their_predictions(label_studio, rating_project, study,
                                                                        bundle, tmp_path, monkeypatch):
    from sense7.ml_backend.model import build_model
    from sense7.ml_backend.preannotate import Preannotator

    from sense7.model.registry import ModelRegistry

    settings = labelstudio_settings(label_studio, tmp_path)
    registry = ModelRegistry.from_settings(settings)
    registry.add(bundle, "v1")
    registry.promote("v1")
    client, store = label_studio.client, Store(settings.store_url)
    model = build_model(settings)
    predict = model.import_predictor(client.projects.get(rating_project).label_config)
    assert predict is not None and predict.version == "v1"

    requests = []
    real = client.projects.import_tasks
    monkeypatch.setattr(client.projects, "import_tasks",
                        lambda *a, **kw: requests.append(kw["request"]) or real(*a, **kw))
    monkeypatch.setattr(ls_client, "IMPORT_CHUNK", 40)  # several chunks
    conversations = study.conversations[:20]
    result = import_conversations(client, rating_project, conversations, store, predict=predict, taxonomy=TAXONOMY)
    assert result.created > 40 and result.predicted == result.created
    assert len(requests) == -(-result.created // 40)  # one request per chunk, predictions inside it
    assert all(t["predictions"][0]["model_version"] == "v1" for part in requests for t in part)

    tasks = list(client.tasks.list(project=rating_project, include="id,predictions_model_versions",
                                   page_size=1000))
    assert len(tasks) == result.created
    assert [t.id for t in tasks if "v1" not in str(t.predictions_model_versions or "")] == []
    assert Preannotator(client, model, rating_project).pending_tasks("v1") == []
    # Label Studio sets an empty project model_version on import; ours stays empty (DESIGN.md).
    assert not client.projects.get(rating_project).model_version

    again = import_conversations(client, rating_project, conversations, store, predict=predict, taxonomy=TAXONOMY)
    assert again.created == 0 and again.predicted == 0
    assert len(client.predictions.list(project=rating_project)) == result.created  # no second prediction


def test_import_without_a_served_model_imports_plain_tasks(label_studio, rating_project, study, tmp_path):
    from sense7.ml_backend.model import import_predictor

    settings = labelstudio_settings(label_studio, tmp_path)
    client = label_studio.client
    assert import_predictor(settings, client.projects.get(rating_project).label_config) is None
    result = import_conversations(client, rating_project, study.conversations[:3], Store(settings.store_url),
                                  predict=None, taxonomy=TAXONOMY)
    assert result.created > 0 and result.predicted == 0
    assert len(client.predictions.list(project=rating_project)) == 0


def test_a_task_the_model_cannot_predict_is_imported_without_one(label_studio, rating_project, study, tmp_path):
    client = label_studio.client
    answers = iter([None, {"result": [], "score": 0.0, "model_version": "v1", "error": "x"}])

    def predict(tasks):
        return [next(answers, None) for _ in tasks]

    result = import_conversations(client, rating_project, study.conversations[:1],
                                  Store(f"sqlite:///{tmp_path / 's.sqlite'}"), predict=predict, taxonomy=TAXONOMY)
    assert result.created > 0 and result.predicted == 0
    assert len(client.predictions.list(project=rating_project)) == 0
