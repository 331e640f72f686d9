"""A serving process follows promotions without a restart and never loads a broken version."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from tests.support.backend import auth_headers, task
from tests.support.fake_bundle import FakeBundle


def _predict(client, label_config, n=1):
    response = client.post("/predict", json={"tasks": [task(i) for i in range(n)], "label_config": label_config},
                           headers=auth_headers())
    assert response.status_code == 200
    return response.get_json()["results"]


def test_promotion_is_served_by_the_next_request(served, make_app, label_config):
    client = make_app(check_interval=0.0).test_client()
    first = _predict(client, label_config)[0]
    assert first["model_version"] == "v1" and first["result"][0]["value"] == {"rating": 2}
    served.add(FakeBundle("v2", level=4))
    served.promote("v2")
    second = _predict(client, label_config)[0]
    assert second["model_version"] == "v2" and second["result"][0]["value"] == {"rating": 4}
    assert client.get("/health", headers=auth_headers()).get_json()["model_version"] == "v2"


def test_pointer_is_not_checked_more_often_than_the_interval(served, make_app, label_config):
    client = make_app(check_interval=3600.0).test_client()
    _predict(client, label_config)
    served.add(FakeBundle("v2", level=4))
    served.promote("v2")
    assert _predict(client, label_config)[0]["model_version"] == "v1"


def test_corrupt_version_is_never_loaded(served, make_app, label_config, caplog):
    app = make_app(check_interval=0.0)
    client = app.test_client()
    served.add(FakeBundle("v2", level=5))
    pkl = served.path("v2") / "bundle.pkl"
    pkl.write_bytes(pkl.read_bytes()[:20])  # corrupted after it was written
    # someone forces the pointer past promote()'s checks
    served.rows.point_at("v2")
    loads = []
    real_loader = served.loader
    served.loader = lambda path: loads.append(path) or real_loader(path)
    for _ in range(3):
        result = _predict(client, label_config)[0]
        assert result["model_version"] == "v1" and result["result"][0]["value"] == {"rating": 2}
    assert loads == []  # the checksum stopped it before unpickling
    assert "corrupt" in app.extensions["sense7_model"].hot_model.last_error
    assert "not loaded, still serving v1" in caplog.text


def test_a_pointer_to_a_missing_version_is_never_followed(served, make_app, label_config):
    client = make_app(check_interval=0.0).test_client()
    served.rows.point_at("v3")  # forced past promote()'s checks: the store holds no v3
    assert _predict(client, label_config)[0]["model_version"] == "v1"
    assert "not found" in client.application.extensions["sense7_model"].hot_model.last_error
    assert _predict(client, label_config)[0]["model_version"] == "v1"
    # a good version promoted afterwards is picked up again
    served.add(FakeBundle("v4", level=3))
    served.promote("v4")
    assert _predict(client, label_config)[0]["model_version"] == "v4"


def test_requests_keep_being_answered_during_a_swap(served, make_app, label_config):
    """While one thread loads the new version, the others answer with the old one; none fails."""
    app = make_app(check_interval=0.0)
    gate, entered = threading.Event(), threading.Event()
    real_loader = served.loader
    served.add(FakeBundle("v2", level=4))
    served.promote("v2")

    def slow_loader(path):
        entered.set()
        assert gate.wait(10)
        return real_loader(path)

    served.loader = slow_loader
    with ThreadPoolExecutor(4) as pool:
        loader_call = pool.submit(lambda: _predict(app.test_client(), label_config))  # this one loads v2
        assert entered.wait(10)
        others = [pool.submit(lambda: _predict(app.test_client(), label_config, n=3)) for _ in range(6)]
        during = [f.result(timeout=10) for f in others]
        gate.set()
        loaded = loader_call.result(timeout=10)
    assert all(r["model_version"] == "v1" for batch in during for r in batch)
    assert loaded[0]["model_version"] == "v2"
    assert _predict(app.test_client(), label_config)[0]["model_version"] == "v2"
