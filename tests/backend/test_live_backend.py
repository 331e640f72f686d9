"""Staff see the same (issue 25 item 5): a real ML backend process, asked by Label Studio for a task of a
rater who answered on the rater page since the served version was trained, answers with the same live
posterior the rater page pre-fills with, and says how many of the rater's answers it used. A rater without
newer answers gets exactly the served version's answer; a hidden-arm task still gets the empty result.
Real parts: the rater page (Flask test client) and the backend (`sense7 backend start`, gunicorn) on one
SQLite store, and a version trained on a synthetic study."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests

from sense7.labelstudio.protocol import rating_tasks
from sense7.processes import free_port
from sense7.rater_page.app import create_app
from sense7.rater_page.services import EXTENSION
from sense7.settings import BACKEND_HOST, Settings, StudyDesign
from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.store.study_design import HIDDEN, SHOWN, StudyRecords
from sense7.taxonomy import load_taxonomy, render_rating_config
from tests.support.backend import PASSWORD, SECRET, USER, auth_headers
from tests.support.rater_page import NEW, answer_on_page, checked_levels, serve_trained, trained_version

TAXONOMY = load_taxonomy()
HIDDEN_TURN = 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A version trained on a synthetic study; the newcomer gets 2 held-out conversations of its own."""
    return trained_version(tmp_path_factory)


def backend_cli(env, *args):
    sense7 = os.path.join(os.path.dirname(sys.executable), "sense7")
    return subprocess.run([sense7, *args], env=env, capture_output=True, text=True, timeout=120)


def rater_page_study(tmp_path, trained):
    """The newcomer's queue on the rater page (hidden arm: turn 4): (store URL, page app, link, task datas)."""
    model_dir, newcomer, profile = trained
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = Store(store_url)
    serve_trained(store, model_dir)
    store.upsert_conversations(newcomer)
    datas = [t["data"] for conv in newcomer for t in rating_tasks(conv)]
    planned = [{"data": {**d, "prefill": HIDDEN if i == HIDDEN_TURN else SHOWN}} for i, d in enumerate(datas)]
    StudyRecords(store).record_arms(planned, StudyDesign(prefill="randomized", shown_share=0.5), seed="s")
    items = [{"task_id": 1, "kind": "profile", "position": -1, "conversation_id": None, "turn_index": None,
              "data": {}, "prediction": None, "answer": {"traits": profile}}]
    items += [{"task_id": 100 + i, "kind": "rating", "position": i, "conversation_id": d["conversation_id"],
               "turn_index": d["turn_index"], "data": {"history": d["history"], "turn": d["turn"], "repeat": False,
                                                       "instructed": None},
               "prediction": None, "answer": None} for i, d in enumerate(datas)]
    RaterQueue(store).replace(NEW, items)
    token = LinkBook(store).issue(NEW)
    page = create_app(Settings.from_env({"SENSE7_HOME": str(tmp_path / "page-home"),
                                         "SENSE7_MODEL_DIR": str(model_dir)}), taxonomy=TAXONOMY, store=store)
    # What a page process's background thread does at its start (sense7.rater_page.wsgi): load the served version
    # for live pre-fills; a request never loads it.
    page.extensions[EXTENSION].live_prefills.refresh()
    return store_url, page, token, datas


@pytest.fixture
def study(tmp_path, trained):
    """The rater page's study and a running backend (`sense7 backend start`) on the same store."""
    store_url, page, token, datas = rater_page_study(tmp_path, trained)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSE7_")}
    env.update(SENSE7_HOME=str(tmp_path / "home"), SENSE7_BACKEND_PORT=str(port), SENSE7_BACKEND_USER=USER,
               SENSE7_BACKEND_PASSWORD=PASSWORD, SENSE7_WEBHOOK_SECRET=SECRET, SENSE7_BACKEND_WORKERS="1",
               SENSE7_MODEL_DIR=str(trained[0]), SENSE7_STORE_URL=store_url)
    started = backend_cli(env, "backend", "start")
    assert started.returncode == 0, started.stderr
    try:
        yield page, token, datas, f"http://{BACKEND_HOST}:{port}"
    finally:
        assert backend_cli(env, "backend", "stop").returncode == 0


def predict(url: str, data: dict, task_id: int, auth=(USER, PASSWORD)) -> requests.Response:
    body = {"tasks": [{"id": task_id, "data": data}], "label_config": render_rating_config(TAXONOMY)}
    return requests.post(f"{url}/predict", json=body, auth=auth, timeout=30)


def levels_of(answer: dict) -> dict:
    return {r["from_name"]: r["value"]["rating"] for r in answer["result"]}


@pytest.mark.slow
def test_backend_uses_the_raters_newer_answers_like_the_rater_page(study):
    page, token, datas, url = study
    target, hidden = datas[3], {**datas[HIDDEN_TURN], "prefill": HIDDEN}
    other = {**datas[3], "rater_id": "someone-else", "task_key": datas[3]["task_key"].replace(NEW, "someone-else")}

    before = predict(url, target, 103).json()["results"][0]
    other_before = predict(url, other, 900).json()["results"][0]
    assert before["model_version"] == "v1" and before["kind"] != "live" and "own_ratings" not in before
    assert predict(url, target, 103, auth=None).status_code == 401  # a stranger learns nothing

    client = page.test_client()
    assert client.get(f"/r/{token}").status_code == 303
    for task_id in (100, 101, 102):
        answer_on_page(client, task_id, 5)
    shown = checked_levels(client.get("/task/103").get_data(as_text=True))  # the rater page's live pre-fill

    after = before
    for _ in range(60):  # the backend re-reads who answered at most once a second
        after = predict(url, target, 103).json()["results"][0]
        if "own_ratings" in after:
            break
        time.sleep(0.5)
    assert (after["kind"], after["own_ratings"], after["live_version"]) == ("live", 3, "v1+live")
    assert after["model_version"] == "v1"  # what /setup reports: Label Studio does not re-ask forever
    assert sum(levels_of(after).values()) > sum(levels_of(before).values())  # three answers of 5s moved it up
    assert levels_of(after) == shown  # Label Studio's editor and the rater page agree

    # An answered turn is predicted without its own answer (as the rater page would): 2 of them.
    answered = predict(url, datas[0], 100).json()["results"][0]
    assert (answered["kind"], answered["own_ratings"]) == ("live", 2)
    # Another rater of the same turn: exactly the served version's answer, nothing of this rater's.
    assert predict(url, other, 900).json()["results"][0] == other_before
    # The hidden arm: still the empty result of the served version.
    hidden_answer = predict(url, hidden, 104).json()["results"][0]
    assert hidden_answer["result"] == [] and hidden_answer["kind"] == "hidden" and "own_ratings" not in hidden_answer


def test_no_store_query_per_request_once_the_answers_are_known(tmp_path, trained):
    """Between two looks at the outbox (at most one per `check_interval`), /predict reads nothing of the
    store: not for a rater without answers, not for one whose live posterior is already known."""
    from sqlalchemy import event

    from sense7.store.rater_page_tables import Outbox
    from sense7.ml_backend.app import create_app as backend_app
    from sense7.ml_backend.hot_model import HotModel
    from sense7.ml_backend.editor_prefills import LiveServing
    from sense7.ml_backend.model import Sense7Model
    from sense7.ml_backend.rater_info import RaterInfoCache
    from sense7.model.registry import ModelRegistry

    store_url, _, _, datas = rater_page_study(tmp_path, trained)
    store = Store(store_url)
    hot = HotModel(ModelRegistry(trained[0], store))
    hot.refresh()
    live = LiveServing(store, TAXONOMY, check_interval=0.0)
    model = Sense7Model(hot, RaterInfoCache(store, TAXONOMY, refresh_seconds=3600), TAXONOMY, live=live)
    app = backend_app(Settings.from_env({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_MODEL_DIR": str(trained[0]),
                                         "SENSE7_STORE_URL": store_url, "SENSE7_BACKEND_USER": USER,
                                         "SENSE7_BACKEND_PASSWORD": PASSWORD, "SENSE7_WEBHOOK_SECRET": SECRET}),
                      model=model)
    client = app.test_client()
    config = render_rating_config(TAXONOMY)

    def ask(data, task_id):
        response = client.post("/predict", json={"tasks": [{"id": task_id, "data": data}], "label_config": config},
                               headers=auth_headers())
        assert response.status_code == 200, response.get_json()
        return response.get_json()["results"][0]

    static = ask(datas[3], 103)
    outbox = Outbox(store)
    for i in range(3):  # rows written to the outbox as the rater page writes them
        answer = {"values": {c: 5 for c in TAXONOMY.controls}, "expectation": None, "comment": ""}
        assert outbox.add_next(NEW, "rating", 100 + i, [], answer, 10.0) == 1
    first = ask(datas[3], 103)
    assert (first["kind"], first["own_ratings"]) == ("live", 3) and first["result"] != static["result"]

    other_data = {**datas[3], "rater_id": "someone-else"}
    ask(other_data, 900)  # (its context, read once per period by the rater-info cache: not this module's)
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    live.check_interval = 3600.0  # no look at the outbox is due
    for _ in range(5):
        assert ask(datas[3], 103) == first
        other = ask(other_data, 900)
        assert "own_ratings" not in other and other["kind"] != "live"
    assert statements == []
    live.check_interval = 0.0  # a look is due: one aggregate, and nothing more while nothing changed
    ask(datas[3], 103)
    assert len(statements) == 1 and "submissions" in statements[0]
