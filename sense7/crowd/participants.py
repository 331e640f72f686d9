"""Who entered a crowd study, under which pseudonymous id, and how far they got.

- The rater id is a keyed hash (HMAC-SHA-256) of the platform id with the study's secret (SENSE7_CROWD_SECRET_<STUDY>
  or its _FILE when the settings give it, else a 0600 file under SENSE7_HOME/secrets; `Settings.secret`): the
  same participant always gets the same id, so a
  platform id never gets a second assignment, and without the secret nobody can tell whose id it is.
- The platform id itself is kept in one table only, `crowd_completions`, which `sense7 crowd completions`
  exports for approving payments. It never reaches Label Studio, task data, logs or another export.
- A resume code (short, random, shown once; only its SHA-256 is stored) lets a participant continue in
  another browser; the platform id alone never opens anyone's session. A browser's visit is bound to the
  resume code of its entry (`Participant.visit`): a new entry (after `full`) ends every older session.
- States: declined (the consent answer only), checking (agreed: a short reservation, `check_minutes`, that
  holds nothing), rating (passed the check: a seat, slots, a rater-page link, the lease), completed,
  screened_out (failed the comprehension check twice: asked to return their submission, never rejected),
  abandoned (the reservation or the lease ran out, or the platform says they returned or timed out), full
  (no seat or no slot left when they passed the check; they may enter again while the study is open),
  withdrawn (asked for their data to be erased: final, even after the erasure deleted their rows).
- Seats (0..cap-1, unique per study) are taken at the check, lowest free number first, and freed when a
  participant ends without completing: the cap counts participants inside the study and completed ones.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from sense7.crowd.study import CrowdStudy
from sense7.settings import crowd_secret_variable
from sense7.store.database import Store
from sense7.store.tables import (crowd_completions, crowd_participants, crowd_pool, crowd_studies, crowd_withdrawn,
                                 withdrawals, withdrawn_id_hash)

# Prolific's are 24 hex digits; never stored elsewhere. Never a leading "-": a spreadsheet would run it.
PLATFORM_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
RESUME_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L, U: read aloud and typed without doubt
RESUME_LENGTH = 10  # ~49 bits; guesses are rate-limited per address
CHECK_ATTEMPTS = 2
STATES = ("declined", "checking", "rating", "completed", "screened_out", "abandoned", "full", "withdrawn")
LEFT = ("screened_out", "abandoned", "full", "withdrawn")  # ended without completing: their seat is freed
ENDINGS = ("completed", *LEFT)
INSIDE = ("rating", "completed")  # the only states the rater page answers (sense7.rater_page.services.current_rater)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def valid_platform_id(value) -> bool:
    return isinstance(value, str) and bool(PLATFORM_ID.fullmatch(value))


def study_secret(settings, study_id: str) -> str:
    """The study's key of pseudonymous ids: SENSE7_CROWD_SECRET_<STUDY> (or its _FILE) when the settings give it,
    so that hosts sharing no folder agree; else 0600 under SENSE7_HOME/secrets, made once."""
    return settings.secret(f"crowd_{study_id}", crowd_secret_variable(study_id))


def pseudonymous_id(secret: str, study_id: str, platform_id: str) -> str:
    digest = hmac.new(secret.encode(), f"{study_id}\0{platform_id}".encode(), hashlib.sha256).hexdigest()
    return f"{study_id}-p{digest[:20]}"


def new_resume_code() -> str:
    return "".join(secrets.choice(RESUME_ALPHABET) for _ in range(RESUME_LENGTH))


def normalized_code(raw) -> str | None:
    """What a participant typed (spaces, dashes, lower case allowed) -> the code, or None."""
    if not isinstance(raw, str) or len(raw) > 40:
        return None
    code = re.sub(r"[\s-]", "", raw).upper()
    return code if len(code) == RESUME_LENGTH and all(c in RESUME_ALPHABET for c in code) else None


def code_hash(study_id: str, code: str) -> str:
    return hashlib.sha256(f"{study_id}\0{code}".encode()).hexdigest()


class Studies:
    """The crowd studies a home holds (`sense7 crowd init` writes them; the rater page reads them)."""

    def __init__(self, store: Store):
        self.store = store

    def save(self, study: CrowdStudy, pool: list) -> None:
        """Store the study and its pool (conversations with texts), in one transaction: a study whose pool
        changed keeps the slots of conversations still in it."""
        from sense7.store.tables import contexts as conversation_contexts
        from sense7.store.tables import conversations as conversation_texts

        rows = [{"study_id": study.study_id, "conversation_id": c.conversation_id,
                 "turns": len(c.assistant_turns()), "context": dict(c.context)} for c in pool]
        with self.store.engine.begin() as conn:
            current = conn.execute(select(crowd_studies.c.is_open).where(
                crowd_studies.c.study_id == study.study_id)).first()
            self.store.upsert_rows(conn, crowd_studies, [{
                "study_id": study.study_id, "config": study.to_config(),
                "is_open": bool(current.is_open) if current else False, "updated_at": _now()}], ["study_id"])
            conn.execute(crowd_pool.delete().where(crowd_pool.c.study_id == study.study_id))
            conn.execute(crowd_pool.insert(), rows)
            # The pool's owner keeps a context row: erasing a participant (sense7.privacy.participation) then
            # never takes a pool conversation's text with them.
            self.store.upsert_rows(conn, conversation_contexts, [
                {"conversation_id": c.conversation_id, "rater_id": c.rater_id, "context": dict(c.context)}
                for c in pool], ["conversation_id", "rater_id"])
            self.store.upsert_rows(conn, conversation_texts, [
                {"conversation_id": c.conversation_id,
                 "messages": [{"role": m.role, "content": m.content} for m in c.messages]} for c in pool],
                ["conversation_id"])

    def get(self, study_id: str) -> tuple[CrowdStudy, bool] | None:
        """(study, open) or None."""
        if not isinstance(study_id, str) or len(study_id) > 100:
            return None
        with self.store.engine.connect() as conn:
            row = conn.execute(select(crowd_studies).where(crowd_studies.c.study_id == study_id)).mappings().first()
        return (CrowdStudy.from_config(row["config"]), bool(row["is_open"])) if row else None

    def set_open(self, study_id: str, is_open: bool) -> bool:
        with self.store.engine.begin() as conn:
            done = conn.execute(update(crowd_studies).where(crowd_studies.c.study_id == study_id)
                                .values(is_open=is_open, updated_at=_now()))
        return bool(done.rowcount)

    def ids(self) -> list[str]:
        with self.store.engine.connect() as conn:
            return [r.study_id for r in conn.execute(select(crowd_studies.c.study_id).order_by(crowd_studies.c.study_id))]

    def pool(self, study_id: str) -> dict[str, dict]:
        """conversation id -> {"turns", "context"}."""
        with self.store.engine.connect() as conn:
            return {r.conversation_id: {"turns": r.turns, "context": r.context} for r in conn.execute(
                select(crowd_pool).where(crowd_pool.c.study_id == study_id))}


@dataclass(frozen=True)
class Participant:
    rater_id: str
    study_id: str
    state: str  # "withdrawn" as soon as a withdrawal is asked for, and after the erasure (a tombstone)
    check_attempts: int
    lease_until: datetime | None
    visit: str | None = None  # names this entry's resume code (not the code, nor its stored hash)
    seat: int | None = None


def visit_of(resume_hash: str | None) -> str | None:
    """What a session keeps of the entry it belongs to: a new entry (a new resume code) ends older sessions."""
    return hashlib.sha256(f"visit\0{resume_hash}".encode()).hexdigest()[:32] if resume_hash else None


class AlreadyEntered(Exception):
    """This platform id has entered the study before (whatever came of it, but `full`)."""


class Participants:
    """A study's participants (the store owner of crowd_participants and crowd_completions)."""

    def __init__(self, store: Store, study: CrowdStudy):
        self.store, self.study = store, study

    def get(self, rater_id) -> Participant | None:
        if not isinstance(rater_id, str) or len(rater_id) > 200:
            return None
        with self.store.engine.connect() as conn:
            row = conn.execute(select(crowd_participants).where(
                crowd_participants.c.rater_id == rater_id,
                crowd_participants.c.study_id == self.study.study_id)).mappings().first()
            if row is None:
                if self.erased(conn, rater_id):
                    return Participant(rater_id, self.study.study_id, "withdrawn", 0, None)
                return None
            asked = conn.scalar(select(withdrawals.c.receipt).where(withdrawals.c.rater_id == rater_id))
        # A withdrawal asked for is final at once, before the crowd's own bookkeeping (lifecycle.withdraw) ran.
        return Participant(row["rater_id"], row["study_id"], "withdrawn" if asked else row["state"],
                           row["check_attempts"], row["lease_until"], visit_of(row["resume_hash"]), row["seat"])

    def erased(self, conn, rater_id: str) -> bool:
        """Whether this pseudonymous id withdrew and was erased (crowd_withdrawn keeps its hash only)."""
        return conn.scalar(select(crowd_withdrawn.c.id_hash).where(
            crowd_withdrawn.c.study_id == self.study.study_id,
            crowd_withdrawn.c.id_hash == withdrawn_id_hash(rater_id))) is not None

    def seated(self) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(crowd_participants).where(
                crowd_participants.c.study_id == self.study.study_id, crowd_participants.c.seat.is_not(None))))

    def decline(self, rater_id: str) -> None:
        """The consent answer 'no' with its version and time, and nothing else (no platform id). A participant
        turned away as `full` who enters again and declines keeps their one row, now `declined`."""
        row = {"rater_id": rater_id, "study_id": self.study.study_id, "state": "declined", "seat": None,
               "consent": "declined", "consent_version": self.study.consent_version, "consent_at": _now(),
               "resume_hash": None, "check_attempts": 0, "lease_until": None, "ended_at": _now()}
        if self.move(rater_id, "full", "declined", consent="declined", consent_version=self.study.consent_version,
                     consent_at=_now(), resume_hash=None, lease_until=None, ended_at=_now()):
            return
        try:
            with self.store.engine.begin() as conn:
                if self.erased(conn, rater_id):
                    raise AlreadyEntered()
                conn.execute(crowd_participants.insert(), [row])
        except IntegrityError:
            raise AlreadyEntered() from None

    def agree(self, rater_id: str, platform: dict) -> str:
        """Record the consent of a participant who agreed: `checking`, with a reservation of `check_minutes`
        that holds nothing (no seat, slot, link or task: those come with the check, lifecycle.start_rating), so
        entries are not capped here. Returns their resume code (shown once). A participant turned away as
        `full` enters again this way (a fresh reservation and resume code: older sessions and the old code stop
        working); anyone else who entered before, or withdrew, raises AlreadyEntered. `platform`:
        {"platform_id", "platform_study", "platform_session"}, kept in crowd_completions only."""
        code = new_resume_code()
        now = _now()
        values = {"state": "checking", "seat": None, "consent": "agreed", "consent_version": self.study.consent_version,
                  "consent_at": now, "resume_hash": code_hash(self.study.study_id, code), "check_attempts": 0,
                  "lease_until": now + timedelta(minutes=self.study.check_minutes), "ended_at": None}
        completion = {"study_id": self.study.study_id, "outcome": "entered", "entered_at": now, "ended_at": None,
                      **platform}
        try:
            with self.store.engine.begin() as conn:
                if self.erased(conn, rater_id) or conn.scalar(
                        select(withdrawals.c.receipt).where(withdrawals.c.rater_id == rater_id)) is not None:
                    raise AlreadyEntered()
                before = conn.scalar(select(crowd_participants.c.state).where(crowd_participants.c.rater_id == rater_id))
                if before is None:
                    conn.execute(crowd_participants.insert(), [{"rater_id": rater_id, "study_id": self.study.study_id,
                                                                **values}])
                    conn.execute(crowd_completions.insert(), [{"rater_id": rater_id, **completion}])
                elif before == "full":  # compare-and-set: two browsers entering again at once, one wins
                    done = conn.execute(update(crowd_participants).where(
                        crowd_participants.c.rater_id == rater_id, crowd_participants.c.state == "full",
                        crowd_participants.c.study_id == self.study.study_id).values(**values))
                    if not done.rowcount:
                        raise AlreadyEntered()
                    self.store.upsert_rows(conn, crowd_completions, [{"rater_id": rater_id, **completion}],
                                           ["rater_id"])
                else:
                    raise AlreadyEntered()
        except (IntegrityError, OperationalError):
            raise AlreadyEntered() from None
        return code

    def take_seat(self, rater_id: str, has_room=None, attempts: int = 50) -> int | None:
        """A seat for a participant who passed the check (still `checking`): the lowest free number below the
        cap. Their own seat if they hold one; None when every seat is taken, `has_room(conn)` (read in the same
        transaction: Assignments.room_for_share) says the pool cannot promise them their share, or the
        participant is no longer checking.

        Admissions to one study go one at a time: the transaction first writes the study's row (SQLite's write
        lock, PostgreSQL's row lock), then reads the seats and the room. Without that, participants passing the
        check at the same moment all sit down first and then each sees the others' promised shares, so all but
        a few are told "full" while the pool still has room for more of them."""
        for _ in range(attempts):
            try:
                with self.store.engine.begin() as conn:
                    conn.execute(update(crowd_studies).where(crowd_studies.c.study_id == self.study.study_id)
                                 .values(updated_at=crowd_studies.c.updated_at))
                    row = conn.execute(select(crowd_participants.c.state, crowd_participants.c.seat).where(
                        crowd_participants.c.rater_id == rater_id,
                        crowd_participants.c.study_id == self.study.study_id)).first()
                    if row is None or row.state != "checking":
                        return None
                    if row.seat is not None:
                        return row.seat
                    taken = {s for (s,) in conn.execute(select(crowd_participants.c.seat).where(
                        crowd_participants.c.study_id == self.study.study_id,
                        crowd_participants.c.seat.is_not(None)))}
                    free = next((n for n in range(self.study.participant_cap) if n not in taken), None)
                    if free is None or (has_room is not None and not has_room(conn)):
                        return None
                    conn.execute(update(crowd_participants).where(
                        crowd_participants.c.rater_id == rater_id, crowd_participants.c.state == "checking",
                        crowd_participants.c.seat.is_(None)).values(seat=free))
                    return free
            except (IntegrityError, OperationalError):
                continue  # the store was busy past its timeout (or a seat number raced): read again
        raise RuntimeError(f"could not seat a participant after {attempts} concurrent attempts")

    def by_resume_code(self, raw) -> Participant | None:
        code = normalized_code(raw)
        if code is None:
            return None
        wanted = code_hash(self.study.study_id, code)
        with self.store.engine.connect() as conn:
            row = conn.execute(select(crowd_participants.c.rater_id, crowd_participants.c.resume_hash).where(
                crowd_participants.c.resume_hash == wanted,
                crowd_participants.c.study_id == self.study.study_id)).first()
        return self.get(row.rater_id) if row and hmac.compare_digest(row.resume_hash, wanted) else None

    def move(self, rater_id: str, before: str | tuple, after: str, **values) -> bool:
        """Change state `before` (one or several) -> `after` (compare-and-set: False when the participant was
        in none of them, e.g. a replayed form). Ending states close the completions row (a withdrawal after
        completing keeps "completed" there: that work is paid); leaving without completing frees the seat."""
        before = (before,) if isinstance(before, str) else tuple(before)
        ended = {"ended_at": _now()} if after in ENDINGS else {}
        freed = {"seat": None} if after in LEFT else {}
        with self.store.engine.begin() as conn:
            done = conn.execute(update(crowd_participants).where(
                crowd_participants.c.rater_id == rater_id, crowd_participants.c.state.in_(before),
                crowd_participants.c.study_id == self.study.study_id)
                .values(state=after, **ended, **freed, **values))
            if done.rowcount and (ended or after == "declined"):
                closing = update(crowd_completions).where(crowd_completions.c.rater_id == rater_id)
                if after == "withdrawn":
                    closing = closing.where(crowd_completions.c.outcome != "completed")
                conn.execute(closing.values(outcome=after, ended_at=_now()))
        return bool(done.rowcount)

    def failed_check(self, rater_id: str, seen_attempts: int) -> str | None:
        """Count one failed attempt (compare-and-set on the attempts seen); returns the new state
        (checking or screened_out), None for a replayed form."""
        attempts = seen_attempts + 1
        state = "screened_out" if attempts >= CHECK_ATTEMPTS else "checking"
        with self.store.engine.begin() as conn:
            done = conn.execute(update(crowd_participants).where(
                crowd_participants.c.rater_id == rater_id, crowd_participants.c.state == "checking",
                crowd_participants.c.check_attempts == seen_attempts)
                .values(check_attempts=attempts, state=state,
                        **({"ended_at": _now(), "seat": None} if state == "screened_out" else {})))
            if done.rowcount and state == "screened_out":
                conn.execute(update(crowd_completions).where(crowd_completions.c.rater_id == rater_id)
                             .values(outcome="screened_out", ended_at=_now()))
        return state if done.rowcount else None

    def counts(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            found = dict(conn.execute(select(crowd_participants.c.state, func.count()).where(
                crowd_participants.c.study_id == self.study.study_id).group_by(crowd_participants.c.state)).all())
        return {state: int(found.get(state, 0)) for state in STATES}

    def by_platform_ids(self, platform_ids, states=("checking", "rating")) -> list[str]:
        """Rater ids of this study's participants in `states` entered with these platform ids (the platform
        said their submission was returned or timed out: sense7.tasks.crowd_jobs)."""
        ids = [p for p in platform_ids if isinstance(p, str)]
        if not ids:
            return []
        with self.store.engine.connect() as conn:
            return sorted(r.rater_id for r in conn.execute(
                select(crowd_completions.c.rater_id).join(
                    crowd_participants, crowd_participants.c.rater_id == crowd_completions.c.rater_id)
                .where(crowd_completions.c.study_id == self.study.study_id, crowd_completions.c.platform_id.in_(ids),
                       crowd_participants.c.state.in_(list(states)))))

    def platform_studies(self, states=("checking", "rating")) -> set[str]:
        """The platform's study ids (STUDY_ID) participants in `states` entered with."""
        with self.store.engine.connect() as conn:
            return {r.platform_study for r in conn.execute(
                select(crowd_completions.c.platform_study).join(
                    crowd_participants, crowd_participants.c.rater_id == crowd_completions.c.rater_id)
                .where(crowd_completions.c.study_id == self.study.study_id,
                       crowd_completions.c.platform_study.is_not(None),
                       crowd_participants.c.state.in_(list(states))).distinct())}

    def completions(self) -> list[dict]:
        """The payment export's rows: completed participants with their platform ids (the only reader)."""
        with self.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(
                select(crowd_completions.c.platform_id, crowd_completions.c.platform_study,
                       crowd_completions.c.platform_session, crowd_completions.c.outcome,
                       crowd_completions.c.entered_at, crowd_completions.c.ended_at).where(
                    crowd_completions.c.study_id == self.study.study_id)
                .order_by(crowd_completions.c.entered_at)).mappings()]


def rater_page_admits(store: Store, rater_id: str) -> bool:
    """Whether the rater page may answer this rater: anyone who is not a crowd participant, and a crowd
    participant only inside the study (passed the check: rating, or completed) and not withdrawn. The
    page's defence in depth: a crowd participant gets no link before the check (lifecycle.start_rating)."""
    with store.engine.connect() as conn:
        state = conn.scalar(select(crowd_participants.c.state).where(crowd_participants.c.rater_id == rater_id))
        if state is None:
            return True
        asked = conn.scalar(select(withdrawals.c.receipt).where(withdrawals.c.rater_id == rater_id))
    return state in INSIDE and asked is None


def withdrawn_unsettled(store: Store) -> list[tuple[str, str]]:
    """(study, rater) of crowd participants who asked to withdraw (the page's button, `sense7 raters
    withdraw`) whose crowd rows do not say so yet (lifecycle.withdraw settles them: slots, seat)."""
    with store.engine.connect() as conn:
        return [(r.study_id, r.rater_id) for r in conn.execute(
            select(crowd_participants.c.study_id, crowd_participants.c.rater_id).join(
                withdrawals, withdrawals.c.rater_id == crowd_participants.c.rater_id)
            .where(crowd_participants.c.state != "withdrawn"))]


def free_left_seats(store: Store) -> int:
    """Free the seats still held by participants who ended without completing (rows of older versions,
    which kept them): the cap counts only those inside the study and completed."""
    with store.engine.begin() as conn:
        return conn.execute(update(crowd_participants).where(
            crowd_participants.c.state.in_(LEFT), crowd_participants.c.seat.is_not(None)).values(seat=None)).rowcount
