"""The rater page's data: private links, each rater's queue of tasks and the outbox of submissions.

Nothing here talks to Label Studio or the network: the rater page (sense7.rater_page) reads and writes
these, the delivery job (sense7.tasks.delivery) turns submissions into Label Studio annotations.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import and_, exists, func, select, update

from sense7.data.conversations import profile_task_key
from sense7.store.database import Store
from sense7.store.tables import (conversation_choices, crowd_withdrawn, instructed_answers, provisional_tasks,
                                 rater_links, rater_tasks, submissions, withdrawals, withdrawn_id_hash)

TOKEN_BYTES = 32  # 256 random bits per link


def _now() -> datetime:
    return datetime.now(timezone.utc)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LinkBook:
    """One private, revocable link secret per rater; only its hash is stored."""

    def __init__(self, store: Store):
        self.store = store

    def issue(self, rater_id: str, rotate: bool = False) -> str | None:
        """A new secret for `rater_id` (returned once, never stored), or None when the rater already has an
        active link and `rotate` is False (re-running `raters invite` keeps links that were handed out), or
        when the rater has withdrawn (a withdrawal is final: no rotation or invitation opens anything again,
        and an erased crowd participant's id, kept hashed, gets no link either)."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        row = {"rater_id": rater_id, "token_hash": token_hash(token), "created_at": _now(), "revoked_at": None}
        with self.store.engine.begin() as conn:
            if conn.scalar(select(withdrawals.c.receipt).where(withdrawals.c.rater_id == rater_id)) is not None \
                    or conn.scalar(select(crowd_withdrawn.c.id_hash).where(
                        crowd_withdrawn.c.id_hash == withdrawn_id_hash(rater_id))) is not None:
                return None
            current = conn.execute(select(rater_links).where(rater_links.c.rater_id == rater_id)).mappings().first()
            if current and current["revoked_at"] is None and not rotate:
                return None
            self.store.upsert_rows(conn, rater_links, [row], ["rater_id"])
        return token

    def revoke(self, rater_id: str) -> bool:
        """True when an active link was revoked."""
        with self.store.engine.begin() as conn:
            done = conn.execute(update(rater_links).where(rater_links.c.rater_id == rater_id,
                                                          rater_links.c.revoked_at.is_(None))
                                .values(revoked_at=_now()))
        return bool(done.rowcount)

    def rater_for(self, token: str | None) -> str | None:
        """The rater an active link belongs to; None for an unknown, malformed or revoked one."""
        if not token or len(token) > 100:
            return None
        return self.rater_for_hash(token_hash(token))

    def rater_for_hash(self, wanted: str) -> str | None:
        """The same, from the link's hash (what the rater page's session cookie holds)."""
        if len(wanted) != 64:
            return None
        with self.store.engine.connect() as conn:
            row = conn.execute(select(rater_links.c.rater_id, rater_links.c.token_hash).where(
                rater_links.c.token_hash == wanted, rater_links.c.revoked_at.is_(None))).first()
        # The lookup is by hash; the constant-time compare is belt and braces against timing differences.
        return row.rater_id if row and hmac.compare_digest(row.token_hash, wanted) else None

    def active(self) -> dict[str, datetime]:
        with self.store.engine.connect() as conn:
            return {r.rater_id: r.created_at for r in conn.execute(
                select(rater_links.c.rater_id, rater_links.c.created_at).where(rater_links.c.revoked_at.is_(None)))}


@dataclass(frozen=True)
class QueueItem:
    task_id: int
    kind: str
    position: int
    conversation_id: str | None
    turn_index: int | None
    data: dict
    prediction: dict | None
    answer: dict | None     # the latest answer: this page's last submission, else Label Studio's


class RaterQueue:
    """Each rater's tasks (copied from Label Studio) and their latest answers."""

    def __init__(self, store: Store):
        self.store = store

    def replace(self, rater_id: str, items: list[dict]) -> None:
        """Set `rater_id`'s queue to `items` (dicts with QueueItem's fields but `answer` from Label Studio; a
        task's key in `data["task_key"]`). A provisional task (`provide`) found among them by its key takes
        Label Studio's id, and so do the answers stored under its provisional id (one transaction); one not
        among them stays in the queue as it is (its Label Studio task is not made yet)."""
        found = {(item.get("data") or {}).get("task_key"): item["task_id"] for item in items if item["task_id"] > 0}
        with self.store.engine.begin() as conn:
            # A write first: SQLite's write lock (PostgreSQL's row locks) for the whole transaction, so an answer
            # stored meanwhile under a provisional id waits for it and then finds the id resolved (Outbox.add_next).
            conn.execute(update(provisional_tasks).where(provisional_tasks.c.rater_id == rater_id,
                                                         provisional_tasks.c.task_id.is_(None))
                         .values(rater_id=provisional_tasks.c.rater_id))
            waiting = conn.execute(select(provisional_tasks.c.id, provisional_tasks.c.task_key).where(
                provisional_tasks.c.rater_id == rater_id, provisional_tasks.c.task_id.is_(None))).all()
            kept = []
            for provisional in waiting:
                if found.get(provisional.task_key) is None:
                    kept.append(-provisional.id)
                    continue
                real = int(found[provisional.task_key])
                conn.execute(update(provisional_tasks).where(provisional_tasks.c.id == provisional.id)
                             .values(task_id=real))
                move_answers(conn, rater_id, -provisional.id, real)
            conn.execute(rater_tasks.delete().where(rater_tasks.c.rater_id == rater_id,
                                                    rater_tasks.c.task_id.not_in(kept)))
            rows = [{"rater_id": rater_id, **item} for item in items if item["task_id"] not in kept]
            if rows:
                conn.execute(rater_tasks.insert(), rows)

    def provide(self, rater_id: str, items: list[dict]) -> list[int]:
        """Put tasks that Label Studio does not have yet into the rater's queue (a crowd participant's
        questionnaire at the check: their first page then never waits for the worker), each under the
        provisional id -id of its `provisional_tasks` row; `items`: queue rows (QueueItem's fields but
        `task_id` and `answer`) with the task's key in `data["task_key"]`, the key the task will have in Label
        Studio. Answers to them are stored and kept as any others, and delivered once `replace` has found the
        task in Label Studio. A key provided before is left as it is (idempotent). Returns the ids."""
        from sqlalchemy.exc import IntegrityError

        for _ in range(3):
            ids = []
            try:
                with self.store.engine.begin() as conn:
                    for item in items:
                        key = item["data"]["task_key"]
                        known = conn.execute(select(provisional_tasks.c.id, provisional_tasks.c.task_id)
                                             .where(provisional_tasks.c.task_key == key)).first()
                        if known is not None:
                            ids.append(known.task_id or -known.id)
                            continue
                        made = conn.execute(provisional_tasks.insert().values(
                            rater_id=rater_id, task_key=key, task_id=None, made_at=_now())).inserted_primary_key[0]
                        conn.execute(rater_tasks.insert(), [{"rater_id": rater_id, "answer": None, **item,
                                                             "task_id": -int(made)}])
                        ids.append(-int(made))
                return ids
            except IntegrityError:  # the same key provided at the same moment (a form sent twice): look again
                continue
        raise RuntimeError(f"could not provide {len(items)} tasks for one rater")

    def provide_questionnaire(self, rater_id: str) -> None:
        """The rater's questionnaire in their queue now, under a provisional id until the worker's round makes
        its Label Studio task (`provide`); nothing when their queue holds one already (provided, or copied
        from Label Studio)."""
        with self.store.engine.connect() as conn:
            if conn.scalar(select(select(rater_tasks.c.task_id).where(
                    rater_tasks.c.rater_id == rater_id, rater_tasks.c.kind == "profile").exists())):
                return
        self.provide(rater_id, [{"kind": "profile", "position": -1, "conversation_id": None, "turn_index": None,
                                 "data": {"task_key": profile_task_key(rater_id)}, "prediction": None}])

    def has(self, rater_id: str) -> bool:
        # EXISTS stops at the first row of the rater_id index instead of counting the whole queue
        with self.store.engine.connect() as conn:
            return bool(conn.scalar(select(exists().where(rater_tasks.c.rater_id == rater_id))))

    def items(self, rater_id: str, left_out: bool = False) -> list[QueueItem]:
        """The rater's queue in order (profile first), each with its latest answer; turns of conversations the
        rater left out of the study (sense7.privacy.participation) are not in it (`left_out=True`: they are)."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(rater_tasks).where(rater_tasks.c.rater_id == rater_id)
                                .order_by(rater_tasks.c.position)).mappings().all()
            latest = _latest_answers(conn, rater_id)
            out = set() if left_out else {cid for (cid,) in conn.execute(
                select(conversation_choices.c.conversation_id).where(
                    conversation_choices.c.rater_id == rater_id, conversation_choices.c.in_study.is_(False)))}
        return [QueueItem(r["task_id"], r["kind"], r["position"], r["conversation_id"], r["turn_index"],
                          r["data"], r["prediction"], latest.get(r["task_id"], r["answer"])) for r in rows
                if r["conversation_id"] is None or r["conversation_id"] not in out]


def _latest_answers(conn, rater_id: str) -> dict[int, dict]:
    newest = (select(submissions.c.task_id, func.max(submissions.c.revision).label("revision"))
              .where(submissions.c.rater_id == rater_id).group_by(submissions.c.task_id).subquery())
    rows = conn.execute(select(submissions.c.task_id, submissions.c.answer).join(
        newest, and_(submissions.c.task_id == newest.c.task_id, submissions.c.revision == newest.c.revision))
        .where(submissions.c.rater_id == rater_id))
    return {r.task_id: r.answer for r in rows}


def move_answers(conn, rater_id: str, old: int, new: int) -> None:
    """The rater's answers stored under task id `old` (a provisional id) now under `new` (Label Studio's):
    submissions (their key names the task) and instructed answers."""
    for row in conn.execute(select(submissions.c.key, submissions.c.kind, submissions.c.revision).where(
            submissions.c.rater_id == rater_id, submissions.c.task_id == old)).all():
        conn.execute(update(submissions).where(submissions.c.key == row.key).values(
            task_id=new, key=f"{rater_id}:{row.kind}:{new}:{row.revision}"))
    conn.execute(update(instructed_answers).where(instructed_answers.c.rater_id == rater_id,
                                                  instructed_answers.c.task_id == old).values(task_id=new))


def resolved_task(conn, task_id: int, lock: bool = False) -> int:
    """Label Studio's id for a provisional task id once its task exists (the id itself otherwise, and for
    any id that is not provisional). `lock`: take the provisional row's lock first (a write: SQLite's write
    lock), so that a `RaterQueue.replace` resolving it either finished before or waits until this
    transaction ends."""
    if task_id >= 0:
        return task_id
    row = provisional_tasks.c.id == -task_id
    if lock:
        conn.execute(update(provisional_tasks).where(row).values(rater_id=provisional_tasks.c.rater_id))
    return int(conn.scalar(select(provisional_tasks.c.task_id).where(row)) or task_id)


class Outbox:
    """Submissions kept durably until Label Studio has them; delivery is idempotent per key."""

    def __init__(self, store: Store):
        self.store = store

    def add_next(self, rater_id: str, kind: str, task_id: int, result: list[dict], answer: dict,
                 lead_time: float | None, attempts: int = 5) -> int | None:
        """Store `answer` as the next revision of (rater, task) unless it equals the latest stored one;
        returns the revision stored, None for a repeat (a double click, a resent form, a stale page).

        A compare-and-set on the key rater:kind:task:revision: the latest revision and its answer are read,
        and revision latest + 1 is inserted; if another post inserted it first, the key refuses ours and the
        comparison is made again against that one. So eight identical posts racing store one revision, and
        two different ones store two, in some order (never a read of a stale copy, then a write)."""
        from sqlalchemy.exc import IntegrityError

        for _ in range(attempts):
            with self.store.engine.connect() as conn:
                task_id = resolved_task(conn, task_id)  # a form shown before its task existed in Label Studio
                latest = conn.execute(select(submissions.c.revision, submissions.c.answer).where(
                    submissions.c.rater_id == rater_id, submissions.c.task_id == task_id)
                    .order_by(submissions.c.revision.desc()).limit(1)).first()
            if latest is not None and latest.answer == answer:
                return None
            revision = (latest.revision if latest else 0) + 1
            row = {"key": f"{rater_id}:{kind}:{task_id}:{revision}", "rater_id": rater_id, "kind": kind,
                   "task_id": task_id, "revision": revision, "result": result, "answer": answer,
                   "lead_time": lead_time, "submitted_at": _now(), "delivered_at": None, "annotation_id": None,
                   "attempts": 0, "last_error": None}
            try:
                with self.store.engine.begin() as conn:
                    if resolved_task(conn, task_id, lock=True) != task_id:
                        continue  # its Label Studio task was found meanwhile: store it under that id
                    conn.execute(submissions.insert(), [row])
            except IntegrityError:  # another post took this revision: compare with it
                continue
            return revision
        raise RuntimeError(f"could not store a revision of task {task_id} after {attempts} concurrent attempts")

    def revision(self, rater_id: str, task_id: int) -> int:
        """The latest stored revision of this rater's answer to the task (0: none yet)."""
        with self.store.engine.connect() as conn:
            return int(conn.scalar(select(func.max(submissions.c.revision)).where(
                submissions.c.rater_id == rater_id, submissions.c.task_id == task_id)) or 0)

    def undelivered(self, limit: int = 500) -> list[dict]:
        """The newest undelivered revision per (rater, task), oldest first (older revisions ride along).
        One query with the limit in it: a backlog of thousands costs one page per delivery round."""
        # (a task with a provisional id is not in Label Studio yet: RaterQueue.replace gives its answers the real id)
        waiting = and_(submissions.c.delivered_at.is_(None), submissions.c.task_id > 0)
        newest = (select(submissions.c.rater_id, submissions.c.task_id,
                         func.max(submissions.c.revision).label("revision"))
                  .where(waiting).group_by(submissions.c.rater_id, submissions.c.task_id).subquery())
        query = (select(submissions).join(newest, and_(submissions.c.rater_id == newest.c.rater_id,
                                                       submissions.c.task_id == newest.c.task_id,
                                                       submissions.c.revision == newest.c.revision))
                 .where(waiting).order_by(submissions.c.submitted_at, submissions.c.key).limit(limit))
        with self.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def mark_delivered(self, rater_id: str, task_id: int, revision: int, annotation_id: int) -> None:
        """This revision and every older one of (rater, task) are in Label Studio (older ones superseded)."""
        with self.store.engine.begin() as conn:
            conn.execute(update(submissions).where(
                submissions.c.rater_id == rater_id, submissions.c.task_id == task_id,
                submissions.c.revision <= revision, submissions.c.delivered_at.is_(None))
                .values(delivered_at=_now(), annotation_id=annotation_id))

    def mark_attempt(self, key: str) -> None:
        """Counted before Label Studio is called: a later attempt knows an earlier one may have landed."""
        with self.store.engine.begin() as conn:
            conn.execute(update(submissions).where(submissions.c.key == key).values(
                attempts=submissions.c.attempts + 1))

    def annotation_of(self, rater_id: str, task_id: int) -> int | None:
        """The Label Studio annotation an earlier revision of this answer became, if any."""
        with self.store.engine.connect() as conn:
            return conn.scalar(select(submissions.c.annotation_id).where(
                submissions.c.rater_id == rater_id, submissions.c.task_id == task_id,
                submissions.c.annotation_id.is_not(None)).limit(1))

    def revisions(self, rater_id: str | None = None, task_id: int | None = None,
                  task_ids: list[int] | None = None) -> dict[tuple[str, int], list[dict]]:
        """(rater, task) -> every submitted revision, oldest first (revision, kind, result, lead_time,
        submitted_at, delivered_at, annotation_id): what the sync checks an annotation credited to a rater
        against."""
        query = select(submissions.c.rater_id, submissions.c.task_id, submissions.c.revision, submissions.c.kind,
                       submissions.c.result, submissions.c.lead_time, submissions.c.submitted_at,
                       submissions.c.delivered_at, submissions.c.annotation_id).order_by(submissions.c.revision)
        if rater_id is not None:
            query = query.where(submissions.c.rater_id == rater_id)
        if task_id is not None:
            query = query.where(submissions.c.task_id == task_id)
        if task_ids is not None:  # (the sync's batch: at most a few hundred ids)
            query = query.where(submissions.c.task_id.in_([int(t) for t in task_ids]))
        found: dict[tuple[str, int], list[dict]] = {}
        with self.store.engine.connect() as conn:
            for row in conn.execute(query).mappings():
                found.setdefault((row["rater_id"], row["task_id"]), []).append(dict(row))
        return found

    def page_seconds(self) -> dict[int, float | None]:
        """annotation_id -> the seconds the rater page measured for the newest revision delivered as that
        annotation (None: not measured): a rater's own time on a rating given on the page, whatever Label
        Studio's lead_time says since (sense7.research.study_analysis reads rater quality from it)."""
        query = (select(submissions.c.annotation_id, submissions.c.lead_time)
                 .where(submissions.c.delivered_at.is_not(None), submissions.c.annotation_id.is_not(None),
                        submissions.c.kind == "rating")
                 .order_by(submissions.c.revision))
        with self.store.engine.connect() as conn:
            return {annotation: seconds for annotation, seconds in conn.execute(query)}

    def mark_failed(self, key: str, error: str) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(update(submissions).where(submissions.c.key == key).values(last_error=error[:300]))

    def has_deliverable(self) -> bool:
        """Whether any submission waits for delivery that delivery can write now (its task exists in Label
        Studio): one EXISTS query, for a caller that only decides whether to ask for delivery."""
        waiting = select(submissions.c.key).where(submissions.c.delivered_at.is_(None), submissions.c.task_id > 0)
        with self.store.engine.connect() as conn:
            return bool(conn.scalar(select(waiting.exists())))

    def counts(self) -> dict[str, int]:
        """Submissions in all; `undelivered`: those delivery can write now; `provisional`: those waiting for
        their task to exist in Label Studio (RaterQueue.provide)."""
        waiting = submissions.c.delivered_at.is_(None)
        with self.store.engine.connect() as conn:
            total = conn.scalar(select(func.count()).select_from(submissions))
            deliverable = conn.scalar(select(func.count()).select_from(submissions)
                                      .where(waiting, submissions.c.task_id > 0))
            provisional = conn.scalar(select(func.count()).select_from(submissions)
                                      .where(waiting, submissions.c.task_id < 0))
        return {"submissions": int(total), "undelivered": int(deliverable), "provisional": int(provisional)}

    def timings(self):
        """Per (rater, task) answered on the rater page: rater_id, task_id, revisions, first_submitted_at,
        last_submitted_at (UTC), seconds (the page's time on the task for the newest revision, None when
        unknown) and seconds_total (summed over revisions): the page's own timing of each answer."""
        import pandas as pd

        query = select(submissions.c.rater_id, submissions.c.task_id, submissions.c.revision,
                       submissions.c.submitted_at, submissions.c.lead_time).where(submissions.c.kind == "rating")
        with self.store.engine.connect() as conn:
            rows = pd.DataFrame(conn.execute(query).all(),
                                columns=["rater_id", "task_id", "revision", "submitted_at", "lead_time"])
        columns = ["rater_id", "task_id", "revisions", "first_submitted_at", "last_submitted_at", "seconds",
                   "seconds_total"]
        if rows.empty:
            return pd.DataFrame(columns=columns)
        rows["submitted_at"] = pd.to_datetime(rows["submitted_at"], utc=True)
        rows = rows.sort_values(["rater_id", "task_id", "revision"])
        grouped = rows.groupby(["rater_id", "task_id"], sort=False)
        out = grouped.agg(revisions=("revision", "size"), first_submitted_at=("submitted_at", "min"),
                          last_submitted_at=("submitted_at", "max"),
                          seconds_total=("lead_time", lambda s: s.sum(min_count=1))).reset_index()
        newest = rows.drop_duplicates(["rater_id", "task_id"], keep="last")[["rater_id", "task_id", "lead_time"]]
        return out.merge(newest.rename(columns={"lead_time": "seconds"}), on=["rater_id", "task_id"])[columns]

    def delivered(self, rater_id: str | None = None) -> list[dict]:
        query = select(submissions).where(submissions.c.delivered_at.is_not(None))
        if rater_id is not None:
            query = query.where(submissions.c.rater_id == rater_id)
        with self.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query.order_by(submissions.c.submitted_at)).mappings()]


class InstructedAnswers:
    """Answers to instructed-response items (sense7.taxonomy.InstructedItem), latest per (rater, task)."""

    def __init__(self, store: Store):
        self.store = store

    def record(self, rater_id: str, task_id: int, item: str, answered: int, expected: int) -> None:
        row = {"rater_id": rater_id, "task_id": task_id, "item": item, "answered": int(answered),
               "expected": int(expected), "answered_at": _now()}
        with self.store.engine.begin() as conn:
            self.store.upsert_rows(conn, instructed_answers, [row], ["rater_id", "task_id"])

    def frame(self):
        """rater_id, task_id, item, answered, expected (sense7.research.quality's `instructed` input)."""
        import pandas as pd

        with self.store.engine.connect() as conn:
            rows = conn.execute(select(instructed_answers.c.rater_id, instructed_answers.c.task_id,
                                       instructed_answers.c.item, instructed_answers.c.answered,
                                       instructed_answers.c.expected)).all()
        return pd.DataFrame(rows, columns=["rater_id", "task_id", "item", "answered", "expected"])
