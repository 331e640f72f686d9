"""A participant's way through a crowd study: an entry that agreed holds only a short reservation while it
answers the comprehension check (no seat, slot, rater-page link or task); passing the check takes a seat and
their first conversations and starts the rating lease (never restarted), and only then is the rater-page
link issued and the worker asked for their tasks. Conversations are chosen as the participant goes
(`top_up`, issue 41): at the check their first one and one ahead (`AHEAD`), then one more each time they
finish one (every turn answered), by the study's policy with their answers so far, until their share (N
conversations or the turn budget) is held or the pool has nothing left for them; the worker makes the new
conversation's tasks while they rate the one ahead. Finished when every turn of every conversation held is
answered and their share is held, or the pool had nothing more for them (they finish with what they did:
the finish page's code is given for nothing less); abandoned when the reservation or the lease ends
(unfinished conversations go back to the pool, the ratings given stay); withdrawn for good. The rater page
and the worker call these; nothing here talks to Label Studio."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select

from sense7.crowd.assignment import Assignments, expired_participants, lease_end
from sense7.crowd.participants import STATES, Participants, Studies, free_left_seats, withdrawn_unsettled
from sense7.crowd.study import CrowdStudy
from sense7.data.conversations import Conversation, Message
from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook, RaterQueue
from sense7.store.tables import (annotations, conversations as conversation_texts, crowd_participants, rater_tasks,
                                 submissions)


# Conversations held prepared beyond the one being rated. One is enough for the next turn to be there when a
# conversation is finished: the worker's round (a few seconds) runs while the participant rates a whole
# conversation. The cost: the conversation after the next is chosen from their answers up to the one just
# finished (one conversation behind), and a participant who leaves holds one unrated conversation more
# until their lease ends. AHEAD = 0 would choose with every answer but make them wait for each round.
AHEAD = 1


def assignments_of(store: Store, study: CrowdStudy) -> Assignments:
    return Assignments(store, study.study_id, study.policy())


def _aware(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment


def start_rating(store: Store, study: CrowdStudy, rater_id: str) -> list[str] | None:
    """A participant who passed the check: a seat (lowest free number) and their first conversations (the
    first and `AHEAD` more: `top_up`), taken now, and the rating lease (`lease_minutes`) started; returns
    their conversations. None when they are no longer at the
    check (their reservation ran out: `abandoned`; withdrawn; ...) or when no seat or no slot is left (they
    are then `full`: holding nothing, they may enter again). Idempotent: a participant already rating gets
    the same conversations, and their lease runs on untouched (it is never restarted)."""
    participants, assignments = Participants(store, study), assignments_of(store, study)
    who = participants.get(rater_id)
    if who is None:
        return None
    if who.state == "rating":
        return assignments.of(rater_id)
    if who.state != "checking":
        return None
    if who.lease_until is not None and _aware(who.lease_until) < datetime.now(timezone.utc):
        abandon(store, study, rater_id)  # the reservation ran out before the check was passed
        return None
    if participants.take_seat(rater_id, has_room=lambda conn: assignments.room_for_share(rater_id, conn)) is None:
        participants.move(rater_id, "checking", "full")  # no seat, no room for their share, or no longer checking
        return None
    conversations = top_up(store, study, rater_id)
    if not conversations:
        participants.move(rater_id, "checking", "full")
        return None
    if not participants.move(rater_id, "checking", "rating", lease_until=lease_end(study.lease_minutes)):
        assignments.release(rater_id)  # ended meanwhile (the reservation's end, a withdrawal): nothing stays held
        return None
    return assignments.of(rater_id)


def top_up(store: Store, study: CrowdStudy, rater_id: str) -> list[str]:
    """Keep the participant holding 1 + AHEAD unfinished conversations while their share allows: take what is
    missing now (the study's policy chooses, with the answers so far: sense7.crowd.assignment.assign_next);
    returns the conversations taken ([]: none needed, share held, nothing left for them, or they are not
    inside the study). Idempotent: called at the check, after each answer and at the finish page."""
    assignments = assignments_of(store, study)
    held = assignments.of(rater_id)
    unfinished = set(held) - rated_conversations(store, study, rater_id) if held else set()
    missing = 1 + AHEAD - len(unfinished)
    return assignments.assign_next(rater_id, missing) if missing > 0 else []


def advance(store: Store, rater_id: str) -> tuple[str, list[str]] | None:
    """After an answer on the rater page: a crowd participant who is rating gets their next conversation when
    one is finished (`top_up`). Returns (study, conversations taken) for a crowd participant rating, None
    for anyone else (one indexed read: a rater outside crowd studies pays only that)."""
    with store.engine.connect() as conn:
        row = conn.execute(select(crowd_participants.c.study_id, crowd_participants.c.state)
                           .where(crowd_participants.c.rater_id == rater_id)).first()
    if row is None or row.state != "rating":
        return None
    found = Studies(store).get(row.study_id)
    if found is None:
        return None
    return row.study_id, top_up(store, found[0], rater_id)


def unprepared(store: Store, rater_ids) -> dict[str, set[str]]:
    """Rater -> the conversations they hold (with assistant turns) whose tasks are not in their queue copy
    yet: what the prepare job still has to make for them."""
    from sqlalchemy import exists

    from sense7.store.tables import crowd_pool, crowd_slots

    ids = list(rater_ids)
    if not ids:
        return {}
    with store.engine.connect() as conn:
        rows = conn.execute(select(crowd_slots.c.rater_id, crowd_slots.c.conversation_id).where(
            crowd_slots.c.rater_id.in_(ids),
            exists().where(crowd_pool.c.study_id == crowd_slots.c.study_id,
                           crowd_pool.c.conversation_id == crowd_slots.c.conversation_id, crowd_pool.c.turns > 0),
            ~exists().where(rater_tasks.c.rater_id == crowd_slots.c.rater_id,
                            rater_tasks.c.conversation_id == crowd_slots.c.conversation_id)))
        found: dict[str, set[str]] = {}
        for row in rows:
            found.setdefault(row.rater_id, set()).add(row.conversation_id)
    return found


def give_back(store: Store, study: CrowdStudy, rater_id: str) -> list[str]:
    """A participant screened out by the check: their rater-page link is revoked and anything they hold goes
    back to the pool at once (nothing, since slots come with a passed check; a participant who consented
    under an older version held slots from consent on). Returns the conversations given back."""
    LinkBook(store).revoke(rater_id)
    return assignments_of(store, study).release(rater_id)


def answered_turns(store: Store, rater_id: str) -> set[tuple[str, int]]:
    """(conversation, turn) pairs this rater answered: a rater-page submission of theirs (delivered or not; left
    out or not) or a rating credited to them in the store (synced from Label Studio)."""
    with store.engine.connect() as conn:
        found = {(r.conversation_id, r.turn_index) for r in conn.execute(
            select(rater_tasks.c.conversation_id, rater_tasks.c.turn_index).join(
                submissions, (submissions.c.task_id == rater_tasks.c.task_id)
                & (submissions.c.rater_id == rater_tasks.c.rater_id))
            .where(rater_tasks.c.rater_id == rater_id, rater_tasks.c.kind == "rating").distinct())}
        found |= {(r.conversation_id, r.turn_index) for r in conn.execute(
            select(annotations.c.conversation_id, annotations.c.turn_index).where(
                annotations.c.rater_id == rater_id, annotations.c.deleted.is_(False),
                annotations.c.quarantine.is_(None), annotations.c.turn_index.is_not(None)).distinct())}
    return found


def assigned_turns(store: Store, study: CrowdStudy, rater_id: str) -> dict[str, list[int]]:
    """Every conversation the participant holds in the study's slots -> its assistant turns (message indices):
    the work a completion needs, whatever their queue copy shows."""
    held = assignments_of(store, study).of(rater_id)
    with store.engine.connect() as conn:
        texts = {r.conversation_id: r.messages for r in conn.execute(
            select(conversation_texts.c.conversation_id, conversation_texts.c.messages).where(
                conversation_texts.c.conversation_id.in_(held)))}
    return {c: [i for i, m in enumerate(texts.get(c) or []) if m.get("role") == "assistant"] for c in held}


def rated_conversations(store: Store, study: CrowdStudy, rater_id: str) -> set[str]:
    """Conversations the participant holds whose every turn they answered (kept when their lease ends)."""
    answered = answered_turns(store, rater_id)
    return {c for c, turns in assigned_turns(store, study, rater_id).items()
            if turns and all((c, t) in answered for t in turns)}


def unrated_turns(store: Store, study: CrowdStudy, rater_id: str) -> list[tuple[str, int]]:
    """The assigned turns the participant has not answered yet (a conversation held without text counts)."""
    answered = answered_turns(store, rater_id)
    missing = []
    for c, turns in assigned_turns(store, study, rater_id).items():
        missing += [(c, t) for t in turns if (c, t) not in answered] if turns else [(c, -1)]
    return missing


def finish(store: Store, study: CrowdStudy, rater_id: str) -> bool:
    """Complete a participant who did the work (True, also when already completed): every item of their
    queue answered (questionnaire, repeats), every turn of every conversation they hold in the study's
    slots answered by them, left-out ones included, and their share held (N conversations, or a turn budget
    nothing more fits in) or nothing left in the pool for them now (`top_up` takes none: they finish with
    what they did rather than wait for other participants' leases). A withdrawn participant never completes."""
    participants = Participants(store, study)
    current = participants.get(rater_id)
    if current is None:
        return False
    if current.state == "completed":
        return True
    items = RaterQueue(store).items(rater_id)
    if current.state != "rating" or not items or any(i.answer is None for i in items):
        return False
    assignments = assignments_of(store, study)
    held = assignments.of(rater_id)
    if not held or unrated_turns(store, study, rater_id):
        return False
    if top_up(store, study, rater_id):  # more of their share was free: rated next, no code yet
        return False
    held = assignments.of(rater_id)
    assignments.finish(rater_id, held)
    return participants.move(rater_id, "rating", "completed") or participants.get(rater_id).state == "completed"


def abandon(store: Store, study: CrowdStudy, rater_id: str) -> int | None:
    """End a participant whose reservation or lease ran out (or whose platform submission was returned or timed
    out): `abandoned`, their seat freed, their link revoked (a replayed form gets 404), conversations they
    fully rated kept as rated and the others given back. Returns the slots given back, None when they were
    not checking or rating any more."""
    if not Participants(store, study).move(rater_id, ("checking", "rating"), "abandoned"):
        return None
    LinkBook(store).revoke(rater_id)
    return len(assignments_of(store, study).release(rater_id, keep=rated_conversations(store, study, rater_id)))


def withdraw(store: Store, rater_id: str) -> list[str]:
    """Settle a crowd participant's withdrawal (asked for on the rater page or with `sense7 raters withdraw`;
    idempotent, and beat's expiry pass settles any left): `withdrawn` for good, their seat freed, their link
    revoked, and every slot they hold back to the pool at once, rated ones too (their ratings are to be
    erased: the conversation would otherwise stay a rater short until the erasure). Returns the conversations
    given back (none for someone who is not a crowd participant)."""
    with store.engine.connect() as conn:
        study_id = conn.scalar(select(crowd_participants.c.study_id).where(crowd_participants.c.rater_id == rater_id))
    found = Studies(store).get(study_id) if study_id else None
    if found is None:
        return []
    study = found[0]
    Participants(store, study).move(rater_id, [s for s in STATES if s != "withdrawn"], "withdrawn")
    LinkBook(store).revoke(rater_id)
    return assignments_of(store, study).release(rater_id, rated_too=True)


@dataclass
class Expired:
    participants: int = 0
    released: int = 0
    withdrawn: int = 0


def expire_leases(store: Store, now=None) -> Expired:
    """Beat's pass: participants whose reservation (at the check) or lease (rating) ended are abandoned
    (`abandon`), withdrawals not settled yet are (`withdraw`), and seats of participants who ended without
    completing are free."""
    studies, result = Studies(store), Expired()
    for _, rater_id in withdrawn_unsettled(store):
        withdraw(store, rater_id)
        result.withdrawn += 1
    free_left_seats(store)
    for study_id, rater_id in expired_participants(store, now):
        found = studies.get(study_id)
        if found is None:
            continue
        released = abandon(store, found[0], rater_id)
        if released is None:
            continue  # finished (or screened out, or withdrawn) in the meantime
        result.released += released
        result.participants += 1
    return result


def end_returned(store: Store, study: CrowdStudy, platform_ids) -> Expired:
    """Participants whose submission the platform reports returned or timed out (sense7.tasks.crowd_jobs, with a
    Prolific API token): abandoned at once, their slots and seat freed for the next participant."""
    result = Expired()
    for rater_id in Participants(store, study).by_platform_ids(platform_ids):
        released = abandon(store, study, rater_id)
        if released is not None:
            result.participants += 1
            result.released += released
    return result


def waiting_for_tasks(store: Store, limit: int | None = None, skip=()) -> list[tuple[str, str]]:
    """(study, rater) of participants rating (passed the check) who hold a conversation (with assistant
    turns) whose tasks are not in their queue copy yet (`unprepared`): who the prepare job works for, oldest
    consent first; a participant given their next conversation waits here again. The store is the record,
    so a participant asked for by a job that died is found by the next one (no Redis set to lose). Nobody
    at the check is ever prepared: an unchecked entry gets no Label Studio task."""
    from sqlalchemy import exists

    from sense7.store.tables import crowd_pool, crowd_slots

    missing = exists().where(
        crowd_slots.c.rater_id == crowd_participants.c.rater_id,
        crowd_slots.c.study_id == crowd_participants.c.study_id,
        exists().where(crowd_pool.c.study_id == crowd_slots.c.study_id,
                       crowd_pool.c.conversation_id == crowd_slots.c.conversation_id, crowd_pool.c.turns > 0)
        .correlate(crowd_slots),
        ~exists().where(rater_tasks.c.rater_id == crowd_slots.c.rater_id,
                        rater_tasks.c.conversation_id == crowd_slots.c.conversation_id).correlate(crowd_slots))
    query = (select(crowd_participants.c.study_id, crowd_participants.c.rater_id)
             .where(crowd_participants.c.state == "rating", missing)
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
    from sense7.store.tables import crowd_released

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
    from sqlalchemy import update

    from sense7.store.tables import crowd_released

    if not rows:
        return
    with store.engine.begin() as conn:
        conn.execute(update(crowd_released).where(crowd_released.c.id.in_(list(rows)))
                     .values(tasks_cleared_at=datetime.now(timezone.utc) if cleared else None))


def clear_again(store: Store, rater_ids) -> None:
    """Tasks were made for these participants after they gave their slots back (a prepare round that
    raced their lease's end): their given-back rows are cleared again by the next expiry pass."""
    from sense7.store.tables import crowd_released

    with store.engine.connect() as conn:
        rows = [r.id for r in conn.execute(select(crowd_released.c.id).where(
            crowd_released.c.rater_id.in_(list(rater_ids)), crowd_released.c.tasks_cleared_at.is_not(None)))]
    mark_cleared(store, rows, cleared=False)


def answered_tasks(store: Store, rater_id: str) -> set[int]:
    """Task ids the participant answered (on the page, delivered or not, or in Label Studio as copied)."""
    return {item.task_id for item in RaterQueue(store).items(rater_id, left_out=True) if item.answer is not None}


def forget_tasks(store: Store, rater_id: str, task_ids) -> None:
    """Drop deleted tasks from the participant's queue copy (their link is revoked: nobody shows them)."""
    if task_ids:
        with store.engine.begin() as conn:
            conn.execute(rater_tasks.delete().where(rater_tasks.c.rater_id == rater_id,
                                                    rater_tasks.c.task_id.in_(list(task_ids))))


def conversations_for(store: Store, study: CrowdStudy, rater_id: str, pool=None, texts=None) -> list[Conversation]:
    """The participant's assigned conversations, as conversations of theirs (what the importer takes):
    the pool's texts and contexts under the pseudonymous rater id. `pool`, `texts`: the study's pool and the
    store's texts when the caller read them already (the prepare job, once per round, not per participant)."""
    pool = Studies(store).pool(study.study_id) if pool is None else pool
    texts = store.conversations_by_id() if texts is None else texts
    return [Conversation(c, rater_id, [Message(m.role, m.content) for m in texts[c]], dict(pool[c]["context"]))
            for c in assignments_of(store, study).of(rater_id) if c in texts and c in pool]


def status(store: Store) -> list[dict]:
    """Per crowd study: open or closed, the pool's coverage (totals and per conversation) and the
    participants' counts (`sense7 crowd status` and `sense7 status` print the same)."""
    studies, out = Studies(store), []
    for study_id in studies.ids():
        study, is_open = studies.get(study_id)
        participants = Participants(store, study)
        out.append({"study": study_id, "open": is_open, "cap": study.participant_cap, "seated": participants.seated(),
                    "coverage": assignments_of(store, study).coverage(),
                    "participants": participants.counts()})
    return out


def install_study(store: Store, path, taxonomy, on_redaction=None) -> tuple[CrowdStudy, int]:
    """Validate a study file and its pool (every problem as file:line: field: reason, nothing written on
    error), then store both; returns (study, conversations in the pool). A new study starts closed.

    The pool comes in as every batch does (sense7.readers.intake: the readers of `sense7 import`, personal
    details scrubbed, refused when it would change the text the store holds under one of its ids).
    `on_redaction(report)`: told what the scrub replaced, once the study is stored."""
    from sense7.crowd.study import load_study
    from sense7.readers.intake import ReimportConflict, admit, read_batch

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

    from sense7.readers.formats import FormatError, Problem

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
