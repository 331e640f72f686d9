"""A participant's way through a crowd study once seated: assigned at consent (their tasks are made while
they answer the comprehension check; a double failure gives the slots back at once), rating after the check, finished when every
assigned turn is answered, or abandoned when the lease ends (unfinished conversations go back to the pool,
the ratings given stay). The rater page and the worker call these; nothing here talks to Label Studio."""

from __future__ import annotations

from dataclasses import dataclass

from sense7.crowd.assignment import AssignmentPolicy, Assignments, expired_participants, lease_end
from sense7.crowd.participants import Participants, Studies
from sense7.crowd.study import CrowdStudy
from sense7.data.conversations import Conversation, Message
from sense7.data.raterpage import LinkBook, RaterQueue
from sense7.data.store import Store


def assignments_of(store: Store, study: CrowdStudy) -> Assignments:
    return Assignments(store, study.study_id,
                       AssignmentPolicy(study.raters_per_conversation, study.conversations_per_participant,
                                        study.turns_per_participant))


def take_slots(store: Store, study: CrowdStudy, rater_id: str) -> list[str] | None:
    """A participant who consented (still `checking`): their conversations, taken now and leased, so that
    their tasks are made while they read and answer the comprehension check; None when the pool has no slot
    left (the participant is then `full`). Idempotent: a second call returns the same ones."""
    participants = Participants(store, study)
    conversations = assignments_of(store, study).assign(rater_id)
    if not conversations:
        participants.move(rater_id, "checking", "full")
        return None
    participants.move(rater_id, "checking", "checking", lease_until=lease_end(study.lease_minutes))
    return conversations


def start_rating(store: Store, study: CrowdStudy, rater_id: str) -> list[str] | None:
    """A participant who passed the check: their conversations (taken at consent; taken now if they hold
    none) or None when the pool has no slot left (the participant is then `full`). The lease starts again
    now: it measures the rating. Idempotent: a second call returns the same ones."""
    conversations = take_slots(store, study, rater_id)
    if conversations is None:
        return None
    Participants(store, study).move(rater_id, "checking", "rating", lease_until=lease_end(study.lease_minutes))
    return conversations


def give_back(store: Store, study: CrowdStudy, rater_id: str) -> list[str]:
    """A participant screened out by the check: every slot they took at consent goes back to the pool at
    once (nothing of theirs is rated) and their rater-page link is revoked, so the tasks made for them are
    never shown. Returns the conversations given back (none on a repeat)."""
    LinkBook(store).revoke(rater_id)
    return assignments_of(store, study).release(rater_id)


def rated_conversations(store: Store, rater_id: str) -> set[str]:
    """Conversations whose every turn in the rater's queue has an answer (the page's or Label Studio's)."""
    by_conversation: dict[str, list[bool]] = {}
    for item in RaterQueue(store).items(rater_id):
        if item.kind == "rating" and item.conversation_id is not None:
            by_conversation.setdefault(item.conversation_id, []).append(item.answer is not None)
    return {c for c, answered in by_conversation.items() if all(answered)}


def finish(store: Store, study: CrowdStudy, rater_id: str) -> bool:
    """Complete a participant whose every assigned turn is answered (True, also when already completed)."""
    participants = Participants(store, study)
    current = participants.get(rater_id)
    if current is None:
        return False
    if current.state == "completed":
        return True
    items = RaterQueue(store).items(rater_id)
    if current.state != "rating" or not items or any(i.answer is None for i in items):
        return False
    assignments_of(store, study).finish(rater_id, assignments_of(store, study).of(rater_id))
    return participants.move(rater_id, "rating", "completed") or participants.get(rater_id).state == "completed"


@dataclass
class Expired:
    participants: int = 0
    released: int = 0


def expire_leases(store: Store, now=None) -> Expired:
    """Participants whose lease ended: fully rated conversations stay counted, the others go back to the
    pool, the participant is `abandoned` and their rater-page link revoked (a replayed form gets 404)."""
    studies, links, result = Studies(store), LinkBook(store), Expired()
    for study_id, rater_id in expired_participants(store, now):
        found = studies.get(study_id)
        if found is None:
            continue
        study = found[0]
        participants = Participants(store, study)
        # A lease starts at consent: a participant may walk away during the comprehension check too.
        if not (participants.move(rater_id, "rating", "abandoned")
                or participants.move(rater_id, "checking", "abandoned")):
            continue  # finished (or screened out) in the meantime
        links.revoke(rater_id)
        result.released += len(assignments_of(store, study).release(rater_id, keep=rated_conversations(store, rater_id)))
        result.participants += 1
    return result


def waiting_for_tasks(store: Store, limit: int | None = None, skip=()) -> list[tuple[str, str]]:
    """(study, rater) of seated participants (checking or rating, holding slots) whose queue copy is not in
    the store yet: who the prepare job works for, oldest consent first. The store is the record, so a
    participant asked for by a job that died is found by the next one (no Redis set to lose)."""
    from sqlalchemy import exists, select

    from sense7.data.store import crowd_participants, crowd_slots, rater_tasks

    query = (select(crowd_participants.c.study_id, crowd_participants.c.rater_id)
             .where(crowd_participants.c.state.in_(("checking", "rating")),
                    exists().where(crowd_slots.c.rater_id == crowd_participants.c.rater_id),
                    ~exists().where(rater_tasks.c.rater_id == crowd_participants.c.rater_id))
             .order_by(crowd_participants.c.consent_at, crowd_participants.c.rater_id))
    if skip:
        query = query.where(crowd_participants.c.rater_id.not_in(list(skip)))
    if limit is not None:
        query = query.limit(limit)
    with store.engine.connect() as conn:
        return [(r.study_id, r.rater_id) for r in conn.execute(query)]


@dataclass
class Released:
    """A participant's given-back conversations whose Label Studio tasks are not cleared yet."""
    study_id: str
    rater_id: str
    state: str  # the participant's, now
    conversations: set
    rows: list  # crowd_released ids


def released_to_clear(store: Store, limit: int = 500) -> list[Released]:
    """Given-back slots whose Label Studio tasks (made for the participant who gave them back) were not
    cleared yet, per participant (the store is the record: a clearing that died is found again)."""
    from sqlalchemy import select

    from sense7.data.store import crowd_participants, crowd_released

    found: dict[str, Released] = {}
    with store.engine.connect() as conn:
        rows = conn.execute(select(crowd_released.c.id, crowd_released.c.study_id, crowd_released.c.rater_id,
                                   crowd_released.c.conversation_id, crowd_participants.c.state)
                            .join(crowd_participants, crowd_participants.c.rater_id == crowd_released.c.rater_id,
                                  isouter=True)
                            .where(crowd_released.c.tasks_cleared_at.is_(None))
                            .order_by(crowd_released.c.id).limit(limit))
        for row in rows:
            entry = found.setdefault(row.rater_id, Released(row.study_id, row.rater_id, row.state or "", set(), []))
            entry.conversations.add(row.conversation_id)
            entry.rows.append(row.id)
    return list(found.values())


def mark_cleared(store: Store, rows, cleared: bool = True) -> None:
    """Mark given-back rows' tasks cleared (or, `cleared=False`, to clear again)."""
    from datetime import datetime, timezone

    from sqlalchemy import update

    from sense7.data.store import crowd_released

    if not rows:
        return
    with store.engine.begin() as conn:
        conn.execute(update(crowd_released).where(crowd_released.c.id.in_(list(rows)))
                     .values(tasks_cleared_at=datetime.now(timezone.utc) if cleared else None))


def clear_again(store: Store, rater_ids) -> None:
    """Tasks were made for these participants after they gave their slots back (a prepare round that
    raced their lease's end): their given-back rows are cleared again by the next expiry pass."""
    from sqlalchemy import select

    from sense7.data.store import crowd_released

    with store.engine.connect() as conn:
        rows = [r.id for r in conn.execute(select(crowd_released.c.id).where(
            crowd_released.c.rater_id.in_(list(rater_ids)), crowd_released.c.tasks_cleared_at.is_not(None)))]
    mark_cleared(store, rows, cleared=False)


def answered_tasks(store: Store, rater_id: str) -> set[int]:
    """Task ids the participant answered (on the page, delivered or not, or in Label Studio as copied)."""
    return {item.task_id for item in RaterQueue(store).items(rater_id, left_out=True) if item.answer is not None}


def forget_tasks(store: Store, rater_id: str, task_ids) -> None:
    """Drop deleted tasks from the participant's queue copy (their link is revoked: nobody shows them)."""
    from sense7.data.store import rater_tasks

    if task_ids:
        with store.engine.begin() as conn:
            conn.execute(rater_tasks.delete().where(rater_tasks.c.rater_id == rater_id,
                                                    rater_tasks.c.task_id.in_(list(task_ids))))


def conversations_for(store: Store, study: CrowdStudy, rater_id: str) -> list[Conversation]:
    """The participant's assigned conversations, as conversations of theirs (what the importer takes):
    the pool's texts and contexts under the pseudonymous rater id."""
    pool = Studies(store).pool(study.study_id)
    texts = store.conversations_by_id()
    return [Conversation(c, rater_id, [Message(m.role, m.content) for m in texts[c]], dict(pool[c]["context"]))
            for c in assignments_of(store, study).of(rater_id) if c in texts and c in pool]


def status(store: Store) -> list[dict]:
    """Per crowd study: open or closed, the pool's coverage and the participants' counts."""
    studies, out = Studies(store), []
    for study_id in studies.ids():
        study, is_open = studies.get(study_id)
        out.append({"study": study_id, "open": is_open, "cap": study.participant_cap,
                    "coverage": assignments_of(store, study).coverage(),
                    "participants": Participants(store, study).counts()})
    return out


def install_study(store: Store, path, taxonomy, on_redaction=None) -> tuple[CrowdStudy, int]:
    """Validate a study file and its pool (every problem as file:line: field: reason, nothing written on
    error), then store both; returns (study, conversations in the pool). A new study starts closed.

    The pool comes in as every batch does (sense7.data.intake: the readers of `sense7 import`, personal
    details scrubbed, refused when it would change the text the store holds under one of its ids).
    `on_redaction(report)`: told what the scrub replaced, once the study is stored."""
    from sense7.crowd.study import load_study
    from sense7.data.intake import ReimportConflict, admit, read_batch

    study = load_study(path)
    pool = read_batch(study.pool_path, taxonomy).conversations
    check_budget(path, study, pool)
    try:
        admitted = admit(pool, store)
    except ReimportConflict as exc:
        raise exc.problems(study.pool_path, "give the changed conversation a new id in the pool") from None
    pool = admitted.conversations
    Studies(store).save(study, pool)
    if on_redaction is not None:
        on_redaction(admitted.redaction)
    return study, len(pool)


def check_budget(path, study: CrowdStudy, pool) -> None:
    """A turn budget must hold the pool's longest conversation (a conversation is never split, and every
    participant gets at least one): FormatError naming the file, the line and the longest one otherwise."""
    from pathlib import Path

    from sense7.data.formats import FormatError, Problem

    if study.turns_per_participant is None or not pool:
        return
    longest = max(pool, key=lambda c: len(c.assistant_turns()))
    if len(longest.assistant_turns()) <= study.turns_per_participant:
        return
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    line = next((i for i, text in enumerate(lines, 1) if text.startswith("turns_per_participant")), None)
    raise FormatError([Problem(str(path), line, "turns_per_participant",
                               f"must be at least the longest conversation's assistant turns "
                               f"({longest.conversation_id}: {len(longest.assistant_turns())}): "
                               f"a conversation is never split")])
