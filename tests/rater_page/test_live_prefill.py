"""Live pre-fills on the rater page (sense7.rater_page.live_prefills): a new rater's answers move the pre-fill of
their next turns at once (no retrain, no Label Studio), each live prediction is recorded (version
"<served>+live", kind live, own ratings used) before the page is sent, hidden-arm turns are recorded and
never shown, and a rater without answers sees exactly the queue's pre-fill. Real parts: the app (Flask's
test client), a SQLite store and a model registry with a trained version."""

from __future__ import annotations

import dataclasses

import pytest

from sense7.data.conversations import task_key
from sense7.labelstudio.protocol import rating_tasks
from sense7.model.registry import ModelRegistry
from sense7.rater_page.app import create_app
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


def _page(tmp_path, trained, static_values, hidden_turn):
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


def test_a_promotion_is_picked_up_while_the_old_version_keeps_answering(tmp_path, trained):
    """LivePrefills follows the registry's pointer: a new version is loaded in the background, the previous
    one answers meanwhile, then live records carry the new version."""
    import time

    from sense7.rater_page.live_prefills import LivePrefills

    static = {c: 2 for c in TAXONOMY.controls}
    _, store, datas, _, _ = _page(tmp_path, trained, static, hidden_turn=-1)
    registry = ModelRegistry(tmp_path / "models", store)  # this process's own cache: the store holds v1
    live = LivePrefills(registry, store, TAXONOMY, check_interval=0.0)
    assert live.predictor().version == "v1"
    bundle = registry.load("v1")
    bundle.version = "v2"
    registry.promote(registry.add(bundle, "v2").name)
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        predictor = live.predictor()
        seen.append(predictor.version)
        if predictor.version == "v2":
            break
        time.sleep(0.05)
    assert seen[-1] == "v2" and set(seen) <= {"v1", "v2"}  # never None in between
    items = RaterQueue(store).items(NEW)
    answered = [dataclasses.replace(i, answer={"values": {c: 5 for c in TAXONOMY.controls}})
                if i.task_id in (100, 101) else i for i in items]
    assert live.prefill(NEW, answered, answered[3])["version"] == "v2+live"
