"""Participants' rights in the store (sense7.privacy.participation): the erasure plan names every table, choices
reach training and the release, withdrawal misuse is one line that changes nothing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from sqlalchemy import Column, Integer, Table

from sense7.data.items import encoder_texts
from sense7.privacy import participation
from sense7.privacy.participation import ConversationChoices, Withdrawals, drop_left_out, erase_rater_rows
from sense7.store.account_ids import AccountIds
from sense7.store import tables as store_module
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, LinkBook, Outbox, RaterQueue, token_hash
from sense7.store.study_design import StudyRecords
from sense7.store.text_vectors import TextVectorRows, text_sha256
from tests.support.jobs import served_and_spoiled_store
from tests.support.release import demo_like_study, invoke, release_rows


@pytest.fixture
def study(tmp_path, monkeypatch):
    """A demo-like study (the demo's 6 raters, 40 conversations, one link issued) in this test's home."""
    return demo_like_study(tmp_path, monkeypatch)


def test_the_erasure_plan_names_every_store_table_and_refuses_an_unnamed_one():
    assert set(participation.ERASURE) == set(store_module.metadata.tables)
    planted = Table("planted_for_test", store_module.metadata, Column("rater_id", Integer))
    try:
        with pytest.raises(RuntimeError, match="planted_for_test"):
            participation.check_plan()
    finally:
        store_module.metadata.remove(planted)
    participation.check_plan()


def _tokens(text: str, needle: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(needle)}(?![\w-])", text) is not None


def _texts_of(conversation: str, store: Store) -> list[str]:
    messages = store.conversations_by_id()[conversation]
    return encoder_texts([{"role": m.role, "content": m.content} for m in messages])


def _fill_rater_rows(store: Store, rater: str, conversation: str, task_id: int) -> str:
    """A row of `rater` in every table a rater's data reaches; returns their link secret."""
    from sense7.data.conversations import Conversation, Message

    store.upsert_raters([{"rater_id": rater, "email": f"{rater}@mail.example", "traits": {"age_band": "25-34"}}])
    text = f"my own words of {rater} about my sister"
    store.upsert_conversations([Conversation(conversation, rater, [Message("user", text),
                                                                   Message("assistant", "I hear you.")],
                                             {"task_type": "emotional_support", "source": "chatgpt"})])
    store.upsert_annotation(task_id * 10, task_id, conversation, 1, rater, "2026-01-01T00:00:00", {"overall": 4},
                            author_id=task_id * 100)
    store.upsert_annotation(task_id * 10, task_id, conversation, 1, rater, "2026-01-02T00:00:00", {"overall": 5},
                            author_id=task_id * 100)
    import pandas as pd

    store.import_ratings(pd.DataFrame([{"conversation_id": conversation, "turn_index": 1, "rater_id": rater,
                                        "dimension": "overall", "rating": 3}]))
    secret = LinkBook(store).issue(rater)
    RaterQueue(store).replace(rater, [{"task_id": task_id, "kind": "rating", "position": 0,
                                       "conversation_id": conversation, "turn_index": 1,
                                       "data": {"history": [{"role": "user", "content": text}], "turn": []},
                                       "prediction": None, "answer": None}])
    Outbox(store).add_next(rater, "rating", task_id, [], {"values": {"overall": 4}}, 3.0)
    store.record_accepted(task_id * 10, rater, {"values": {"overall": 5}}, actor="staff")
    InstructedAnswers(store).record(rater, task_id, "attention", 2, 2)
    ConversationChoices(store).choose(rater, conversation, True, False)
    key = f"{conversation}::1::{rater}"
    from datetime import datetime, timezone

    with store.engine.begin() as conn:
        conn.execute(store_module.task_arms.insert().values(
            task_key=key, conversation_id=conversation, turn_index=1, rater_id=rater, arm="shown", policy="shown",
            shown_share=1.0, seed="s", drawn_at=datetime.now(timezone.utc)))
    StudyRecords(store).record_predictions([{
        "task_key": key, "version": "v1", "rater_id": rater, "conversation_id": conversation, "turn_index": 1,
        "arm": "shown", "kind": "personalized", "levels": {"overall": 4}, "expected": {"overall": 4.0},
        "generic_levels": {"overall": 3}, "generic_expected": {"overall": 3.0}}])
    store.log_staff("import", raters=[rater], file=f"{rater}.jsonl", conversations=1)
    AccountIds(store).remember({rater: task_id * 100})  # their Label Studio account, as ensure_accounts keeps it
    RaterQueue(store).provide(rater, [{"kind": "profile", "position": -1, "conversation_id": None, "turn_index": None,
                                       "data": {"task_key": f"profile::{rater}"}, "prediction": None}])
    # Their conversation's text vectors (sense7.model.vector_cache), as the embed job writes them, for two encoders.
    for key in ("a" * 64, "b" * 64):
        TextVectorRows(store.engine).add(key, {text_sha256(t): np.full(4, task_id, dtype="float16")
                                               for t in _texts_of(conversation, store)})
    now = datetime.now(timezone.utc)
    with store.engine.begin() as conn:  # a crowd participant's rows (sense7.crowd)
        conn.execute(store_module.crowd_participants.insert().values(
            rater_id=rater, study_id="s", state="rating", seat=task_id, consent="agreed", consent_version="v",
            consent_at=now, resume_hash=f"{task_id:064d}", check_attempts=0))
        conn.execute(store_module.crowd_slots.insert().values(study_id="s", conversation_id=conversation, slot=0,
                                                              rater_id=rater, taken_at=now))
        conn.execute(store_module.crowd_released.insert().values(study_id="s", conversation_id=conversation,
                                                                 rater_id=rater, released_at=now))
        conn.execute(store_module.crowd_completions.insert().values(
            rater_id=rater, study_id="s", platform_id=f"PID{task_id}", outcome="entered", entered_at=now))
    return secret


def test_erasing_a_rater_deletes_every_row_of_theirs_and_leaves_a_receipt_and_the_others(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    secret = _fill_rater_rows(store, "leaver7", "conv-leaver7", 7)
    _fill_rater_rows(store, "stayer8", "conv-stayer8", 8)
    before = json.loads(store.snapshot())
    tables_with_rows = {name for name, rows in before.items() if any("leaver7" in r for r in rows)}
    # Every table but the study's seed and the withdrawals holds a row of theirs here: the scan means something.
    assert tables_with_rows >= set(participation.ERASURE) - {"study_values", "withdrawals", "ratings",
                                                             "rating_history", "crowd_studies", "crowd_pool",
                                                             "crowd_withdrawn", "model_versions", "model_pointer",
                                                             "text_vectors"}  # (keyed by texts' hashes: below)
    vectors = TextVectorRows(store.engine)
    leaver_texts = [text_sha256(t) for t in _texts_of("conv-leaver7", store)]
    stayer_texts = [text_sha256(t) for t in _texts_of("conv-stayer8", store)]
    assert len(vectors.vectors("a" * 64, leaver_texts)) == len(leaver_texts) > 0
    receipt = Withdrawals(store).request("leaver7", "participant")
    assert LinkBook(store).rater_for(secret) is None  # revoked with the request
    done = erase_rater_rows(store, "leaver7", account_id=700, confirmed_by="staff", model_versions=["v1"])
    after = store.snapshot()
    for needle in ("leaver7", "conv-leaver7", "my own words of leaver7", "leaver7@mail.example", token_hash(secret)):
        assert needle not in after, needle
    assert done["store"]["annotations"] == 1 and done["store"]["ratings"] == 1 and done["store"]["rating_history"] == 2
    assert done["store"]["conversations"] == 1 and done["store"]["raters"] == 1
    # Every encoder's vectors of their conversation's texts went with it (a text the other rater's conversation
    # shares too: embedded again when next read); the other rater's own texts' vectors stay.
    assert done["store"]["text_vectors"] == 2 * len(set(leaver_texts))
    assert vectors.vectors("a" * 64, leaver_texts) == {} == vectors.vectors("b" * 64, leaver_texts)
    only_theirs = sorted(set(stayer_texts) - set(leaver_texts))
    assert only_theirs and len(vectors.vectors("b" * 64, only_theirs)) == len(only_theirs)
    # A crowd participant's erasure keeps the hash of their pseudonymous id, and only it (a withdrawal is final).
    assert done["store"]["crowd_withdrawn_kept"] == 1
    assert [json.loads(r) for r in json.loads(after)["crowd_withdrawn"]] == [
        {"study_id": "s", "id_hash": store_module.withdrawn_id_hash("leaver7")}]
    receipts = Withdrawals(store).receipts()
    assert [r["receipt"] for r in receipts] == [receipt] and receipts[0]["rater_id"] is None
    assert receipts[0]["requested_by"] == "participant" and receipts[0]["confirmed_by"] == "staff"
    # The other rater's rows are exactly as they were.
    after_rows = json.loads(after)
    for name, rows in before.items():
        if name in ("withdrawals", "staff_log"):
            continue
        assert [r for r in rows if "stayer8" in r] == [r for r in after_rows[name] if "stayer8" in r], name
    staff = [e for e in store.staff_entries() if e["action"] == "import"]
    assert [e["detail"]["raters"] for e in staff] == [["[withdrawn]"], ["stayer8"]]
    assert Withdrawals(store).versions_to_remove() == {"v1"}


def test_withdrawing_an_unknown_rater_or_twice_is_one_line_and_changes_nothing(study):
    store, data, secret = study
    before = store.snapshot()
    result = invoke("raters", "withdraw", "nobody-here")
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "error: rater nobody-here: no such rater" in result.output
    assert store.snapshot() == before
    Withdrawals(store).request("r001", "participant")  # the rater page's button
    before = store.snapshot()
    again = invoke("raters", "withdraw", "r001")
    assert again.exit_code == 2 and "already withdrawn" in again.output and again.output.strip().count("\n") == 0
    assert store.snapshot() == before
    listed = invoke("raters", "erase")
    assert listed.exit_code == 0 and "pending r001 asked by participant" in " ".join(listed.output.split())
    bad = invoke("raters", "erase", "--confirm", "--rater", "r002")
    assert bad.exit_code == 2 and "no pending withdrawal of r002" in bad.output and store.snapshot() == before


def test_left_out_conversations_are_not_trained_on_nor_released_and_withdrawn_raters_not_released(study, tmp_path):
    from sense7.taxonomy import load_taxonomy

    store, data, secret = study
    tax = load_taxonomy()
    ratings = data.ratings
    first, second, third = list(ratings[ratings["rater_id"] != "r003"].drop_duplicates(
        ["conversation_id", "rater_id"])[["conversation_id", "rater_id"]].itertuples(index=False))[:3]
    choices = ConversationChoices(store)
    choices.choose(first.rater_id, first.conversation_id, in_study=False, in_release=True)  # out of both
    choices.choose(second.rater_id, second.conversation_id, in_study=True, in_release=False)
    assert choices.of(first.rater_id)[first.conversation_id].in_release is False
    trained = drop_left_out(store.rating_data(tax), store).ratings
    assert not ((trained["conversation_id"] == first.conversation_id)
                & (trained["rater_id"] == first.rater_id)).any()
    assert ((trained["conversation_id"] == second.conversation_id)).any()  # rated, only not released
    withdrawn = "r003"
    Withdrawals(store).request(withdrawn, "participant")
    out = tmp_path / "release"
    result = invoke("release", "--out", out, "--k", "2")
    assert result.exit_code == 0, result.output
    released = release_rows(out, "ratings")
    expected = ratings[~ratings["conversation_id"].isin({first.conversation_id, second.conversation_id})
                       & (ratings["rater_id"] != withdrawn)]
    assert len(released) == len(expected)
    assert len({r["rater_id"] for r in released}) == expected["rater_id"].nunique() == 5
    assert third.conversation_id in set(expected["conversation_id"])


@pytest.mark.slow
def test_a_served_version_trained_on_an_erased_rater_is_replaced_whatever_the_gate_and_then_removed(tmp_path):
    """The promotion gate keeps a worse candidate out (tests/jobs/test_promotion_gate.py); a served version
    named on a withdrawal's receipt is replaced anyway, then deleted."""
    from sense7.retraining import Retrainer

    store, registry, tax = served_and_spoiled_store(tmp_path)
    registry.add(registry.load("v1"), "v0")  # an older version trained on them too, not served
    Withdrawals(store).request("r002", "participant")
    erase_rater_rows(store, "r002", confirmed_by="staff", model_versions=["v1", "v0"])
    result = Retrainer(store, registry, tax).run("withdrawal")
    assert result.status == "promoted" and registry.current() == result.version != "v1"
    assert {v.name for v in registry.list_versions()} == {result.version}
    assert "r002" not in registry.load(result.version).known_raters
    assert Withdrawals(store).versions_to_remove() == set()
    assert Withdrawals(store).receipts()[0]["model_versions"] == {"trained_on": ["v0", "v1"], "removed": ["v0", "v1"]}


def _also_rated_by(store: Store, ratings, conversation_id: str, rater_id: str) -> int:
    """`rater_id` rates every turn `conversation_id`'s owner rated (assigned it, not theirs); returns the rows."""
    import pandas as pd

    theirs = ratings[ratings["conversation_id"] == conversation_id].assign(rater_id=rater_id)
    store.import_ratings(pd.DataFrame(theirs))
    return len(theirs)


def _released(out) -> tuple[int, int]:
    return len(release_rows(out, "conversations")), len(release_rows(out, "ratings"))


def test_a_release_choice_of_someone_elses_conversation_drops_only_their_ratings_the_owners_drops_all(study, tmp_path):
    """Issue 37 item 8: a conversation's owner (the rater it was imported for) leaving it out of a release
    takes it out with everyone's ratings; a rater it was only assigned to takes out only their own ratings."""
    from sense7.taxonomy import load_taxonomy

    store, data, _ = study
    tax = load_taxonomy()
    total = len(data.ratings)
    conv = data.conversations[5]  # owner: its rater (their context row); every synthetic conversation has one
    owner = conv.rater_id
    others = [r for r in ("r001", "r002", "r003") if r != owner][:2]
    added = sum(_also_rated_by(store, data.ratings, conv.conversation_id, r) for r in others)
    own = int((data.ratings["conversation_id"] == conv.conversation_id).sum())
    choices = ConversationChoices(store)

    choices.choose(others[0], conv.conversation_id, in_study=True, in_release=False)
    out = tmp_path / "release-1"
    assert invoke("release", "--out", out, "--k", "2").exit_code == 0
    assert _released(out) == (40, total + added - own)  # the text and the owner's and the other's ratings stay
    assert invoke("release", "--check", out).exit_code == 0

    choices.choose(others[1], conv.conversation_id, in_study=False, in_release=False)  # out of the study too
    out = tmp_path / "release-2"
    assert invoke("release", "--out", out, "--k", "2").exit_code == 0
    assert _released(out) == (40, total)  # both assigned raters' ratings gone; the owner's stay
    trained = drop_left_out(store.rating_data(tax), store).ratings
    assert len(trained) == total + own  # training drops only the one who left it out of the study (theirs)

    choices.choose(owner, conv.conversation_id, in_study=True, in_release=False)
    out = tmp_path / "release-3"
    assert invoke("release", "--out", out, "--k", "2").exit_code == 0
    assert _released(out) == (39, total - own)  # the owner's choice: the conversation and every rating of it
    assert len(drop_left_out(store.rating_data(tax), store).ratings) == total + own  # still trained on

    choices.choose(owner, conv.conversation_id, in_study=False, in_release=False)
    trained = drop_left_out(store.rating_data(tax), store).ratings
    assert len(trained) == total - own and conv.conversation_id not in set(trained["conversation_id"])


def test_a_crowd_participant_never_owns_a_pool_conversation_a_donor_owns_theirs(tmp_path):
    """The pool's rater id owns a crowd study's conversations (its context row from `crowd init`); a
    participant's copied context rows make them no owner. A donated conversation (its context names the
    export's `source`) is its donor's, whoever else staff gave it to."""
    from datetime import datetime, timezone

    from sense7.data.conversations import Conversation, Message
    from sense7.privacy.participation import conversation_owners

    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    messages = [Message("user", "hello"), Message("assistant", "hi")]
    pool_context = {"task_type": "information", "source": "chatgpt"}  # a pool made from a donated export
    store.upsert_conversations([
        Conversation("pool-1", "pool-staff", messages, pool_context),
        Conversation("pool-1", "s-p01", messages, pool_context),  # the participants' copies (their tasks)
        Conversation("pool-1", "s-p02", messages, pool_context),
        Conversation("gift-1", "donor", messages, {"source": "claude"}),
        Conversation("gift-1", "helper", messages, {"task_type": "information"}),  # staff gave it to helper too
        Conversation("plain-1", "staffed", messages, {"task_type": "information"}),
    ])
    now = datetime.now(timezone.utc)
    with store.engine.begin() as conn:
        for seat, rater in enumerate(("s-p01", "s-p02")):
            conn.execute(store_module.crowd_participants.insert().values(
                rater_id=rater, study_id="s", state="rating", seat=seat, consent="agreed", consent_version="v",
                consent_at=now, check_attempts=0))
    assert conversation_owners(store) == {"pool-1": {"pool-staff"}, "gift-1": {"donor"}, "plain-1": {"staffed"}}
    choices = ConversationChoices(store)
    choices.choose("s-p01", "pool-1", in_study=False, in_release=False)
    choices.choose("helper", "gift-1", in_study=True, in_release=False)
    left_out = choices.out_of_release()
    assert left_out.conversations == frozenset()
    assert left_out.ratings == {("pool-1", "s-p01"), ("gift-1", "helper")}
    assert choices.out_of_training().ratings == {("pool-1", "s-p01")}
    choices.choose("donor", "gift-1", in_study=True, in_release=False)
    left_out = choices.out_of_release()
    assert left_out.conversations == {"gift-1"} and left_out.ratings == {("pool-1", "s-p01")}
