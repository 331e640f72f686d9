"""The HTTP contract Label Studio 1.23 relies on, through Flask's test client."""

from __future__ import annotations

import logging
import os
import threading

import pytest
from sense7.ml_backend.labels import rating_controls

from sense7.taxonomy import load_taxonomy
from tests.support.backend import PASSWORD, SECRET, USER, auth_headers, task
from tests.support.fake_bundle import FakeBundle

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

CONTROLS = load_taxonomy().controls
ROUTES = [("get", "/health"), ("post", "/setup"), ("post", "/predict"), ("post", "/webhook"), ("get", "/versions")]


def predict(client, tasks, label_config, **extra):
    body = {"tasks": tasks, "project": "1.1700000000", "label_config": label_config,
            "params": {"login": None, "password": None, "context": None}, **extra}
    return client.post("/predict", json=body)


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_requires_basic_auth(served, make_app, method, path):
    client = make_app().test_client()
    for headers in ({}, auth_headers(password="wrong"), auth_headers(user="other"),
                    {"Authorization": f"Bearer {PASSWORD}"}):
        response = getattr(client, method)(path, json={}, headers=headers)
        assert response.status_code == 401, (path, headers)
        assert "basic auth" in response.get_json()["error"]
        assert response.headers["WWW-Authenticate"].startswith("Basic")
    ok = getattr(client, method)(path, json={"action": "START_TRAINING"} if path == "/webhook" else {},
                                 headers=auth_headers())
    assert ok.status_code != 401


def test_health_and_versions(client, served):
    assert client.get("/health").get_json() == {"status": "UP", "model_class": "Sense7Model", "model_version": "v1",
                                                "worker": os.getpid()}
    served.add(FakeBundle("v2"))
    body = client.get("/versions").get_json()
    assert body == {"versions": ["v1", "v2"], "current": "v1"}


def test_setup_answers_with_held_version_without_loading(served, make_app, label_config):
    """/setup must not wait for a model load: while the process's thread is stuck loading v2, it answers v1."""
    app = make_app(check_interval=0.05)
    client = app.test_client()
    hot = app.extensions["sense7_model"].hot_model
    gate, entered = threading.Event(), threading.Event()
    real_loader = served.loader

    def slow_loader(path):
        entered.set()
        assert gate.wait(10)
        return real_loader(path)

    served.add(FakeBundle("v2", level=4))
    served.promote("v2")  # promote's own test load uses the fast loader
    served.loader = slow_loader
    body = {"project": "1.1700000000", "schema": label_config, "hostname": "http://localhost:8080",
            "access_token": "tok-should-not-leak", "extra_params": None}
    first = client.post("/setup", json=body, headers=auth_headers())
    assert first.status_code == 200 and first.get_json() == {"model_version": "v1"}
    hot.start()
    try:
        assert entered.wait(5)  # the background thread is loading v2 meanwhile
        assert client.post("/setup", json=body, headers=auth_headers()).get_json() == {"model_version": "v1"}
    finally:
        gate.set()
        hot.stop()  # after the load under way
    assert hot.peek().version == "v2"
    assert client.post("/setup", json=body, headers=auth_headers()).get_json() == {"model_version": "v2"}


def test_predict_one_result_per_task_in_order(client, label_config):
    tasks = [task(11, "r1"), task(12, "r2", turn_index=3), task(13, "stranger")]
    response = predict(client, tasks, label_config)
    assert response.status_code == 200
    results = response.get_json()["results"]
    assert len(results) == 3
    assert [r["kind"] for r in results] == ["personalized", "traits", "generic"]
    for r in results:
        assert r["model_version"] == "v1"
        assert 0 < r["score"] <= 1
        assert [item["from_name"] for item in r["result"]] == CONTROLS
        assert {item["to_name"] for item in r["result"]} == {"turn"}
        assert all(item["type"] == "rating" and item["value"] == {"rating": 2} for item in r["result"])


def test_task_without_rater_id_gets_its_own_error(client, label_config):
    tasks = [task(21), task(22, rater_id=None), task(23, turn=None), {"id": 24}, task(25, turn_index="x")]
    results = predict(client, tasks, label_config).get_json()["results"]
    assert len(results) == 5
    assert len(results[0]["result"]) == len(CONTROLS) and "error" not in results[0]
    assert results[1]["result"] == [] and "task 22" in results[1]["error"] and "rater_id" in results[1]["error"]
    assert "task 23" in results[2]["error"] and "'turn'" in results[2]["error"]
    assert "task 24" in results[3]["error"] and "data" in results[3]["error"]
    assert "turn_index" in results[4]["error"]
    assert all(r["model_version"] == "v1" for r in results)


def test_empty_batch(client, label_config):
    assert predict(client, [], label_config).get_json() == {"results": []}


@pytest.mark.parametrize("body,reason", [
    (b"not json", "JSON object"),
    (b"[1, 2]", "JSON object"),
    (b'{"tasks": {"id": 1}}', "'tasks' must be a list"),
])
def test_malformed_predict_body_is_400_with_reason(client, body, reason):
    response = client.post("/predict", data=body, content_type="application/json")
    assert response.status_code == 400
    assert reason in response.get_json()["error"]


@pytest.mark.parametrize("config,reason", [
    ("<View><Rating name=", "not valid XML"),
    ("<View><Text name='t' value='$t'/></View>", "no <Rating>"),
    (None, "empty"),
])
def test_bad_label_config_is_400(client, config, reason):
    response = predict(client, [task(1)], config, project="999.1")
    assert response.status_code == 400
    assert reason in response.get_json()["error"]


def test_label_config_from_setup_is_used_when_predict_has_none(client, label_config):
    client.post("/setup", json={"project": "5.1700000000", "schema": label_config})
    response = client.post("/predict", json={"tasks": [task(1)], "project": "5.1700000000"})
    assert response.status_code == 200
    assert len(response.get_json()["results"][0]["result"]) == len(CONTROLS)


def test_from_and_to_names_follow_a_changed_label_config(client):
    config = """<View>
      <Paragraphs name="reply" value="$turn" nameKey="role" textKey="content"/>
      <Rating name="overall" toName="reply" maxRating="5"/>
      <Rating name="tone" toName="reply" maxRating="5"/>
      <Rating name="politeness" toName="reply" maxRating="5"/>
    </View>"""
    results = predict(client, [task(1), task(2, "r2")], config).get_json()["results"]
    for r in results:
        # politeness is not a control the model knows: nothing is invented for it
        assert [(i["from_name"], i["to_name"]) for i in r["result"]] == [("overall", "reply"), ("tone", "reply")]


def test_levels_are_clipped_to_the_configs_max_rating(served, client):
    served.add(FakeBundle("v2", level=5))
    served.promote("v2")
    config = '<View><Text name="t" value="$x"/><Rating name="overall" toName="t" maxRating="3"/></View>'
    client.application.extensions["sense7_model"].hot_model.refresh()
    item = predict(client, [task(1)], config).get_json()["results"][0]["result"][0]
    assert item["value"] == {"rating": 3}


def test_no_model_yet(registry, make_app, label_config):
    client = make_app().test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = auth_headers()["Authorization"]
    assert client.post("/setup", json={"schema": label_config}).get_json() == {"model_version": "untrained"}
    response = predict(client, [task(1)], label_config)
    assert response.status_code == 503
    assert "no model" in response.get_json()["error"]


def test_webhook_needs_the_shared_secret(client, events):
    payload = {"action": "ANNOTATION_CREATED", "project": {"id": 3}, "annotation": {"id": 9}}
    assert client.post("/webhook", json=payload).status_code == 403
    wrong = client.post("/webhook", json=payload, headers={"X-Sense7-Secret": SECRET + "x"})
    assert wrong.status_code == 403 and "X-Sense7-Secret" in wrong.get_json()["error"]
    assert events == []
    ok = client.post("/webhook", json=payload, headers={"X-Sense7-Secret": SECRET})
    assert ok.status_code == 202 and ok.get_json() == {"status": "accepted", "action": "ANNOTATION_CREATED"}
    assert events == [("ANNOTATION_CREATED", payload)]


def test_start_training_from_label_studio_is_accepted_with_basic_auth(client, events):
    """Label Studio's ML API cannot add the secret header; its basic auth authenticates START_TRAINING."""
    payload = {"action": "START_TRAINING", "project": {"id": 3, "title": "x"}}  # no 'annotation' key
    assert client.post("/webhook", json=payload).status_code == 202
    assert events == [("START_TRAINING", payload)]


def test_start_training_needs_basic_auth_not_the_secret_every_member_can_read(served, registry, store, tmp_path):
    """The X-Sense7-Secret header is readable by any Label Studio member (/api/webhooks): it wakes a
    re-read at most and never starts training; without basic auth configured, nothing does."""
    from sense7.ml_backend.app import create_app
    from sense7.ml_backend.hot_model import HotModel
    from sense7.ml_backend.model import Sense7Model
    from sense7.ml_backend.rater_info import RaterInfoCache

    from sense7.settings import Settings

    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path / "h2"), "SENSE7_WEBHOOK_SECRET": SECRET,
                                  "SENSE7_BACKEND_AUTH": "off"})
    got = []
    app = create_app(settings, model=Sense7Model(HotModel(registry), RaterInfoCache(store, TAXONOMY), TAXONOMY),
                     on_event=lambda a, p: got.append(a))
    client = app.test_client()
    assert client.get("/health").status_code == 200  # basic auth switched off explicitly: open
    assert client.post("/webhook", json={"action": "START_TRAINING"}).status_code == 403
    forged = client.post("/webhook", json={"action": "START_TRAINING"}, headers={"X-Sense7-Secret": SECRET})
    assert forged.status_code == 403 and "basic auth" in forged.get_json()["error"]
    assert got == []


def test_basic_auth_is_on_by_default_with_generated_credentials(served, registry, store, tmp_path, label_config):
    import base64
    import stat

    from sense7.ml_backend.app import create_app
    from sense7.ml_backend.hot_model import HotModel
    from sense7.ml_backend.model import Sense7Model
    from sense7.ml_backend.rater_info import RaterInfoCache

    from sense7.settings import Settings

    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path / "h3")})
    assert settings.backend_user and len(settings.backend_password) >= 32
    secret_file = tmp_path / "h3" / "secrets" / "backend_password"
    assert secret_file.read_text() == settings.backend_password
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600 and stat.S_IMODE((tmp_path / "h3").stat().st_mode) == 0o700
    hot = HotModel(registry)
    hot.refresh()
    client = create_app(settings, model=Sense7Model(hot, RaterInfoCache(store, TAXONOMY), TAXONOMY)).test_client()
    body = {"tasks": [task(1)], "label_config": label_config}
    stranger = client.post("/predict", json=body)
    assert stranger.status_code == 401 and b"results" not in stranger.data
    creds = base64.b64encode(f"{settings.backend_user}:{settings.backend_password}".encode()).decode()
    assert client.post("/predict", json=body, headers={"Authorization": f"Basic {creds}"}).status_code == 200


def test_malformed_events_are_400_not_503(client, served, make_app):
    """A payload that names no annotation is the sender's fault (400); only a broker outage is a 503."""
    from sense7.tasks.sync import on_event

    app = make_app()
    app.extensions["sense7_model"].on_event = on_event  # raises MalformedEvent before touching Redis
    events = app.test_client()
    for payload in ({"action": "ANNOTATION_CREATED"}, {"action": "ANNOTATION_UPDATED", "annotation": {"id": "x"}},
                    {"action": "ANNOTATIONS_DELETED", "annotations": "all"}):
        answer = events.post("/webhook", json=payload, headers={"X-Sense7-Secret": SECRET, **auth_headers()})
        assert answer.status_code == 400, (payload, answer.get_json())
        assert "annotation" in answer.get_json()["error"]


def test_webhook_malformed_and_failing_handler(client, served, make_app):
    response = client.post("/webhook", json={"project": 1}, headers={"X-Sense7-Secret": SECRET})
    assert response.status_code == 400 and "'action'" in response.get_json()["error"]
    app = make_app()
    app.extensions["sense7_model"].on_event = lambda a, p: 1 / 0
    failing = app.test_client().post("/webhook", json={"action": "ANNOTATION_UPDATED"},
                                     headers={"X-Sense7-Secret": SECRET, **auth_headers()})
    assert failing.status_code == 503 and "ZeroDivisionError" in failing.get_json()["error"]


def test_request_size_limit(served, make_app, label_config):
    client = make_app(max_content_length=10_000).test_client()
    big = [task(i, history=[{"role": "user", "content": "x" * 2000}]) for i in range(10)]
    response = client.post("/predict", json={"tasks": big, "label_config": label_config}, headers=auth_headers())
    assert response.status_code == 413
    assert "larger than 10000 bytes" in response.get_json()["error"]
    # The same body sent chunked (no Content-Length; gunicorn marks such input terminated) is also a 413,
    # not a 400 "not a JSON object".
    import io
    import json

    raw = json.dumps({"tasks": big, "label_config": label_config}).encode()
    chunked = client.post("/predict", input_stream=io.BytesIO(raw),
                          headers={**auth_headers(), "Content-Type": "application/json",
                                   "Transfer-Encoding": "chunked"},
                          environ_overrides={"wsgi.input_terminated": True})
    assert chunked.status_code == 413, chunked.get_json()


def test_unknown_route_and_method_are_json(client):
    assert client.get("/nope").status_code == 404
    response = client.get("/predict")
    assert response.status_code == 405 and "error" in response.get_json()


def test_no_secrets_or_traits_in_logs_or_responses(client, label_config, caplog):
    caplog.set_level(logging.DEBUG)
    client.post("/setup", json={"project": "1.1", "schema": label_config, "access_token": "tok-abc-123"})
    responses = [
        predict(client, [task(1), task(2, "r2"), task(3, rater_id=None)], label_config).get_data(as_text=True),
        client.post("/webhook", json={"action": "X"}, headers={"X-Sense7-Secret": "guess"}).get_data(as_text=True),
        client.get("/health").get_data(as_text=True),
        client.get("/versions").get_data(as_text=True),
    ]
    text = caplog.text + "".join(responses)
    for secret in (PASSWORD, SECRET, "tok-abc-123", "25-34", "ai_trust", "tipi", USER):
        assert secret not in text


def test_rating_controls_parse_document_order():
    config = ('<View><Text name="a" value="$a"/><View><Rating name="x" toName="a" maxRating="7"/></View>'
              '<Rating name="y" toName="a"/></View>')
    assert [(c.from_name, c.to_name, c.max_rating) for c in rating_controls(config)] == [("x", "a", 7), ("y", "a", 5)]


def test_traits_are_refreshed_from_the_store(client, store, label_config):
    assert predict(client, [task(1, "late")], label_config).get_json()["results"][0]["kind"] == "generic"
    store.upsert_raters([{"rater_id": "late", "traits": {"ai_trust": 5, "llm_use": "daily"}}])
    assert predict(client, [task(1, "late")], label_config).get_json()["results"][0]["kind"] == "traits"


def test_store_outage_keeps_the_last_good_copy(served, make_app, store, label_config, caplog):
    app = make_app()
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = auth_headers()["Authorization"]
    assert predict(client, [task(1, "r2")], label_config).get_json()["results"][0]["kind"] == "traits"
    cache = app.extensions["sense7_model"].rater_info

    def down(*args, **kwargs):
        raise ConnectionError("store down")

    cache.store = type("DownStore", (), {"raters_frame": down, "contexts_for": down})()
    results = predict(client, [task(1, "r2"), task(2, "r1")], label_config).get_json()["results"]
    assert [r["kind"] for r in results] == ["traits", "personalized"]
    assert "rater traits not refreshed (ConnectionError)" in caplog.text


def test_a_task_the_model_chokes_on_fails_alone(served, client, label_config, caplog):
    served.add(FakeBundle("v2", level=3, fail_for="poison"))
    served.promote("v2")
    client.application.extensions["sense7_model"].hot_model.refresh()
    results = predict(client, [task(1, "r1"), task(2, "poison"), task(3, "r2")], label_config).get_json()["results"]
    assert [len(r["result"]) for r in results] == [len(CONTROLS), 0, len(CONTROLS)]
    assert results[1]["error"] == "task 2: prediction failed: ValueError"
    assert "predicting them one by one" in caplog.text

