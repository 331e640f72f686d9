"""The store's upserts are idempotent and imported ratings survive alongside synced annotations."""

import pandas as pd

from sense7.data.conversations import Conversation, Message
from sense7.store.database import Store
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

CONV = Conversation("c1", "r1", [Message("user", "hi"), Message("assistant", "hello"),
                                 Message("user", "sad"), Message("assistant", "I'm sorry")],
                    {"task_type": "advice", "emotional_state": 2})


def test_annotation_upsert_is_keyed_by_id_and_updated_time(store_url):
    store = Store(store_url)
    store.upsert_conversations([CONV])
    assert store.upsert_annotation(7, 70, "c1", 1, "r1", "2026-01-01T10:00:00", {"overall": 4}, "yes")
    for _ in range(3):  # a webhook delivered three times
        assert not store.upsert_annotation(7, 70, "c1", 1, "r1", "2026-01-01T10:00:00", {"overall": 4}, "yes")
    assert not store.upsert_annotation(7, 70, "c1", 1, "r1", "2025-12-31T10:00:00", {"overall": 1}, "no")  # older
    assert store.upsert_annotation(7, 70, "c1", 1, "r1", "2026-01-02T10:00:00", {"overall": 2, "tone": 3}, "no")
    frame = store.ratings_frame()
    assert sorted(zip(frame.dimension, frame.rating)) == [("overall", 2), ("tone", 3)]
    assert store.delete_annotation(7) and not store.delete_annotation(7)
    assert store.ratings_frame().empty and store.counts()["annotations"] == 0


def test_rating_data_joins_synced_and_imported_ratings_with_context(store_url):
    store = Store(store_url)
    store.upsert_conversations([CONV])
    store.upsert_annotation(1, 10, "c1", 3, "r1", "t1", {"overall": 5}, "partly")
    imported = pd.DataFrame({"conversation_id": ["c1", "c1", "c1"], "turn_index": pd.array([3, 1, None], "Int64"),
                             "rater_id": ["r1"] * 3, "dimension": ["overall", "overall", "overall"],
                             "rating": [1, 2, 3]})
    assert store.import_ratings(imported) == 3
    assert store.import_ratings(imported) == 3 and store.counts()["imported_ratings"] == 3  # upsert, no dupes
    data = store.rating_data(TAXONOMY)
    got = {(None if pd.isna(t) else int(t), d, r) for t, d, r in
           zip(data.ratings.turn_index, data.ratings.dimension, data.ratings.rating)}
    # The synced rating of turn 3 wins over the imported one; the expectation answer is scored 2 (partly).
    assert got == {(3, "overall", 5), (1, "overall", 2), (None, "overall", 3), (3, "expectation_met", 2)}
    assert data.conversations[("c1", "r1")].context == CONV.context


def test_traits_merge_and_emails_are_case_insensitive(store_url):
    store = Store(store_url)
    store.upsert_raters([{"rater_id": "r1", "email": "Ann@Example.org", "traits": {"tipi_1": 3}}])
    store.update_traits("r1", {"llm_use": "daily"})
    store.upsert_raters([{"rater_id": "r2", "traits": {}}])
    assert store.rater_emails() == {"r1": "ann@example.org"}
    assert store.rater_emails(every_rater=True) == {"r1": "ann@example.org", "r2": None}
    assert store.raters_frame().loc["r1"].to_dict() == {"tipi_1": 3, "llm_use": "daily"}
    assert "email" not in store.raters_frame().columns


def test_the_outbox_hands_out_the_newest_undelivered_revision_per_task_oldest_first(tmp_path):
    from sense7.store.rater_page_tables import Outbox

    outbox = Outbox(Store(f"sqlite:///{tmp_path / 'outbox.sqlite'}"))
    outbox.add_next("r1", "rating", 11, [], {"v": 1}, 3.0)
    outbox.add_next("r1", "rating", 12, [], {"v": 1}, 3.0)
    outbox.add_next("r1", "rating", 11, [], {"v": 2}, 3.0)  # a change of task 11 before it was delivered
    outbox.add_next("r2", "rating", 11, [], {"v": 1}, 3.0)  # another rater's answer to the same task id
    got = [(r["rater_id"], r["task_id"], r["revision"]) for r in outbox.undelivered()]
    assert got == [("r1", 12, 1), ("r1", 11, 2), ("r2", 11, 1)]
    assert [(r["task_id"], r["revision"]) for r in outbox.undelivered(limit=1)] == [(12, 1)]
    outbox.mark_delivered("r1", 11, 2, annotation_id=7)  # revision 1 is superseded with it
    assert [(r["rater_id"], r["task_id"]) for r in outbox.undelivered()] == [("r1", 12), ("r2", 11)]


def test_a_new_sqlite_store_is_its_owners_only_whatever_the_umask(tmp_path):
    """A store opened first by a process with the common umask 022 (a benchmark's scratch store, a script's;
    the sense7 command sets 077 itself) is still 0600, and so are the WAL files SQLite makes beside it."""
    import os
    import stat

    folder = tmp_path / "scratch"
    folder.mkdir(mode=0o700)
    previous = os.umask(0o022)
    try:
        store = Store(f"sqlite:///{folder / 'store.sqlite'}")
        store.upsert_conversations([CONV])
        with store.engine.connect():  # (the WAL and its index exist while a connection is open)
            made = {path.name: stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()}
    finally:
        os.umask(previous)
    assert made == {"store.sqlite": 0o600, "store.sqlite-wal": 0o600, "store.sqlite-shm": 0o600}


def test_a_raters_queue_is_there_from_its_first_task_and_only_theirs(tmp_path):
    from sense7.store.rater_page_tables import RaterQueue

    queue = RaterQueue(Store(f"sqlite:///{tmp_path / 'store.sqlite'}"))
    assert not queue.has("r1")
    queue.replace("r1", [{"task_id": 5, "kind": "rating", "position": 0, "conversation_id": "c1", "turn_index": 1,
                          "data": {"task_key": "c1::1::r1"}, "prediction": None, "answer": None},
                         {"task_id": 6, "kind": "rating", "position": 1, "conversation_id": "c1", "turn_index": 3,
                          "data": {"task_key": "c1::3::r1"}, "prediction": None, "answer": None}])
    assert queue.has("r1") is True and queue.has("r2") is False
    queue.replace("r1", [])
    assert queue.has("r1") is False


def test_kept_account_ids_read_the_same_across_chunks(tmp_path, monkeypatch):
    from sense7.store import account_ids
    from sense7.store.account_ids import AccountIds

    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.upsert_raters([{"rater_id": f"r{i}", "traits": {}} for i in range(7)])
    kept = AccountIds(store)
    # r5 and r6 share account 105 (nobody's); r7 is not a rater in the store (its account is nobody's either).
    kept.remember({f"r{i}": 100 + i for i in range(5)} | {"r5": 105, "r6": 105, "r7": 107})
    monkeypatch.setattr(account_ids, "READ_CHUNK", 2)  # several SELECTs, one of them short
    assert kept.of([f"r{i}" for i in range(9)] + ["r0"]) == {f"r{i}": 100 + i for i in range(5)} | {
        "r5": 105, "r6": 105, "r7": 107}
    assert kept.raters_of([100, 101, 102, 103, 104, 105, 107, 108, "100"]) == {100 + i: f"r{i}" for i in range(5)}
    assert kept.raters_of() == {100 + i: f"r{i}" for i in range(5)}
    assert kept.of([]) == {} and kept.raters_of([]) == {}
