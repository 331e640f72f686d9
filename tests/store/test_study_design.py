"""The study's pre-fill policy (issue 15): arms drawn at import, predictions recorded for both arms before
anyone sees the task, only shown-arm tasks carry theirs into Label Studio, repeats hidden and last."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from sense7.labelstudio.importer import import_conversations
from sense7.settings import Settings, StudyDesign
from sense7.store.database import Store
from sense7.store.study_design import HIDDEN, REPEAT_SUFFIX, SHOWN, StudyRecords, draw_arm, plan
from sense7.taxonomy import load_taxonomy
from tests.support.release import labelstudio_settings, small_synthetic_study

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = pytest.mark.labelstudio



@pytest.fixture(scope="module")
def study():
    return small_synthetic_study()  # the small synthetic study of test_import_predictions


@pytest.fixture(scope="module")
def bundles(study):
    from sense7.model.bundle import train_bundle

    data = study.rating_data()
    return train_bundle(data, "v1", TAXONOMY), train_bundle(data, "v2", TAXONOMY)


def test_arms_follow_the_policy_and_the_share_and_are_reproducible_from_the_seed():
    keys = [f"c{i}::1::r{i % 7}" for i in range(4000)]
    randomized = StudyDesign("randomized", shown_share=0.3, seed="s")
    shown = sum(draw_arm(randomized, "s", k) == SHOWN for k in keys) / len(keys)
    assert abs(shown - 0.3) < 0.03
    assert [draw_arm(randomized, "s", k) for k in keys] == [draw_arm(randomized, "s", k) for k in keys]
    assert [draw_arm(randomized, "s", k) for k in keys] != [draw_arm(randomized, "t", k) for k in keys]
    assert {draw_arm(StudyDesign("hidden"), "s", k) for k in keys} == {HIDDEN}
    assert {draw_arm(StudyDesign("shown"), "s", k) for k in keys} == {SHOWN}
    with pytest.raises(ValueError, match="SENSE7_PREFILL"):
        Settings.from_env({"SENSE7_PREFILL": "sometimes", "SENSE7_HOME": "/tmp/unused-sense7"})
    with pytest.raises(ValueError, match="SENSE7_PREFILL_SHOWN_SHARE"):
        StudyDesign.from_env({"SENSE7_PREFILL_SHOWN_SHARE": "1.5"})


def test_each_rater_gets_hidden_repeats_of_their_own_turns(study):
    from sense7.labelstudio.importer import plan_tasks

    tasks = plan_tasks(study.conversations[:12])
    planned = plan(tasks, StudyDesign("randomized", seed="x", repeat_share=0.1), "x", TAXONOMY)
    repeats = [t["data"] for t in planned if t["data"].get("repeat_of")]
    per_rater = Counter(t["data"]["rater_id"] for t in tasks)
    assert Counter(d["rater_id"] for d in repeats) == {r: math.ceil(0.1 * n) for r, n in per_rater.items()}
    originals = {t["data"]["task_key"]: t["data"] for t in tasks}
    for d in repeats:
        assert d["prefill"] == HIDDEN and d["task_key"] == d["repeat_of"] + REPEAT_SUFFIX
        first = originals[d["repeat_of"]]
        assert (d["rater_id"], d["conversation_id"], d["turn_index"], d["turn"]) == \
            (first["rater_id"], first["conversation_id"], first["turn_index"], first["turn"])


def test_randomized_import_records_both_arms_and_label_studio_holds_only_shown_predictions(
        label_studio, rating_project, study, bundles, tmp_path):
    from sense7.ml_backend.model import build_model
    from sense7.ml_backend.preannotate import Preannotator

    from sense7.model.registry import ModelRegistry

    settings = labelstudio_settings(label_studio, tmp_path)
    registry = ModelRegistry.from_settings(settings)
    registry.add(bundles[0], "v1")
    registry.promote("v1")
    client, store = label_studio.client, Store(settings.store_url)
    records = StudyRecords(store)
    model = build_model(settings)
    label_config = client.projects.get(rating_project).label_config
    design = StudyDesign("randomized", shown_share=0.5, seed="t1", repeat_share=0.2)
    result = import_conversations(client, rating_project, study.conversations[:10], store,
                                  predict=model.import_predictor(label_config), design=design, taxonomy=TAXONOMY)

    tasks = {t.data["task_key"]: t for t in client.tasks.list(project=rating_project, fields="all", page_size=1000)}
    assert len(tasks) == result.created
    arms = {key: t.data["prefill"] for key, t in tasks.items()}
    assert set(arms.values()) == {SHOWN, HIDDEN}
    for key, task in tasks.items():
        versions = [p["model_version"] for p in (dict(x) for x in task.predictions or [])]
        assert versions == (["v1"] if arms[key] == SHOWN else []), key
    assert all(arms[k] == HIDDEN for k in tasks if k.endswith(REPEAT_SUFFIX))
    assert result.predicted == sum(a == SHOWN for a in arms.values())

    # The store keeps every task's arm (as drawn) and a prediction for every task, both arms, with the
    # generic model's next to the served one.
    stored_arms = records.arms_frame()
    assert dict(zip(stored_arms["task_key"], stored_arms["arm"])) == arms
    assert set(stored_arms["seed"]) == {"t1"} and set(stored_arms["policy"]) == {"randomized"}
    recorded = records.predictions_frame()
    assert sorted(recorded["task_key"]) == sorted(tasks) and set(recorded["version"]) == {"v1"}
    assert dict(zip(recorded["task_key"], recorded["arm"])) == arms
    controls = set(bundles[0].controls)
    for row in recorded.itertuples():
        assert set(row.levels) == set(row.generic_levels) == set(row.expected) == controls
        assert row.kind in ("personalized", "traits", "generic")

    # What Label Studio's editor would ask the backend for a hidden task: nothing to show.
    hidden_task = next(t for k, t in tasks.items() if arms[k] == HIDDEN)
    answer = model.predict([{"id": hidden_task.id, "data": dict(hidden_task.data)}], label_config=label_config)
    assert answer[0]["result"] == []
    shown_task = next(t for k, t in tasks.items() if arms[k] == SHOWN)
    assert model.predict([{"id": shown_task.id, "data": dict(shown_task.data)}], label_config=label_config)[0]["result"]

    # One pass of the model gives the same answers /predict gives, task by task, and the same records.
    sample = [{"id": t.id, "data": dict(t.data)} for t in list(tasks.values())[:40]]
    answers, made = model.predict_and_record(sample, label_config)
    assert answers == model.predict(sample, label_config=label_config)
    assert made == model.prediction_records(sample)
    assert {a["kind"] == "hidden" for a in answers} == {True, False}

    # Importing the batch again draws nothing new and records nothing twice.
    again = import_conversations(client, rating_project, study.conversations[:10], store,
                                 predict=model.import_predictor(label_config), design=design, taxonomy=TAXONOMY)
    assert again.created == 0
    assert len(records.predictions_frame()) == len(recorded)

    # A new version: pre-annotation pushes shown tasks only and records every task once for it.
    registry.add(bundles[1], "v2")
    registry.promote("v2")
    model = build_model(settings)
    run = Preannotator(client, model, rating_project, records=records).run()
    n_shown = sum(a == SHOWN for a in arms.values())
    assert (run.version, run.pushed, run.recorded, run.failed) == ("v2", n_shown, len(tasks), [])
    recorded = records.predictions_frame()
    assert Counter(recorded["version"]) == {"v1": len(tasks), "v2": len(tasks)}
    for key, task in ((t.data["task_key"], t) for t in client.tasks.list(project=rating_project, fields="all",
                                                                          page_size=1000)):
        versions = sorted(p["model_version"] for p in (dict(x) for x in task.predictions or []))
        assert versions == (["v1", "v2"] if arms[key] == SHOWN else []), key
    again = Preannotator(client, model, rating_project, records=records).run()
    assert (again.pending, again.pushed, again.recorded) == (0, 0, 0)  # hidden ones are done once recorded
