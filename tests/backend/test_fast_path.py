"""The /predict fast path (ml_backend/fast_path.py, issue 23 "The backend got slower") in front of the Flask
app: taken only for POST /predict with Label Studio's exact credentials header and a declared length, and
then answering exactly as the Flask path does; everything else reaches Flask's own checks."""

from __future__ import annotations

import base64
import io
import json

import pytest
from sense7.ml_backend.fast_path import PredictFastPath

from tests.support.backend import PASSWORD, USER, auth_headers, task

GOOD = auth_headers()["Authorization"]


def predict_body(label_config, tasks) -> dict:
    return {"tasks": tasks, "project": "1.1700000000", "label_config": label_config,
            "params": {"login": None, "password": None, "context": None}}


def counted(app) -> list:
    """`app`, with every request that reaches Flask counted (the fast path's never do)."""
    seen = []
    app.before_request_funcs.setdefault(None, []).insert(0, lambda: seen.append(1))
    return seen


def post(client, raw: bytes, headers: dict, length: int | None = None):
    overrides = {"CONTENT_LENGTH": str(len(raw) if length is None else length)}
    return client.post("/predict", input_stream=io.BytesIO(raw),
                       headers={"Content-Type": "application/json", **headers}, environ_overrides=overrides)


def test_the_fast_path_is_in_front_and_only_for_the_exact_credentials(served, make_app, label_config):
    app = make_app()
    assert isinstance(app.wsgi_app, PredictFastPath)
    flask_requests = counted(app)
    client = app.test_client()
    raw = json.dumps(predict_body(label_config, [task(1)])).encode()
    answer = post(client, raw, {"Authorization": GOOD})
    assert answer.status_code == 200 and len(answer.get_json()["results"]) == 1
    assert flask_requests == []  # answered without Flask
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert post(client, raw, {"Authorization": f"basic {token}"}).status_code == 200  # another spelling: Flask
    assert len(flask_requests) == 1
    for headers in ({}, {"Authorization": GOOD + "x"}, {"Authorization": GOOD[:-1]}, {"Authorization": ""},
                    {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}x".encode()).decode()}):
        refused = post(client, raw, headers)
        assert refused.status_code == 401, headers
        assert "results" not in refused.get_json()
        assert refused.headers["WWW-Authenticate"].startswith("Basic")
    assert len(flask_requests) == 6
    # Other routes and methods with the right credentials: Flask.
    assert client.get("/health", headers={"Authorization": GOOD}).status_code == 200
    assert client.get("/predict", headers={"Authorization": GOOD}).status_code == 405
    assert len(flask_requests) == 8


def _both(make_app):
    fast, flask = make_app(), make_app(fast_path=False)
    assert not isinstance(flask.wsgi_app, PredictFastPath)
    return fast.test_client(), flask.test_client(), counted(fast)


def test_the_same_answers_as_the_flask_path(served, make_app, label_config):
    fast, flask, through_flask = _both(make_app)
    bodies = [
        predict_body(label_config, [task(1)]),
        predict_body(label_config, [task(1), task(2, "r2"), task(3, "stranger"), task(4, prefill="hidden"),
                                    task(5, rater_id=None), "not a task", {"id": 6}]),
        predict_body(label_config, []),
        predict_body("<View><Rating name='x'</View>", [task(1)]),  # a broken label config: 400
        {"tasks": "nope"}, {"tasks": [task(1)], "params": "odd"}, [], "text",
    ]
    raws = [json.dumps(b).encode() for b in bodies] + [b"{not json", b"", b"\xff\xfe"]
    for raw in raws:
        ours, reference = post(fast, raw, {"Authorization": GOOD}), post(flask, raw, {"Authorization": GOOD})
        assert (ours.status_code, ours.get_json()) == (reference.status_code, reference.get_json()), raw[:80]
        assert ours.headers["Content-Type"] == "application/json"
        assert int(ours.headers["Content-Length"]) == len(ours.data)
    statuses = {post(fast, raw, {"Authorization": GOOD}).status_code for raw in raws}
    assert statuses == {200, 400}
    assert through_flask == []


def test_bodies_too_long_short_or_chunked(served, make_app, label_config):
    for fast_path in (True, False):  # the same codes either way
        app = make_app(max_content_length=10_000, fast_path=fast_path)
        client = app.test_client()
        raw = json.dumps(predict_body(label_config, [task(1)])).encode()
        headers = {"Authorization": GOOD}
        assert post(client, raw[:50], headers, length=len(raw)).status_code == 408
        assert post(client, raw, headers, length=10_001).status_code == 413
        big = json.dumps(predict_body(label_config, [task(i) for i in range(60)])).encode()
        assert len(big) > 10_000
        chunked = client.post("/predict", input_stream=io.BytesIO(big), headers={
            **headers, "Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            environ_overrides={"wsgi.input_terminated": True})  # (as gunicorn marks a chunked body)
        assert chunked.status_code == 413
        assert post(client, raw, headers).status_code == 200
        for odd in ("abc", "-1", "١٢"):  # not a length the fast path reads: Flask's answer (never 500)
            assert post(client, raw, headers, length=odd).status_code in (400, 408, 413), odd


class _Stalled(io.RawIOBase):
    def read(self, size=-1):
        raise TimeoutError("timed out")  # what the worker's bounded read raises


def test_a_body_that_stops_arriving_is_408(served, make_app):
    from werkzeug.test import EnvironBuilder, run_wsgi_app

    environ = EnvironBuilder(path="/predict", method="POST", headers={"Authorization": GOOD},
                             content_type="application/json").get_environ()
    environ.update({"wsgi.input": _Stalled(), "CONTENT_LENGTH": "100"})
    body, status, _ = run_wsgi_app(make_app().wsgi_app, environ)
    assert status.startswith("408") and b"Content-Length" in b"".join(body)


@pytest.mark.parametrize("fast_path", [True, False])
def test_an_unexpected_error_is_500_naming_its_type_only(served, make_app, label_config, caplog, fast_path):
    app = make_app(fast_path=fast_path)
    model = app.extensions["sense7_model"]

    def broken(*args, **kwargs):
        raise RuntimeError("secret task text")

    model.predict = broken
    raw = json.dumps(predict_body(label_config, [task(1)])).encode()
    answer = post(app.test_client(), raw, {"Authorization": GOOD})
    assert answer.status_code == 500 and answer.get_json() == {"error": "internal error: RuntimeError"}
    assert "secret task text" not in caplog.text


def test_no_model_is_503_on_both_paths(registry, make_app, label_config):
    fast, flask, _ = _both(make_app)
    raw = json.dumps(predict_body(label_config, [task(1)])).encode()
    ours, reference = post(fast, raw, {"Authorization": GOOD}), post(flask, raw, {"Authorization": GOOD})
    assert ours.status_code == reference.status_code == 503
    assert ours.get_json() == reference.get_json()
