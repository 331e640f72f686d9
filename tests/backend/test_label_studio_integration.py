"""End to end with the real parts: Label Studio asks our gunicorn backend for predictions.

A small real bundle is trained on synthetic data with planted rater leniency; two raters with opposite
planted leniency get tasks for the same turns; Label Studio's "Retrieve predictions" action calls /setup
and /predict; the predictions read back through the API carry the served version, eight ratings, and the
lenient rater's are higher. A second retrieval must not call the model again (version coherence).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from sense7.processes import free_port
from sense7.settings import Settings
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

USER, PASSWORD, SECRET = "ls-backend", "integration-pw-5d1", "integration-secret-77"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from sense7.synthetic import synth
    from sense7.model.bundle import train_bundle

    data = synth.generate(80, 12, seed=11, raters_per_conversation=2, taxonomy=TAXONOMY)
    bundle = train_bundle(data.rating_data(), "v1", TAXONOMY)
    return data, bundle


def test_label_studio_retrieves_personalized_predictions(label_studio, rating_project, trained, tmp_path,
                                                         monkeypatch):
    from sense7.ml_backend.backend_process import BackendServer

    from sense7.store.database import Store
    from sense7.labelstudio.importer import import_conversations
    from sense7.labelstudio.protocol import connect_backend
    from sense7.model.registry import ModelRegistry
    from sense7.taxonomy import load_taxonomy

    data, bundle = trained
    controls = load_taxonomy().controls
    port = free_port()
    settings = Settings.from_env({
        **label_studio.settings_env(), "SENSE7_HOME": str(tmp_path / "home"),
        "SENSE7_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite'}", "SENSE7_BACKEND_PORT": str(port),
        "SENSE7_BACKEND_USER": USER, "SENSE7_BACKEND_PASSWORD": PASSWORD, "SENSE7_WEBHOOK_SECRET": SECRET})
    monkeypatch.setenv("SENSE7_BACKEND_ACCESS_LOG", "1")  # the gunicorn process logs each request line
    registry = ModelRegistry.from_settings(settings)
    registry.add(bundle, "v1")
    registry.promote("v1")
    store = Store(settings.store_url)
    raters = data.raters.drop(columns=["email"], errors="ignore").set_index("rater_id")
    store.upsert_raters([{"rater_id": r, "traits": {k: v for k, v in row.items() if v == v}}
                         for r, row in raters.iterrows()])

    rated = set(data.ratings["rater_id"])
    leniency = data.truth.leniency[data.truth.leniency.index.isin(rated)].sort_values()
    harsh, lenient = leniency.index[0], leniency.index[-1]
    assert leniency[lenient] - leniency[harsh] > 0.5  # the planted difference the test relies on
    # The same conversations, as seen by each of the two raters (one task per turn and rater).
    sample = data.conversations[:4]
    pair = [dataclasses.replace(c, rater_id=r) for c in sample for r in (harsh, lenient)]
    stranger = [dataclasses.replace(sample[0], rater_id="never-seen")]
    client = label_studio.client
    imported = import_conversations(client, rating_project, pair + stranger, store, taxonomy=TAXONOMY)
    assert imported.created > 8

    server = BackendServer(settings, port=port)
    server.start(workers=1, threads=4)
    try:
        env = {**os.environ, **label_studio.settings_env(), "SENSE7_HOME": str(settings.home),
               "SENSE7_STORE_URL": settings.store_url, "SENSE7_BACKEND_PORT": str(port),
               "SENSE7_BACKEND_USER": USER, "SENSE7_BACKEND_PASSWORD": PASSWORD, "SENSE7_WEBHOOK_SECRET": SECRET}
        sense7 = os.path.join(os.path.dirname(sys.executable), "sense7")
        first = subprocess.run([sense7, "backend", "connect", "--project", str(rating_project)], env=env,
                               capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "ML backend registered" in first.stdout and "reports it as CO" in first.stdout
        reg = connect_backend(client, rating_project, settings)  # again: finds the same registration
        assert not reg.created and reg.state == "CO"
        assert [m.id for m in client.ml.list(project=rating_project)] == [reg.ml_backend_id]
        hooks = [h for h in client.webhooks.list(project=str(rating_project)) if h.url.endswith("/webhook")]
        assert len(hooks) == 1 and hooks[0].headers["X-Sense7-Secret"] == SECRET

        client.actions.create(id="retrieve_tasks_predictions", project=rating_project,
                              selected_items={"all": True, "excluded": []})
        tasks = list(client.tasks.list(project=rating_project, fields="all"))
        assert len(tasks) == imported.created
        levels = {}
        for task in tasks:
            predictions = client.predictions.list(task=task.id)
            assert len(predictions) == 1, task.id
            prediction = predictions[0]
            assert prediction.model_version == "v1"
            ratings = {item["from_name"]: item["value"]["rating"] for item in prediction.result}
            assert list(ratings) == controls and all(1 <= v <= 5 for v in ratings.values())
            assert {item["to_name"] for item in prediction.result} == {"turn"}
            levels[(task.data["conversation_id"], task.data["turn_index"], task.data["rater_id"])] = ratings
        turns = {(c, t) for c, t, r in levels if r == harsh}
        assert turns and all((c, t, lenient) in levels for c, t in turns)
        # Planted: the same turn gets higher ratings from the lenient rater, turn by turn.
        lower = [(c, t) for c, t in turns if sum(levels[(c, t, lenient)].values()) <= sum(levels[(c, t, harsh)].values())]
        assert lower == [], lower

        # Asking again changes nothing: every task already has a prediction of the version /setup reports.
        client.actions.create(id="retrieve_tasks_predictions", project=rating_project,
                              selected_items={"all": True, "excluded": []})
        assert len(client.predictions.list(project=rating_project)) == len(tasks)
        versions = client.ml.list_model_versions(reg.ml_backend_id)
        assert "v1" in (versions.versions or [])
    except AssertionError as exc:
        # Shared CI machines are slow: show what the backend saw (Label Studio gives /health only 1 s).
        raise AssertionError(f"{exc}\n--- ML backend log ---\n{server._tail(40)}") from exc
    finally:
        server.stop()


def test_connect_without_a_running_backend_fails_clearly(label_studio, rating_project, tmp_path):
    port = free_port()  # nothing listens there
    env = {**os.environ, **label_studio.settings_env(), "SENSE7_HOME": str(tmp_path / "home"),
           "SENSE7_BACKEND_PORT": str(port)}
    sense7 = os.path.join(os.path.dirname(sys.executable), "sense7")
    result = subprocess.run([sense7, "backend", "connect", "--project", str(rating_project)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "error:" in result.stderr and ("refused" in result.stderr or "cannot reach" in result.stderr)
    assert [m for m in label_studio.client.ml.list(project=rating_project)
            if m.url.rstrip("/") == f"http://127.0.0.1:{port}" and m.state == "CO"] == []
