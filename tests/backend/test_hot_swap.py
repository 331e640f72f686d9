"""A serving process follows promotions without a restart, off the request path, and never loads a broken version."""

from __future__ import annotations

import multiprocessing
import threading
import traceback

from tests.support.backend import auth_headers, task
from tests.support.fake_bundle import FakeBundle


def _predict(client, label_config, n=1):
    response = client.post("/predict", json={"tasks": [task(i) for i in range(n)], "label_config": label_config},
                           headers=auth_headers())
    assert response.status_code == 200
    return response.get_json()["results"]


def _hot(app):
    return app.extensions["sense7_model"].hot_model


def test_no_request_loads_a_promotion_refresh_does(served, make_app, label_config):
    app = make_app(check_interval=0.0)
    client = app.test_client()
    first = _predict(client, label_config)[0]
    assert first["model_version"] == "v1" and first["result"][0]["value"] == {"rating": 2}
    served.add(FakeBundle("v2", level=4))
    served.promote("v2")
    for _ in range(3):  # however often requests come, none looks at the pointer or loads
        assert _predict(client, label_config)[0]["model_version"] == "v1"
    assert _hot(app).refresh() is True
    second = _predict(client, label_config)[0]
    assert second["model_version"] == "v2" and second["result"][0]["value"] == {"rating": 4}
    assert client.get("/health", headers=auth_headers()).get_json()["model_version"] == "v2"
    assert _hot(app).refresh() is False  # the pointer did not move again


def test_get_reads_nothing_of_the_store(served, make_app, store, tmp_path, caplog):
    """With the store gone for real (its file deleted), requests keep the held model and never notice;
    only a refresh does, and it keeps serving the held model too."""
    hot = _hot(make_app(check_interval=0.0))
    store.engine.dispose()
    (tmp_path / "store.sqlite").unlink()  # the next connection opens an empty database: every query fails
    caplog.clear()
    for _ in range(5):
        assert hot.get().version == "v1"
    assert "model pointer not read" not in caplog.text  # no request asked the store anything
    assert hot.refresh() is False
    assert "model pointer not read" in caplog.text
    assert hot.get().version == "v1"


def test_the_thread_follows_a_promotion_while_the_old_version_answers(served, make_app, label_config):
    app = make_app(check_interval=0.05)
    hot = _hot(app)
    gate, entered = threading.Event(), threading.Event()
    loading_threads = []
    real_loader = served.loader
    served.add(FakeBundle("v2", level=4))
    served.promote("v2")  # promote's own test load uses the fast loader

    def slow_loader(path):
        loading_threads.append(threading.current_thread().name)
        entered.set()
        assert gate.wait(10)
        return real_loader(path)

    served.loader = slow_loader
    hot.start()
    try:
        assert entered.wait(10)  # the background thread is loading v2
        for n in (1, 3, 3):  # requests meanwhile are answered at once by v1
            assert all(r["model_version"] == "v1" for r in _predict(app.test_client(), label_config, n=n))
        assert app.test_client().post("/setup", json={"schema": label_config},
                                      headers=auth_headers()).get_json() == {"model_version": "v1"}
    finally:
        gate.set()
        hot.stop()  # returns once the load under way has swapped
    assert loading_threads == ["sense7-model-follow"]
    assert _predict(app.test_client(), label_config)[0]["model_version"] == "v2"


def test_a_corrupt_version_is_never_loaded_nor_retried(served, make_app, label_config, caplog):
    app = make_app(check_interval=0.0)
    hot = _hot(app)
    served.add(FakeBundle("v2", level=5))
    pkl = served.path("v2") / "bundle.pkl"
    pkl.write_bytes(pkl.read_bytes()[:20])  # corrupted after it was written
    # someone forces the pointer past promote()'s checks
    served.rows.point_at("v2")
    loads = []
    real_loader = served.loader
    served.loader = lambda path: loads.append(path) or real_loader(path)
    for _ in range(3):
        assert hot.refresh() is False
        result = _predict(app.test_client(), label_config)[0]
        assert result["model_version"] == "v1" and result["result"][0]["value"] == {"rating": 2}
    assert loads == []  # the checksum stopped it before unpickling
    assert "corrupt" in hot.last_error
    assert caplog.text.count("not loaded, still serving v1") == 1  # tried once: not until the pointer moves
    served.loader = real_loader
    served.add(FakeBundle("v3", level=3))
    served.promote("v3")
    assert hot.refresh() is True and hot.get().version == "v3" and hot.last_error is None


def test_a_pointer_to_a_missing_version_is_never_followed(served, make_app, label_config, caplog):
    app = make_app(check_interval=0.0)
    hot = _hot(app)
    served.rows.point_at("v3")  # forced past promote()'s checks: the store holds no v3
    assert hot.refresh() is False and hot.refresh() is False
    assert "not found" in hot.last_error and caplog.text.count("not loaded, still serving v1") == 1
    assert _predict(app.test_client(), label_config)[0]["model_version"] == "v1"
    # a good version promoted afterwards is picked up again
    served.add(FakeBundle("v4", level=3))
    served.promote("v4")
    assert hot.refresh() is True
    assert _predict(app.test_client(), label_config)[0]["model_version"] == "v4"


def _follower_alive() -> bool:
    return any(t.name == "sense7-model-follow" and t.is_alive() for t in threading.enumerate())


def _in_forked_child(hot, store, registry, conn):
    try:
        store.engine.dispose(close=False)  # the parent's pooled SQLite connections are not this process's
        before = _follower_alive()  # the parent's thread did not survive the fork
        registry.promote("v2")
        hot.get()  # no load here: this process's thread starts and loads v2 itself
        started = _follower_alive()
        hot.stop()  # returns after the thread's first refresh
        conn.send([before, started, hot.get().version])
    except BaseException:
        conn.send(traceback.format_exc())
    finally:
        conn.close()


def test_a_forked_worker_follows_by_its_own_thread(served, make_app, store):
    """gunicorn with preload_app builds the app (and starts the thread) in the master: the thread does not
    survive the fork, so a worker's first get() starts its own."""
    hot = _hot(make_app(check_interval=3600.0))
    served.add(FakeBundle("v2", level=4))
    hot.start()
    try:
        store.engine.dispose()
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_in_forked_child, args=(hot, store, served, send))
        child.start()
        send.close()
        got = receive.recv()
        child.join(30)
    finally:
        hot.stop()
    assert got == [False, True, "v2"], got  # (the parent held v1: the pointer moved only in the child)
    assert child.exitcode == 0
