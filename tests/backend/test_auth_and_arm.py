"""The checks the /predict fast path must keep (issue 23, "The backend got slower"): basic auth on every
request whatever it looks like, the study's hidden arm never answered with a prediction, and a body read
straight from the server's input still refused when it is too long or ends early."""

from __future__ import annotations

import base64
import io
import json

from tests.support.backend import PASSWORD, USER, auth_headers, task


def basic(text: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(text.encode()).decode()}


def predict_body(label_config, tasks) -> dict:
    return {"tasks": tasks, "project": "1.1700000000", "label_config": label_config,
            "params": {"login": None, "password": None, "context": None}}


def test_near_miss_credentials_are_refused_on_every_request(served, make_app, label_config):
    client = make_app().test_client()
    body = predict_body(label_config, [task(1)])
    good = auth_headers()["Authorization"]
    near_misses = [
        {"Authorization": good + "x"}, {"Authorization": good[:-1]},
        {"Authorization": "Basic " + good}, {"Authorization": good.replace("Basic ", "Bearer ")},
        basic(f"{USER}:{PASSWORD}x"), basic(f"{USER}:{PASSWORD[:-1]}"), basic(f"{USER}:{PASSWORD.upper()}"),
        basic(f"{USER}x:{PASSWORD}"), basic(f"{USER}:"), basic(f":{PASSWORD}"), basic(f"{USER}{PASSWORD}"),
        {"Authorization": ""}, {},
    ]
    for headers in near_misses:
        # Between two accepted requests: nothing of an accepted one carries over to the next.
        assert client.post("/predict", json=body, headers=auth_headers()).status_code == 200
        response = client.post("/predict", json=body, headers=headers)
        assert response.status_code == 401, headers
        assert "results" not in response.get_json()


def test_other_spellings_of_the_right_credentials_are_still_accepted(served, make_app, label_config):
    client = make_app().test_client()
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for header in (f"Basic {token}", f"basic {token}", f"BASIC {token}"):
        response = client.post("/predict", json=predict_body(label_config, [task(1)]),
                               headers={"Authorization": header})
        assert response.status_code == 200, header


def test_hidden_arm_tasks_get_no_prediction(client, label_config):
    tasks = [task(1, prefill="hidden"), task(2, prefill="shown"), task(3), task(4, "r2", prefill="hidden")]
    results = client.post("/predict", json=predict_body(label_config, tasks)).get_json()["results"]
    assert [r["kind"] for r in results] == ["hidden", "personalized", "personalized", "hidden"]
    for hidden in (results[0], results[3]):
        assert hidden == {"result": [], "score": 0.0, "model_version": "v1", "kind": "hidden"}
    assert all(len(r["result"]) == 8 for r in (results[1], results[2]))


def test_a_body_shorter_than_its_length_is_408_and_a_long_one_413(served, make_app, label_config):
    client = make_app(max_content_length=10_000).test_client()
    raw = json.dumps(predict_body(label_config, [task(1)])).encode()
    headers = {**auth_headers(), "Content-Type": "application/json"}
    short = client.post("/predict", input_stream=io.BytesIO(raw[:50]), headers=headers,
                        environ_overrides={"CONTENT_LENGTH": str(len(raw))})
    assert short.status_code == 408, short.get_json()
    declared = client.post("/predict", input_stream=io.BytesIO(raw), headers=headers,
                           environ_overrides={"CONTENT_LENGTH": "10001"})
    assert declared.status_code == 413, declared.get_json()
    whole = client.post("/predict", input_stream=io.BytesIO(raw), headers=headers,
                        environ_overrides={"CONTENT_LENGTH": str(len(raw))})
    assert whole.status_code == 200 and len(whole.get_json()["results"]) == 1
