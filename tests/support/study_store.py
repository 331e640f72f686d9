"""A small study in a real store with every fact a rating carries: raters with traits and e-mails, shared and
own conversations, randomized arms, static, generic and live predictions recorded before the ratings,
annotations with lead times, the rater page's submissions, a test-retest repeat, instructed answers, a
pilot's imported ratings, a crowd participant's platform id, link secrets, a withdrawn rater and a
conversation left out of the study (the last two must never be exported)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pandas as pd

from sense7.data.conversations import Conversation, Message, task_key
from sense7.privacy.participation import ConversationChoices, Withdrawals
from sense7.store import tables
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, LinkBook, Outbox
from sense7.store.study_design import REPEAT_SUFFIX, StudyRecords, live_version
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()
RATERS = ["rater-alpha-01", "rater-bravo-02", "rater-charlie-03", "rater-delta-04"]
WITHDRAWN = "rater-echo-05"
PLATFORM_ID = "5f3c2a9b8e7d6c5b4a392817"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


@dataclass
class StudyStore:
    store: Store
    secrets: list[str] = field(default_factory=list)
    emails: list[str] = field(default_factory=list)
    left_out: tuple[str, str] = ("", "")


def _messages(topic: str, turns: int = 2) -> list[Message]:
    out = []
    for t in range(turns):
        out.append(Message("user", f"About {topic}, part {t}: I feel lost after the move."))
        out.append(Message("assistant", "That sounds hard; what feels heaviest right now?" if t % 2 == 0
                           else "Here is a list of options."))
    return out


def fill_study(store: Store) -> StudyStore:
    result = StudyStore(store)
    people = RATERS + [WITHDRAWN]
    rows = []
    for i, rid in enumerate(people):
        traits = {f.key: (f.choices[i % len(f.choices)] if f.type == "choice" else f.min + i % (f.max - f.min + 1))
                  for f in TAXONOMY.profile_fields}
        email = f"{rid.split('-')[1]}.person@mail.example"
        result.emails.append(email)
        rows.append({"rater_id": rid, "email": email, "traits": traits})
    store.upsert_raters(rows)
    result.secrets = [LinkBook(store).issue(rid) for rid in people]

    # Two conversations every rater rates, one own conversation each.
    plan = {f"conv-shared-{k}": people for k in (1, 2)}
    plan.update({f"conv-own-{rid}": [rid] for rid in people})
    convs = []
    for cid, who in plan.items():
        for rid in who:
            convs.append(Conversation(cid, rid, _messages(cid.split("-")[1]), {
                "task_type": "emotional_support", "emotional_state": 2, "empathy_wanted": 4,
                "created": "2026-02-11T10:00:00+00:00", "assistant_id": "gpt-4o", "title": "My move"}))
    store.upsert_conversations(convs)

    records = StudyRecords(store)
    outbox = Outbox(store)
    controls = TAXONOMY.controls
    arms, predictions = [], []
    annotation_id = 1000
    for n, (cid, who) in enumerate(plan.items()):
        for rid in who:
            for turn in (1, 3):
                key = task_key(cid, turn, rid)
                arm = "shown" if (n + turn) % 2 else "hidden"
                arms.append({"data": {"task_key": key, "conversation_id": cid, "turn_index": turn, "rater_id": rid,
                                      "prefill": arm}})
                base = 2 + (turn + len(rid)) % 3
                predictions.append({
                    "task_key": key, "version": "v1", "rater_id": rid, "conversation_id": cid, "turn_index": turn,
                    "arm": arm, "kind": "personalized", "levels": {c: base for c in controls},
                    "expected": {c: base + 0.25 for c in controls}, "generic_levels": {c: 3 for c in controls},
                    "generic_expected": {c: 3.1 for c in controls}, "recorded_at": T0})
    records.record_arms(arms, _design(), "seed-1")
    # A live prediction for one task, recorded after the static one and before the rating.
    live_key = task_key("conv-shared-1", 3, RATERS[0])
    records.record_predictions(predictions)
    records.record_predictions([{"task_key": live_key, "version": live_version("v1"), "rater_id": RATERS[0],
                        "conversation_id": "conv-shared-1", "turn_index": 3, "arm": "shown", "kind": "live",
                        "levels": {c: 5 for c in controls}, "expected": {c: 4.75 for c in controls},
                        "generic_levels": {c: 3 for c in controls}, "generic_expected": {c: 3.1 for c in controls},
                        "own_ratings": 2, "recorded_at": T0 + timedelta(hours=1)}])

    task_id = 1
    for cid, who in plan.items():
        for rid in who:
            for turn in (1, 3):
                values = {c: 1 + (turn + len(c) + len(rid)) % 5 for c in controls}
                created = (T0 + timedelta(days=1, minutes=task_id)).isoformat()
                store.upsert_annotation(annotation_id, task_id, cid, turn, rid, created, values,
                                        expectation="partly", comment=f"private note {rid}", lead_time=30.0 + task_id,
                                        created_at=created)
                if (cid, rid, turn) == ("conv-shared-2", RATERS[0], 1):  # changed once on the page: 2 revisions
                    outbox.add_next(rid, "rating", task_id, [], {"values": {**values, "overall": 1}}, 10.0)
                outbox.add_next(rid, "rating", task_id, [], {"values": values}, 30.0 + task_id)
                outbox.mark_delivered(rid, task_id, outbox.revision(rid, task_id), annotation_id)
                annotation_id += 1
                task_id += 1
    # A test-retest repeat of one turn, rated again later.
    repeat_of = task_key("conv-shared-2", 1, RATERS[1])
    store.upsert_annotation(annotation_id, task_id, "conv-shared-2", 1, RATERS[1],
                            (T0 + timedelta(days=2)).isoformat(), {c: 4 for c in controls}, expectation="yes",
                            lead_time=12.0, created_at=(T0 + timedelta(days=2)).isoformat(), repeat_of=repeat_of)
    records.record_arms([{"data": {"task_key": repeat_of + REPEAT_SUFFIX, "conversation_id": "conv-shared-2",
                                   "turn_index": 1, "rater_id": RATERS[1], "prefill": "hidden",
                                   "repeat_of": repeat_of}}], _design(), "seed-1")
    InstructedAnswers(store).record(RATERS[2], 3, "attention", 2, 2)
    # A pilot's ratings.csv of a conversation nobody rated in Label Studio.
    store.upsert_conversations([Conversation("conv-pilot-9", RATERS[3], _messages("the pilot", 1), {})])
    store.import_ratings(pd.DataFrame(
        [{"conversation_id": "conv-pilot-9", "turn_index": 1, "rater_id": RATERS[3], "dimension": c, "rating": 2}
         for c in controls] + [{"conversation_id": "conv-pilot-9", "turn_index": 1, "rater_id": RATERS[3],
                                "dimension": TAXONOMY.expectation_key, "rating": 3}]
        # The same rater's earlier pilot rating of a turn since rated in the study: the study's rating counts.
        + [{"conversation_id": "conv-shared-1", "turn_index": 1, "rater_id": RATERS[0], "dimension": "overall",
            "rating": 1}]))
    # A crowd study (Prolific, K = 3) and a participant's platform id (only in crowd_completions).
    with store.engine.begin() as conn:
        conn.execute(tables.crowd_studies.insert().values(
            study_id="pilot", is_open=True, updated_at=T0,
            config={"platform": {"participant_param": "PROLIFIC_PID", "study_param": "STUDY_ID",
                                 "session_param": "SESSION_ID"}, "raters_per_conversation": 3}))
        conn.execute(tables.crowd_completions.insert().values(
            rater_id=RATERS[2], study_id="pilot", platform_id=PLATFORM_ID, outcome="completed", entered_at=T0))
    # Left out by its rater, and a withdrawal not erased yet: neither may leave the store.
    result.left_out = ("conv-own-" + RATERS[3], RATERS[3])
    ConversationChoices(store).choose(RATERS[3], result.left_out[0], in_study=False, in_release=False)
    Withdrawals(store).request(WITHDRAWN, "participant")
    return result


def _design():
    from sense7.settings import StudyDesign

    return StudyDesign(prefill="randomized", shown_share=0.5, seed="seed-1", repeat_share=0.0)
