"""Who entered a crowd study, under which pseudonymous id, and how far they got.

- The rater id is a keyed hash (HMAC-SHA-256) of the platform id with the study's secret (a 0600 file under
  SENSE7_HOME/secrets, `sense7.settings.local_secret`): the same participant always gets the same id, so a
  platform id never gets a second assignment, and without the secret nobody can tell whose id it is.
- The platform id itself is kept in one table only, `crowd_completions`, which `sense7 crowd completions`
  exports for approving payments. It never reaches Label Studio, task data, logs or another export.
- A resume code (short, random, shown once; only its SHA-256 is stored) lets a participant continue in
  another browser; the platform id alone never opens anyone's session.
- States: declined (the consent answer only), checking, rating, completed, screened_out (failed the
  comprehension check twice: asked to return their submission, never rejected), abandoned (lease
  expired), full (no slot left when they passed the check).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from sense7.crowd.study import CrowdStudy
from sense7.data.store import Store, crowd_completions, crowd_participants, crowd_pool, crowd_studies
from sense7.settings import local_secret

PLATFORM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # Prolific's are 24 hex digits; never stored elsewhere
RESUME_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L, U: read aloud and typed without doubt
RESUME_LENGTH = 10  # ~49 bits; guesses are rate-limited per address
CHECK_ATTEMPTS = 2
STATES = ("declined", "checking", "rating", "completed", "screened_out", "abandoned", "full")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def valid_platform_id(value) -> bool:
    return isinstance(value, str) and bool(PLATFORM_ID.fullmatch(value))


def study_secret(home, study_id: str) -> str:
    """The study's key of pseudonymous ids (0600 under SENSE7_HOME/secrets, made once)."""
    return local_secret(home, f"crowd_{study_id}")


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
        from sense7.data.store import contexts as conversation_contexts
        from sense7.data.store import conversations as conversation_texts

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
            # The pool's owner keeps a context row: erasing a participant (sense7.data.participation) then
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
    state: str
    check_attempts: int
    lease_until: datetime | None


class CapReached(Exception):
    """The study's participant cap is reached: no new entries."""


class AlreadyEntered(Exception):
    """This platform id has entered the study before (whatever came of it)."""


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
        return Participant(row["rater_id"], row["study_id"], row["state"], row["check_attempts"],
                           row["lease_until"]) if row else None

    def seated(self) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(crowd_participants).where(
                crowd_participants.c.study_id == self.study.study_id, crowd_participants.c.seat.is_not(None))))

    def decline(self, rater_id: str) -> None:
        """The consent answer 'no' with its version and time, and nothing else (no platform id)."""
        row = {"rater_id": rater_id, "study_id": self.study.study_id, "state": "declined", "seat": None,
               "consent": "declined", "consent_version": self.study.consent_version, "consent_at": _now(),
               "resume_hash": None, "check_attempts": 0, "lease_until": None, "ended_at": _now()}
        try:
            with self.store.engine.begin() as conn:
                conn.execute(crowd_participants.insert(), [row])
        except IntegrityError:
            raise AlreadyEntered() from None

    def agree(self, rater_id: str, platform: dict, attempts: int = 50) -> str:
        """Seat a participant who agreed (atomically against the cap: seat numbers are unique per study);
        returns their resume code (shown once). Raises CapReached or AlreadyEntered. `platform`:
        {"platform_id", "platform_study", "platform_session"}, kept in crowd_completions only."""
        code = new_resume_code()
        for _ in range(attempts):
            seat = self.seated()
            if seat >= self.study.participant_cap:
                raise CapReached()
            now = _now()
            row = {"rater_id": rater_id, "study_id": self.study.study_id, "state": "checking", "seat": seat,
                   "consent": "agreed", "consent_version": self.study.consent_version, "consent_at": now,
                   "resume_hash": code_hash(self.study.study_id, code), "check_attempts": 0,
                   "lease_until": None, "ended_at": None}
            try:
                with self.store.engine.begin() as conn:
                    if conn.scalar(select(func.count()).select_from(crowd_participants)
                                   .where(crowd_participants.c.rater_id == rater_id)):
                        raise AlreadyEntered()
                    conn.execute(crowd_participants.insert(), [row])
                    conn.execute(crowd_completions.insert(), [{
                        "rater_id": rater_id, "study_id": self.study.study_id, "outcome": "entered",
                        "entered_at": now, "ended_at": None, **platform}])
            except (IntegrityError, OperationalError):
                if self.get(rater_id) is not None:
                    raise AlreadyEntered() from None
                continue  # another entry took this seat: count again
            return code
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

    def move(self, rater_id: str, before: str, after: str, **values) -> bool:
        """Change state `before` -> `after` (compare-and-set: False when the participant was not in
        `before`, e.g. a replayed form); ending states also close the completions row."""
        ended = after in ("completed", "screened_out", "abandoned", "full")
        with self.store.engine.begin() as conn:
            done = conn.execute(update(crowd_participants).where(
                crowd_participants.c.rater_id == rater_id, crowd_participants.c.state == before,
                crowd_participants.c.study_id == self.study.study_id)
                .values(state=after, **({"ended_at": _now()} if ended else {}), **values))
            if done.rowcount and ended:
                conn.execute(update(crowd_completions).where(crowd_completions.c.rater_id == rater_id)
                             .values(outcome=after, ended_at=_now()))
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
                        **({"ended_at": _now()} if state == "screened_out" else {})))
            if done.rowcount and state == "screened_out":
                conn.execute(update(crowd_completions).where(crowd_completions.c.rater_id == rater_id)
                             .values(outcome="screened_out", ended_at=_now()))
        return state if done.rowcount else None

    def counts(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            found = dict(conn.execute(select(crowd_participants.c.state, func.count()).where(
                crowd_participants.c.study_id == self.study.study_id).group_by(crowd_participants.c.state)).all())
        return {state: int(found.get(state, 0)) for state in STATES}

    def completions(self) -> list[dict]:
        """The payment export's rows: completed participants with their platform ids (the only reader)."""
        with self.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(
                select(crowd_completions.c.platform_id, crowd_completions.c.platform_study,
                       crowd_completions.c.platform_session, crowd_completions.c.outcome,
                       crowd_completions.c.entered_at, crowd_completions.c.ended_at).where(
                    crowd_completions.c.study_id == self.study.study_id)
                .order_by(crowd_completions.c.entered_at)).mappings()]
