"""Overlap control: which conversations of the pool a participant rates.

The rule is the study's assignment policy (sense7.crowd.policies, pure: `least_covered` by default, or
`random`, `learn_rater`, `settle_items`): never a conversation the participant already had, never beyond K
raters per conversation, a floor of raters every conversation gets first; with least_covered, taking slots
one participant at a time keeps the pool's coverage within 1 while slots remain. `Assignments` applies it
to the store (and reads the answers so far for the policies that learn from them): a
taken slot is a row keyed (study, conversation, slot number in 0..K-1), so two entries racing for the
last slot both try to insert the same key and the store refuses one (a compare-and-set, never a read
then a blind write); the loser reads again and picks again. Slots are taken only once a participant passed
the comprehension check (sense7.crowd.lifecycle.start_rating). Leases: a participant's unfinished
conversations go back to the pool when their lease expires (`release`); finished ones stay counted.

Paced (issue 41): a participant's slots are taken as they go (`assign_next`, called by
sense7.crowd.lifecycle.top_up: their first conversation and one ahead at the check, each next one when one
is finished), each choice made by the policy with the answers so far, their own page submissions included.
`assign` (all N at once) stays for the tests and tools that want the whole share in one step.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from sense7.crowd.policies import LeastCovered, Policy, conversation_state
from sense7.store.database import Store
from sense7.store.rater_page_tables import RaterQueue
from sense7.store.tables import (annotations, crowd_participants, crowd_pool, crowd_released, crowd_slots,
                                 ratings, withdrawals)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Moved(Exception):
    """The participant's slots changed between the read and the write (assign_next reads again)."""


# Today's rule, under its old name: least covered first (sense7.crowd.policies has the others).
AssignmentPolicy = LeastCovered


class Assignments:
    """The store-backed owner of a study's slots."""

    def __init__(self, store: Store, study_id: str, policy: Policy):
        self.store, self.study_id, self.policy = store, study_id, policy

    def taken(self, conn=None) -> dict[str, set[int]]:
        """Every pool conversation -> its slot numbers held (in a lease or finished)."""
        def read(c):
            pool = c.execute(select(crowd_pool.c.conversation_id).where(crowd_pool.c.study_id == self.study_id))
            found: dict[str, set[int]] = {r.conversation_id: set() for r in pool}
            for row in c.execute(select(crowd_slots.c.conversation_id, crowd_slots.c.slot)
                                 .where(crowd_slots.c.study_id == self.study_id)):
                if row.conversation_id in found:  # a conversation dropped from the pool is never offered again
                    found[row.conversation_id].add(row.slot)
            return found
        if conn is not None:
            return read(conn)
        with self.store.engine.connect() as c:
            return read(c)

    def turns(self) -> dict[str, int]:
        """Every pool conversation -> its assistant turns (what a turn budget counts)."""
        with self.store.engine.connect() as conn:
            return {r.conversation_id: r.turns for r in conn.execute(
                select(crowd_pool.c.conversation_id, crowd_pool.c.turns).where(crowd_pool.c.study_id == self.study_id))}

    def answers(self, rater_id: str | None = None) -> dict[str, dict[str, float]]:
        """The answers so far that learning policies read: pool conversation -> rater -> their mean rating
        over its turns and controls (scale positions), from the ratings synced into the store (not deleted,
        not quarantined; a rater-page answer counts once delivered and synced). With `rater_id`, that
        rater's own rater-page answers count at once too (`own_answers`: where nothing of theirs is synced
        for a conversation yet), so the next conversation chosen for them knows the one they just finished."""
        with self.store.engine.connect() as conn:
            pool = {r.conversation_id for r in conn.execute(
                select(crowd_pool.c.conversation_id).where(crowd_pool.c.study_id == self.study_id))}
            rows = conn.execute(
                select(annotations.c.conversation_id, annotations.c.rater_id, func.avg(ratings.c.value).label("mean"))
                .join(ratings, ratings.c.annotation_id == annotations.c.annotation_id)
                .where(annotations.c.deleted.is_(False), annotations.c.quarantine.is_(None),
                       annotations.c.rater_id.is_not(None), annotations.c.repeat_of.is_(None))
                .group_by(annotations.c.conversation_id, annotations.c.rater_id)).all()
        found: dict[str, dict[str, float]] = {}
        for row in rows:
            if row.conversation_id in pool:
                found.setdefault(row.conversation_id, {})[row.rater_id] = float(row.mean)
        if rater_id is not None:
            for conversation, mean in self.own_answers(rater_id).items():
                if conversation in pool:
                    found.setdefault(conversation, {}).setdefault(rater_id, mean)
        return found

    def own_answers(self, rater_id: str) -> dict[str, float]:
        """Conversation -> this rater's mean answer over its turns and controls, from their queue copy (their
        latest page submission, delivered or not, else what Label Studio held): one indexed read of one
        rater's rows, cheap enough to run at every conversation they finish."""
        sums: dict[str, list[float]] = {}
        for item in RaterQueue(self.store).items(rater_id, left_out=True):
            values = (item.answer or {}).get("values") if item.kind == "rating" else None
            for value in (values or {}).values():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    total = sums.setdefault(item.conversation_id, [0.0, 0])
                    total[0] += float(value)
                    total[1] += 1
        return {c: s / n for c, (s, n) in sums.items() if n}

    def _choose(self, rater_id: str) -> list[tuple[str, int]]:
        return self.policy.choose(self.taken(), rater_id, turns=self.turns() if self.policy.turn_budget else None,
                                  ratings=self.answers() if self.policy.uses_ratings else None)

    def of(self, rater_id: str) -> list[str]:
        """The conversations this participant holds (in a lease or finished), by id."""
        with self.store.engine.connect() as conn:
            return [r.conversation_id for r in conn.execute(
                select(crowd_slots.c.conversation_id).where(crowd_slots.c.study_id == self.study_id,
                                                            crowd_slots.c.rater_id == rater_id)
                .order_by(crowd_slots.c.conversation_id))]

    def assign(self, rater_id: str, attempts: int = 50) -> list[str]:
        """Take up to N slots for this participant at once (all or, after a lost race, again from a fresh
        read); returns the conversations ([] when the pool has no slot left). A participant who already
        holds slots gets those back and nothing more: one assignment per participant."""
        for _ in range(attempts):
            held = self.of(rater_id)
            if held:
                return held
            choice = self._choose(rater_id)
            if not choice:
                return []
            rows = self.slot_rows(rater_id, choice)
            try:
                with self.store.engine.begin() as conn:
                    conn.execute(crowd_slots.insert(), rows)
            except (IntegrityError, OperationalError):  # someone took one of these slots first: pick again
                continue
            return sorted(c for c, _ in choice)
        raise RuntimeError(f"could not assign conversations after {attempts} concurrent attempts")

    def assign_next(self, rater_id: str, count: int = 1, attempts: int = 50) -> list[str]:
        """Take up to `count` more conversations for this participant, chosen now by the study's policy with
        the answers so far (theirs from the page included), within what is left of their share (N
        conversations, or the turns left of their budget); returns those taken ([]: share reached, nothing
        left in the pool for them, or they may hold nothing).

        Only for a participant who passed the check and is inside the study: `rating`, or `checking` with a
        seat (start_rating between the seat and the move to rating), never with a withdrawal asked for. The
        participant's row is written first in the same transaction (a lock on it: SQLite's write lock,
        PostgreSQL's row lock), so two requests of theirs at once (a double submit) cannot both take a slot
        past their share: the second reads the first's slots before choosing again."""
        n, budget = self.policy.conversations_per_participant, self.policy.turn_budget
        for _ in range(attempts):
            held = self.of(rater_id)
            limit = count if n is None else min(count, n - len(held))
            turns = self.turns() if budget is not None else None
            left = None if budget is None else budget - sum(turns.get(c, 0) for c in held)
            if limit <= 0 or (left is not None and left <= 0):
                return []
            step = dataclasses.replace(self.policy, conversations_per_participant=limit, turn_budget=left)
            choice = step.choose(self.taken(), rater_id, exclude=set(held), turns=turns,
                                 ratings=self.answers(rater_id) if self.policy.uses_ratings else None)
            if not choice:
                return []
            rows = self.slot_rows(rater_id, choice)
            try:
                with self.store.engine.begin() as conn:
                    inside = conn.execute(update(crowd_participants).where(
                        crowd_participants.c.rater_id == rater_id, crowd_participants.c.study_id == self.study_id,
                        (crowd_participants.c.state == "rating") | ((crowd_participants.c.state == "checking")
                                                                    & crowd_participants.c.seat.is_not(None)))
                        .values(state=crowd_participants.c.state)).rowcount
                    if not inside or conn.scalar(select(withdrawals.c.receipt)
                                                 .where(withdrawals.c.rater_id == rater_id)) is not None:
                        return []
                    now_held = conn.scalar(select(func.count()).select_from(crowd_slots).where(
                        crowd_slots.c.study_id == self.study_id, crowd_slots.c.rater_id == rater_id))
                    if now_held != len(held):
                        raise _Moved()  # another request of theirs took a slot meanwhile: choose again
                    conn.execute(crowd_slots.insert(), rows)
            except (IntegrityError, OperationalError, _Moved):  # someone took one of these slots first
                continue
            return [c for c, _ in choice]
        raise RuntimeError(f"could not assign a next conversation after {attempts} concurrent attempts")

    def slot_rows(self, rater_id: str, choice) -> list[dict]:
        """crowd_slots rows for (conversation, slot) pairs this participant takes now."""
        now = _now()
        return [{"study_id": self.study_id, "conversation_id": c, "slot": slot, "rater_id": rater_id,
                 "taken_at": now, "done_at": None} for c, slot in choice]

    def has_room(self, rater_id: str) -> bool:
        """Whether the pool has a slot this participant could take now and, with N conversations each, room for
        their whole share beyond the shares already promised (`room_for_share`); the entry page says "full"
        when not, and so does the check (lifecycle.start_rating)."""
        if self.of(rater_id):
            return True
        return self.room_for_share(rater_id) and bool(self._choose(rater_id))

    def room_for_share(self, rater_id: str, conn=None) -> bool:
        """With N conversations per participant: whether the pool's free slots (K minus those held, per
        conversation) cover what the participants already inside still have to take (N, or the pool's size when
        smaller, minus what they hold:
        slots are taken as they go, so these are promised, not held) plus this participant's N. Keeps a late
        arrival from taking the conversations an earlier participant needs to finish their share (they would
        otherwise finish short: lifecycle.finish). With a turn budget (or K varying: settle_items closes
        conversations), True: a participant then finishes with what the pool had left for them. `conn`: read
        inside the caller's transaction (Participants.take_seat admits under the study's lock)."""
        n, k = self.policy.conversations_per_participant, self.policy.raters_per_conversation
        if n is None:
            return True
        if conn is None:
            with self.store.engine.connect() as own:
                return self.room_for_share(rater_id, own)
        taken = self.taken(conn)
        n = min(n, len(taken))  # a share is never more than the pool's conversations
        free = sum(max(k - len(slots), 0) for slots in taken.values())
        held = dict(conn.execute(
            select(crowd_participants.c.rater_id, func.count(crowd_slots.c.slot))
            .select_from(crowd_participants.outerjoin(crowd_slots, (crowd_slots.c.rater_id == crowd_participants.c.rater_id)
                                                      & (crowd_slots.c.study_id == self.study_id)))
            .where(crowd_participants.c.study_id == self.study_id, crowd_participants.c.rater_id != rater_id,
                   (crowd_participants.c.state == "rating") | ((crowd_participants.c.state == "checking")
                                                               & crowd_participants.c.seat.is_not(None)))
            .group_by(crowd_participants.c.rater_id)).all())
        owed = sum(max(n - int(h), 0) for h in held.values())
        return free - owed >= n

    def finish(self, rater_id: str, conversations) -> int:
        """Mark these conversations of the participant rated (they stay counted whatever happens later)."""
        with self.store.engine.begin() as conn:
            done = conn.execute(update(crowd_slots).where(
                crowd_slots.c.study_id == self.study_id, crowd_slots.c.rater_id == rater_id,
                crowd_slots.c.conversation_id.in_(list(conversations)), crowd_slots.c.done_at.is_(None))
                .values(done_at=_now()))
        return done.rowcount

    def release(self, rater_id: str, keep=(), rated_too: bool = False) -> list[str]:
        """Give back this participant's unfinished conversations except `keep` (which are marked rated), and
        with `rated_too` their rated ones as well (a withdrawal: those ratings are to be erased); returns those
        given back. They go to later participants; the ratings given stay where they are until erased."""
        self.finish(rater_id, keep)
        now = _now()
        held = (crowd_slots.c.study_id == self.study_id) & (crowd_slots.c.rater_id == rater_id)
        if not rated_too:
            held = held & crowd_slots.c.done_at.is_(None)
        with self.store.engine.begin() as conn:
            open_ = [r.conversation_id for r in conn.execute(select(crowd_slots.c.conversation_id).where(held))]
            if open_:
                conn.execute(delete(crowd_slots).where(held, crowd_slots.c.conversation_id.in_(open_)))
                conn.execute(crowd_released.insert(), [
                    {"study_id": self.study_id, "conversation_id": c, "rater_id": rater_id, "released_at": now}
                    for c in open_])
        return open_

    def coverage(self) -> dict:
        """Pool coverage: totals, and per conversation its slots rated and in a lease, its K so far (slots held)
        and why it stands there (`reason`: capped, settled, uncertain, below_floor; `level_sd`: how uncertain
        its level is, from the answers so far; sense7.crowd.policies.conversation_state)."""
        taken = {c: [0, 0] for c in self.taken()}
        with self.store.engine.connect() as conn:
            for row in conn.execute(select(crowd_slots.c.conversation_id, crowd_slots.c.done_at)
                                    .where(crowd_slots.c.study_id == self.study_id)):
                taken.setdefault(row.conversation_id, [0, 0])[0 if row.done_at else 1] += 1
            released = conn.scalar(select(func.count()).select_from(crowd_released)
                                   .where(crowd_released.c.study_id == self.study_id))
        done = [d for d, _ in taken.values()]
        held = [d + o for d, o in taken.values()]
        k = self.policy.raters_per_conversation
        why = conversation_state(self.policy, {c: d + o for c, (d, o) in taken.items()}, self.answers())
        reasons = {}
        for state in why.values():
            reasons[state["reason"]] = reasons.get(state["reason"], 0) + 1
        return {"conversations": len(taken), "raters_per_conversation": k, "policy": self.policy.name,
                "floor": self.policy.floor, "reasons": dict(sorted(reasons.items())),
                "slots": k * len(taken), "rated": sum(done), "in_lease": sum(o for _, o in taken.values()),
                "fully_covered": sum(d >= k for d in done),
                "spread": (max(held) - min(held)) if held else 0,
                "released": int(released or 0),
                "per_conversation": {c: {"rated": d, "in_lease": o, **why[c]} for c, (d, o) in sorted(taken.items())}}


def lease_end(minutes: int, start: datetime | None = None) -> datetime:
    return (start or _now()) + timedelta(minutes=minutes)


def expired_participants(store: Store, now: datetime | None = None) -> list[tuple[str, str]]:
    """(study, rater) of participants whose reservation (checking) or rating lease (rating) has ended."""
    now = now or _now()
    with store.engine.connect() as conn:
        return [(r.study_id, r.rater_id) for r in conn.execute(
            select(crowd_participants.c.study_id, crowd_participants.c.rater_id).where(
                crowd_participants.c.state.in_(("checking", "rating")), crowd_participants.c.lease_until < now))]
