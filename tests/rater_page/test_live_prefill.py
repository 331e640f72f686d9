"""Live pre-fills on the rater page (sense7.rater_page.live_prefills): a new rater's answers move the pre-fill of
their next turns at once (no retrain, no Label Studio), each live prediction is recorded (version
"<served>+live", kind live, own ratings used) before the page is sent, hidden-arm turns are recorded and
never shown, and a rater without answers sees exactly the queue's pre-fill. Real parts: the app (Flask's
test client), a SQLite store and a model registry with a trained version."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from sense7.data.conversations import task_key
from sense7.labelstudio.protocol import rating_tasks
from sense7.model.registry import ModelRegistry
from sense7.rater_page.app import create_app
from sense7.rater_page.live_prefills import LivePrefills
from sense7.rater_page.services import EXTENSION
from sense7.settings import Settings, StudyDesign
from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.store.study_design import HIDDEN, SHOWN, StudyRecords
from sense7.taxonomy import load_taxonomy
from tests.support.rater_page import NEW, answer_on_page, checked_levels, serve_trained, trained_version

TAXONOMY = load_taxonomy()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A version trained on a synthetic study; the newcomer gets 2 held-out conversations of its own."""
    return trained_version(tmp_path_factory)


def _page(tmp_path, trained, static_values, hidden_turn, loaded=True):
    """The app, its store, the newcomer's task datas and two links. `loaded`: the served version loaded as the
    page process's background thread does at its start (here once, in the test's thread)."""
    model_dir, newcomer, profile = trained
    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_MODEL_DIR": str(model_dir)})
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    serve_trained(store, model_dir)
    store.upsert_conversations(newcomer)
    tasks = [t for conv in newcomer for t in rating_tasks(conv)]
    datas = [t["data"] for t in tasks]
    records = StudyRecords(store)
    planned = [{"data": {**d, "prefill": HIDDEN if i in _turns(hidden_turn) else SHOWN}} for i, d in enumerate(datas)]
    records.record_arms(planned, StudyDesign(prefill="randomized", shown_share=0.5), seed="s")
    items = [{"task_id": 1, "kind": "profile", "position": -1, "conversation_id": None, "turn_index": None,
              "data": {}, "prediction": None, "answer": {"traits": profile}}]
    for i, d in enumerate(datas):
        items.append({"task_id": 100 + i, "kind": "rating", "position": i, "conversation_id": d["conversation_id"],
                      "turn_index": d["turn_index"],
                      "data": {"history": d["history"], "turn": d["turn"], "repeat": False, "instructed": None},
                      # what the queue copy holds: the static prediction (none for the hidden arm)
                      "prediction": None if i in _turns(hidden_turn) else
                      {"version": "v1", "values": dict(static_values), "expectation": None},
                      "answer": None})
    RaterQueue(store).replace(NEW, items)
    other_token = None
    RaterQueue(store).replace("other", [dict(items[0], task_id=2), dict(items[1], task_id=200)])
    token, other_token = LinkBook(store).issue(NEW), LinkBook(store).issue("other")
    app = create_app(settings, taxonomy=TAXONOMY, store=store)
    if loaded:
        app.extensions[EXTENSION].live_prefills.refresh()
    return app, store, datas, token, other_token


def _turns(hidden) -> set:
    return set(hidden) if isinstance(hidden, (set, list, tuple)) else {hidden}


def test_answers_move_the_next_prefill_and_are_recorded_first(tmp_path, trained):
    static = {c: 2 for c in TAXONOMY.controls}
    app, store, datas, token, other_token = _page(tmp_path, trained, static, hidden_turn=4)
    records = StudyRecords(store)
    client = app.test_client()
    assert client.get(f"/r/{token}").status_code == 303

    # No answers yet: exactly the queue's (the served version's) pre-fill, and nothing recorded as live.
    first = client.get("/task/100").get_data(as_text=True)
    assert checked_levels(first) == static and 'id="prefill-note"' in first
    assert records.predictions_frame().empty

    for task_id in (100, 101, 102):
        answer_on_page(client, task_id, 5)

    # Each answered turn was opened after the earlier answers: recorded with 0 (nothing), 1 and 2 of them.
    counts = records.predictions_frame().set_index("task_key")["own_ratings"].to_dict()
    assert counts == {datas[1]["task_key"]: 1, datas[2]["task_key"]: 2}
    html = client.get("/task/103").get_data(as_text=True)
    shown = checked_levels(html)
    assert 'id="prefill-note"' in html and set(shown) == set(TAXONOMY.controls)
    assert sum(shown.values()) > sum(static.values()) + len(static)  # 3 answers of 5s moved it up
    frame = records.predictions_frame()
    row = frame[frame["task_key"] == datas[3]["task_key"]].iloc[0]
    assert (row["version"], row["kind"], row["own_ratings"], row["arm"]) == ("v1+live", "live", 3, SHOWN)
    assert row["levels"] == shown  # what is recorded is what the page shows
    assert client.get("/task/103").get_data(as_text=True).count("checked") == html.count("checked")
    assert len(records.predictions_frame()) == 3  # a reload shows the first record, records nothing new

    # A hidden-arm turn: recorded (live, 3 ratings), never shown.
    hidden_html = client.get("/task/104").get_data(as_text=True)
    assert 'id="prefill-note"' not in hidden_html and checked_levels(hidden_html) == {}
    hidden_row = records.recorded(datas[4]["task_key"], "v1+live")
    assert hidden_row["arm"] == HIDDEN and hidden_row["own_ratings"] == 3 and hidden_row["kind"] == "live"

    # Another rater holding this rater's task ids learns nothing and records nothing.
    stranger = app.test_client()
    assert stranger.get(f"/r/{other_token}").status_code == 303
    before = len(records.predictions_frame())
    for task_id in (103, 105):
        response = stranger.get(f"/task/{task_id}")
        assert response.status_code == 404 and b"checked" not in response.data
    assert len(records.predictions_frame()) == before
    assert app.test_client().get("/task/105").status_code == 404  # no session at all
    key = task_key(datas[5]["conversation_id"], datas[5]["turn_index"], NEW)
    assert records.recorded(key, "v1+live") is None


def test_without_a_live_version_the_queue_prefill_stays(tmp_path, trained):
    """No version in the registry: the page behaves as before (answers change nothing, nothing recorded)."""
    model_dir, newcomer, profile = trained
    static = {c: 3 for c in TAXONOMY.controls}
    app, store, _, token, _ = _page(tmp_path, (tmp_path / "empty-models", newcomer, profile), static, hidden_turn=-1)
    client = app.test_client()
    assert client.get(f"/r/{token}").status_code == 303
    answer_on_page(client, 100, 5)
    assert checked_levels(client.get("/task/101").get_data(as_text=True)) == static
    assert StudyRecords(store).predictions_frame().empty


def test_the_study_analysis_draws_the_gain_curve(tmp_path, trained):
    """`analyze --study`'s live_gain: hidden-arm ratings scored with the live record they were rated after
    (by its own-ratings count) against the static record of the served version, and the report shows it."""
    from datetime import datetime, timedelta, timezone

    from sense7.research.study_analysis import analyze_study
    from sense7.research.study_report import render_study_report

    static = {c: 2 for c in TAXONOMY.controls}
    app, store, datas, token, _ = _page(tmp_path, trained, static, hidden_turn={0, 4})
    records = StudyRecords(store)
    earlier = datetime.now(timezone.utc) - timedelta(hours=1)
    records.record_predictions([{  # what the import recorded: the served version's static prediction
        "task_key": d["task_key"], "version": "v1", "rater_id": NEW, "conversation_id": d["conversation_id"],
        "turn_index": d["turn_index"], "arm": HIDDEN if i in (0, 4) else SHOWN, "kind": "traits",
        "levels": static, "expected": {c: 2.0 for c in static}, "generic_levels": {c: 3 for c in static},
        "generic_expected": {c: 3.0 for c in static}, "recorded_at": earlier} for i, d in enumerate(datas)])
    client = app.test_client()
    assert client.get(f"/r/{token}").status_code == 303
    for task_id in (100, 101, 102, 103, 104):
        answer_on_page(client, task_id, 5)
    # The sync's copy of the answers (Label Studio's annotations, created after each page was sent).
    for i in range(5):
        d = datas[i]
        created = datetime.now(timezone.utc).isoformat()
        store.upsert_annotation(500 + i, 100 + i, d["conversation_id"], d["turn_index"], NEW, created,
                                {c: 5 for c in TAXONOMY.controls}, TAXONOMY.expectation_values[-1], created_at=created)
    result = analyze_study(store, TAXONOMY, n_boot=50)
    gain = {b["own_ratings"]: b for b in result["live_gain"]["bins"]}
    assert set(gain) == {"0", "3-5"}  # hidden turns: the first (no answers yet) and the fifth (4 before it)
    live_row = records.recorded(datas[4]["task_key"], "v1+live")
    assert live_row["own_ratings"] == 4
    n = len(TAXONOMY.controls)
    assert gain["0"]["n"] == n and gain["0"]["mae"]["live"]["value"] == gain["0"]["mae"]["static"]["value"] == 3.0
    assert gain["3-5"]["mae"]["static"]["value"] == 3.0 and gain["3-5"]["mae"]["generic"]["value"] == 2.0
    expected_live = sum(abs(v - 5) for v in live_row["levels"].values()) / n
    assert gain["3-5"]["mae"]["live"]["value"] == pytest.approx(expected_live)
    assert expected_live < 3.0  # four answers of 5s: the live pre-fill was closer than the static one
    assert set(result["live"]["versions"]) == {"v1"}  # the served version's own evaluation stays apart
    from sense7.cli.research_tables import print_study

    print_study(result)  # the table of `sense7 analyze --study`
    html = render_study_report(result)
    assert "the gain curve" in html and "data:image/png;base64," in html
    # `sense7 demo`'s final lines: the same curve, one line per bin, live / static / generic.
    from sense7.cli.demo import gain_lines

    lines = gain_lines(result["live_gain"])
    assert len(lines) == 3 and "Live pre-fills" in lines[0]
    assert lines[1].split()[:4] == ["0", "earlier:", "live", "3.00"] and "static 3.00  generic 2.00" in lines[1]
    assert "3-5 earlier: live " + f"{expected_live:.2f}" in lines[2] and "static 3.00  generic 2.00" in lines[2]
    assert gain_lines(None) == ["[bold]Live pre-fills:[/] no hidden-arm rating with a live prediction yet"]


def test_an_older_store_gains_the_own_ratings_column(tmp_path):
    """A store made before live pre-fills (recorded_predictions without own_ratings) gets the column when
    opened, keeps its rows, and takes live records."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    Store(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE recorded_predictions DROP COLUMN own_ratings"))
        conn.execute(sa.text("DROP TABLE alembic_version"))  # a store from before migrations, as it was
        conn.execute(sa.text("INSERT INTO recorded_predictions (task_key, version, rater_id, conversation_id, "
                             "turn_index, arm, kind, levels, expected, generic_levels, generic_expected, recorded_at) "
                             "VALUES ('c::1::r', 'v1', 'r', 'c', 1, 'shown', 'traits', '{}', '{}', '{}', '{}', "
                             "'2026-01-01 00:00:00')"))
    assert "own_ratings" not in {c["name"] for c in sa.inspect(engine).get_columns("recorded_predictions")}
    records = StudyRecords(Store(url))
    assert records.recorded("c::1::r", "v1")["own_ratings"] is None
    records.record_predictions([{"task_key": "c::1::r", "version": "v1+live", "rater_id": "r", "conversation_id": "c",
                                 "turn_index": 1, "arm": "shown", "kind": "live", "own_ratings": 4, "levels": {},
                                 "expected": {}, "generic_levels": {}, "generic_expected": {}}])
    assert records.recorded("c::1::r", "v1+live")["own_ratings"] == 4


class WatchedRegistry(ModelRegistry):
    """The registry, noting which thread asked it what; its blob fetch can be held (`hold`), as a slow or
    stalled store would hold it (a fault the test cannot cause in a real SQLite store on demand)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.callers: list[tuple[str, str]] = []
        self.fetching = threading.Event()  # set when a fetch is waiting on `hold`
        self.hold = threading.Event()
        self.hold.set()  # not held unless a test clears it

    def _note(self, what: str) -> None:
        self.callers.append((what, threading.current_thread().name))

    def pointer_stamp(self):
        self._note("pointer_stamp")
        return super().pointer_stamp()

    def current(self):
        self._note("current")
        return super().current()

    def cached(self, version: str):
        self._note("cached")
        if not self.hold.is_set():
            self.fetching.set()
            self.hold.wait()
        return super().cached(version)

    def threads(self) -> set[str]:
        return {thread for _, thread in self.callers}


def _wait_for(condition, what: str, seconds: float = 120.0):
    """Wait for a background thread's work (a liveness bound, not a speed check)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def _answered(items, task_ids, level=5):
    return [dataclasses.replace(i, answer={"values": {c: level for c in TAXONOMY.controls}})
            if i.task_id in task_ids else i for i in items]


def test_a_page_never_waits_for_the_store_to_give_the_version(tmp_path, trained):
    """The version is fetched by the page process's background thread, never by a request: while the store
    holds the fetch, a page answers at once with the queue's pre-fill (nothing recorded as live); once the
    fetch goes through, the next page is live. No request ever reads the pointer or the version."""
    static = {c: 2 for c in TAXONOMY.controls}
    app, store, datas, token, _ = _page(tmp_path, trained, static, hidden_turn=-1, loaded=False)
    live = app.extensions[EXTENSION].live_prefills
    # This process's own empty cache: the version must come from the store's blob.
    live.registry = registry = WatchedRegistry(tmp_path / "page-cache", store)
    records = StudyRecords(store)
    client = app.test_client()
    assert client.get(f"/r/{token}").status_code == 303
    for task_id in (100, 101, 102):
        answer_on_page(client, task_id, 5)
    assert records.predictions_frame().empty  # nothing loaded yet: the queue's pre-fill, nothing live

    registry.hold.clear()
    live.start()
    try:
        assert registry.fetching.wait(120), "the background thread never fetched the version"
        answered: dict = {}
        request = threading.Thread(target=lambda: answered.update(page=client.get("/task/103")), name="request")
        request.start()
        request.join(120)  # a page that waits for the held fetch is still waiting (a bound against a hang)
        answered_while_held = not request.is_alive() and not registry.hold.is_set()
        registry.hold.set()
        request.join()
        assert answered_while_held, "the page waited for the store's fetch"
        html = answered["page"].get_data(as_text=True)
        assert answered["page"].status_code == 200 and checked_levels(html) == static
        assert records.predictions_frame().empty

        _wait_for(lambda: live.predictor() is not None, "the version loaded after the fetch went through")
        html = client.get("/task/103").get_data(as_text=True)
        assert sum(checked_levels(html).values()) > sum(static.values()) + len(static)  # 3 answers of 5s
        row = records.recorded(datas[3]["task_key"], "v1+live")
        assert (row["kind"], row["own_ratings"]) == ("live", 3) and row["levels"] == checked_levels(html)
    finally:
        registry.hold.set()
        live.stop()
    assert registry.threads() == {"live-prefill-refresh"}  # the pointer and the version: never a request's


def test_a_promotion_is_picked_up_by_the_background_refresh(tmp_path, trained):
    """LivePrefills follows the registry's pointer in its own thread: a newly promoted version is loaded
    there while the previous one keeps answering (never nothing in between), then live records carry the
    new version. Requests (here: the test's own calls) read only what is held."""
    static = {c: 2 for c in TAXONOMY.controls}
    _, store, datas, _, _ = _page(tmp_path, trained, static, hidden_turn=-1, loaded=False)
    registry = WatchedRegistry(tmp_path / "models", store)  # this process's own cache: the store holds v1
    live = LivePrefills(registry, store, TAXONOMY, check_interval=0.05)
    assert live.predictor() is None  # nothing is loaded by asking
    live.start()
    try:
        _wait_for(lambda: live.predictor() is not None, "v1 loaded at the start")
        assert live.predictor().version == "v1"
        bundle = ModelRegistry(tmp_path / "promoter", store).load("v1")
        bundle.version = "v2"
        promoter = ModelRegistry(tmp_path / "promoter", store)
        promoter.promote(promoter.add(bundle, "v2").name)
        seen = []

        def on_v2():
            seen.append(live.predictor().version if live.predictor() else None)
            return seen[-1] == "v2"

        _wait_for(on_v2, "v2 picked up after its promotion")
        assert set(seen) <= {"v1", "v2"}  # never None in between
        items = _answered(RaterQueue(store).items(NEW), (100, 101))
        assert live.prefill(NEW, items, items[3])["version"] == "v2+live"
    finally:
        live.stop()
    assert registry.threads() == {"live-prefill-refresh"}


def test_a_broken_version_leaves_the_held_one_answering(tmp_path, trained):
    """A promoted version whose blob no longer matches its SHA-256 is refused by the refresh (logged, never
    unpickled) and not fetched again until the pointer moves; the version held keeps answering."""
    import sqlalchemy as sa

    from sense7.store.tables import model_versions

    static = {c: 2 for c in TAXONOMY.controls}
    _, store, _, _, _ = _page(tmp_path, trained, static, hidden_turn=-1, loaded=False)
    registry = WatchedRegistry(tmp_path / "models", store)
    live = LivePrefills(registry, store, TAXONOMY)
    assert live.refresh() and live.predictor().version == "v1"
    promoter = ModelRegistry(tmp_path / "promoter", store)
    bundle = promoter.load("v1")
    bundle.version = "v2"
    promoter.promote(promoter.add(bundle, "v2").name)
    with store.engine.begin() as conn:
        conn.execute(sa.update(model_versions).where(model_versions.c.name == "v2").values(bundle=b"not a tar"))
    assert not live.refresh() and live.predictor().version == "v1"
    fetches = [what for what, _ in registry.callers].count("cached")
    assert not live.refresh() and live.predictor().version == "v1"
    assert [what for what, _ in registry.callers].count("cached") == fetches  # not fetched again


def test_the_page_process_loads_the_version_at_its_start(tmp_path, trained, monkeypatch):
    """gunicorn's app factory starts the background thread: the served version is loaded before any request
    asks for it (and a request never does)."""
    from sense7.rater_page.wsgi import app_from_env

    model_dir, _, _ = trained
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    serve_trained(Store(store_url), model_dir)
    for name, value in {"SENSE7_HOME": tmp_path / "home", "SENSE7_STORE_URL": store_url,
                        "SENSE7_MODEL_DIR": tmp_path / "page-cache", "SENSE7_REDIS_URL": ""}.items():
        monkeypatch.setenv(name, str(value))
    live = app_from_env().extensions[EXTENSION].live_prefills
    try:
        _wait_for(lambda: live.predictor() is not None, "the version loaded by the page process's thread")
        assert live.predictor().version == "v1"
    finally:
        live.stop()
