"""A study with its own taxonomy (3 controls, 7 levels), set once as SENSE7_TAXONOMY for the whole real
stack: Label Studio projects, `sense7 import`, sync, retrain, the ML backend and `sense7 evaluate`."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import requests

from sense7.model.registry import ModelRegistry
from sense7.taxonomy import TURN_TAG, load_taxonomy
from tests.support.taxonomy import SEVEN_POINT_CONTROLS, write_seven_point_taxonomy
from tests.support.jobs import WARM, annotate, ensure_users, make_conversations, make_raters, project_tasks, wait_for

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

SENSE7 = str(Path(sys.executable).parent / "sense7")


def seven_point_result(turn_text: str, bias: int, tax) -> list[dict]:
    """Warm turns high, cold ones low on the 1..7 scale, shifted by the rater's bias."""
    level = max(1, min(tax.levels, (6 if turn_text in WARM else 2) + bias))
    result = [{"from_name": c, "to_name": TURN_TAG, "type": "rating", "value": {"rating": level}} for c in tax.controls]
    result.append({"from_name": tax.expectation_key, "to_name": TURN_TAG, "type": "choices",
                   "value": {"choices": ["yes" if level >= 4 else "no"]}})
    return result


def cli(stack, *args, timeout=300):
    done = subprocess.run([SENSE7, *map(str, args)], env=stack.env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"sense7 {' '.join(map(str, args))}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_study_taxonomy_setting_drives_the_whole_stack(job_stack, tmp_path):
    taxonomy_path = write_seven_point_taxonomy(tmp_path)
    tax = load_taxonomy(taxonomy_path)
    job_stack.env["SENSE7_TAXONOMY"] = str(taxonomy_path)
    # This test is about the taxonomy: one task per turn and rater, every one pre-filled.
    job_stack.env.update({"SENSE7_REPEAT_SHARE": "0", "SENSE7_PREFILL": "shown"})

    # Import through the CLI: it creates the projects from the study's taxonomy.
    raters = make_raters(3, prefix="t")
    convs = make_conversations([r["rater_id"] for r in raters], prefix="t")
    batch = tmp_path / "conversations.jsonl"
    batch.write_text("".join(json.dumps(c.to_json()) + "\n" for c in convs))
    raters_csv = tmp_path / "raters.csv"
    keys = [f.key for f in tax.profile_fields]
    raters_csv.write_text("rater_id,email," + ",".join(keys) + "\n" + "".join(
        f"{r['rater_id']},{r['email']}," + ",".join(str(r["traits"][k]) for k in keys) + "\n" for r in raters))
    cli(job_stack, "raters", "import", raters_csv)
    assert "54 task(s) in the batch: 54 created" in " ".join(cli(job_stack, "import", batch).split())

    rt = job_stack.runtime()
    assert rt.taxonomy.controls == list(SEVEN_POINT_CONTROLS) and rt.taxonomy.levels == 7
    label_config = rt.client.projects.get(rt.rating_project).label_config
    ratings = {r.get("name"): r.get("maxRating") for r in ET.fromstring(label_config).iter("Rating")}
    assert ratings == dict.fromkeys(SEVEN_POINT_CONTROLS, "7")

    # Raters answer on the rater page; their submissions are delivered as their accounts.
    users = ensure_users(rt.client, raters)
    tasks = project_tasks(rt.client, rt.rating_project)
    assert len(tasks) == 54
    bias = {r["rater_id"]: b for r, b in zip(raters, (-1, 0, 1))}
    for task in tasks:
        rater = task.data["rater_id"]
        annotate(rt.client, task, users[rater], store=rt.store,
                 result=seven_point_result(task.data["turn"][0]["content"], bias[rater], tax))

    # Sync (reconcile) and retrain on the worker, which reads the same setting.
    job_stack.start_worker()
    synced = job_stack.run("sense7.reconcile")
    assert not synced.get("invalid"), synced
    wait_for(lambda: rt.store.counts()["ratings"] == 54 * len(SEVEN_POINT_CONTROLS), timeout=120,
             what="54 annotations x 3 controls in the store")
    stored = rt.store.rating_data(tax).ratings
    assert set(stored["dimension"]) == set(SEVEN_POINT_CONTROLS) | {tax.expectation_key}
    assert stored.loc[stored["dimension"] != tax.expectation_key, "rating"].max() == 7
    result = job_stack.run("sense7.retrain", reason="custom taxonomy")
    assert result["status"] == "promoted" and result["version"] == "v1", result
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    assert registry.current() == "v1"

    # The ML backend predicts exactly the study's controls, on its scale.
    job_stack.start_backend()
    body = {"tasks": [{"id": t.id, "data": t.data} for t in tasks], "label_config": label_config}
    answer = requests.post(f"{job_stack.backend_url}/predict", json=body, auth=job_stack.backend_auth, timeout=60)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert len(results) == 54
    for prediction in results:
        assert "error" not in prediction, prediction
        values = {r["from_name"]: r["value"]["rating"] for r in prediction["result"] if r["type"] == "rating"}
        assert set(values) == set(SEVEN_POINT_CONTROLS), prediction
        assert all(1 <= v <= 7 for v in values.values())
    # The served model knows the whole 7-point scale (not the packaged 5), whatever it predicts here.
    assert registry.load("v1").levels == list(range(1, 8))
    # It learned the raters' use of the scale: warm turns of the lenient rater (truth 7) come out above 5.
    lenient = [p for p, t in zip(results, tasks)
               if bias[t.data["rater_id"]] == 1 and t.data["turn"][0]["content"] in WARM]
    assert lenient and all(r["value"]["rating"] > 5 for p in lenient for r in p["result"] if r["type"] == "rating")

    # The collected ratings exported as native files evaluate under the same setting.
    ratings_csv = tmp_path / "ratings.csv"
    stored.to_csv(ratings_csv, index=False)
    json_path = tmp_path / "eval.json"
    cli(job_stack, "evaluate", "--conversations", batch, "--ratings", ratings_csv, "--raters", raters_csv,
        "--splits", "known_rater", "--folds", "3", "--boot", "20", "--models", "majority,rater_mean,personalized",
        "--json", json_path)
    saved = json.loads(json_path.read_text())
    assert saved["controls"] == list(SEVEN_POINT_CONTROLS) and saved["levels"] == list(range(1, 8))
    assert list(saved["splits"]["known_rater"]["models"]["personalized"]["per_control"]) == list(SEVEN_POINT_CONTROLS)
