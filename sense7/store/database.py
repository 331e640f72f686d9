"""sense7's own store (`Store`, over the tables of `sense7.store.tables`): rater traits, conversation contexts
and texts, synced annotations and ratings.

SQLite by default, PostgreSQL when SENSE7_STORE_URL says so. Every write is an idempotent upsert, so a
retried job or a webhook delivered three times leaves one row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from sqlalchemy import Table, create_engine, delete, select, update
from sqlalchemy.engine import Engine

from sense7.data.conversations import Conversation, Message
from sense7.files import create_private_file
from sense7.store.tables import (accepted_versions, annotations, contexts, conversations, imported_ratings, metadata,
                                 raters, rating_history, ratings, staff_log)

RATING_COLUMNS = ["conversation_id", "turn_index", "rater_id", "dimension", "rating"]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def staff_user() -> str:
    """The operating-system user running this command (the staff log's `actor`, a withdrawal's requester)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        return "unknown"


def _version(state: dict) -> dict:
    """The part of an annotation's state (or of a held version) a sync compares: {"values", "expectation",
    "comment", "cancelled", "author"} and "lead_time" when the state has it (sense7.labelstudio.label_sync)."""
    version = {"values": {k: int(v) for k, v in sorted((state.get("values") or {}).items())},
               "expectation": state.get("expectation"), "comment": state.get("comment"),
               "cancelled": bool(state.get("cancelled")), "author": state.get("author")}
    return {**version, "lead_time": state["lead_time"]} if "lead_time" in state else version


def log_staff_entry(engine: Engine, action: str, **detail) -> None:
    """One staff-log line in the store of `engine`, without opening it as a `Store` (which would upgrade it):
    `sense7 backup` records itself so, leaving the schema as it found it."""
    with engine.begin() as conn:
        conn.execute(staff_log.insert().values(at=_now(), actor=staff_user(), action=action, detail=detail))


class Store:
    """Thin, explicit data access; no ORM sessions to leak between threads or Celery tasks."""

    def __init__(self, url: str, engine: Engine | None = None):
        self.url = url
        self.engine = engine or create_engine(url, future=True, pool_pre_ping=True)
        if self.engine.dialect.name == "sqlite":
            from sqlalchemy import event

            database = self.engine.url.database
            if database and database != ":memory:" and not database.startswith("file:") \
                    and Path(database).parent.is_dir():
                # A new store file is its owner's only, whatever the umask of the process that opens it first
                # (a benchmark's or a test's, not only the sense7 command's 077): it holds traits and texts.
                create_private_file(Path(database))

            @event.listens_for(self.engine, "connect")
            def _sqlite_pragmas(dbapi_conn, _record):  # WAL: readers (backend) never block the syncer
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA busy_timeout=10000")
                cur.close()
        self.upgraded = self._upgrade()

    def _upgrade(self):
        """Bring the store to the newest schema revision (sense7.store.migrations: once, under a lock, whoever
        starts first); an existing store's upgrade is a staff-log entry. StoreTooNewError for a newer store."""
        from sense7.store.migrations import upgrade

        done = upgrade(self.engine)
        if done is not None and done.had_tables:
            self.log_staff("store upgrade", from_revision=done.from_revision, to_revision=done.to_revision)
        return done

    # -- generic upsert ------------------------------------------------------------------------------
    def upsert_rows(self, conn, table: Table, rows: list[dict], keys: list[str], keep_existing: bool = False) -> None:
        """Insert `rows` into one of the store's tables in `conn`'s transaction; a row whose keys exist updates
        it, or is skipped with `keep_existing` (first write wins: e.g. the prediction made before a rater saw
        the task). The store's own methods and its tables' owners (sense7.store.study_design,
        .rater_page_tables) use it."""
        if not rows:
            return
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(table).values(rows)
        updates = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_=updates) if updates and not keep_existing else \
            stmt.on_conflict_do_nothing(index_elements=keys)
        conn.execute(stmt)

    # -- raters --------------------------------------------------------------------------------------
    def upsert_raters(self, rows: Iterable[dict]) -> tuple[int, int]:
        """rows: {"rater_id", "email" (optional), "traits": {...}}. Returns (inserted, updated); rows
        whose content did not change are not rewritten."""
        rows = [{"rater_id": r["rater_id"], "email": (r.get("email") or "").strip().lower() or None,
                 "traits": r.get("traits") or {}, "updated_at": _now()} for r in rows]
        with self.engine.begin() as conn:
            existing = {row.rater_id: (row.email, row.traits) for row in conn.execute(
                select(raters.c.rater_id, raters.c.email, raters.c.traits).where(
                    raters.c.rater_id.in_([r["rater_id"] for r in rows])))}
            changed = [r for r in rows if existing.get(r["rater_id"]) != (r["email"], r["traits"])]
            self.upsert_rows(conn, raters, changed, ["rater_id"])
        inserted = sum(r["rater_id"] not in existing for r in changed)
        return inserted, len(changed) - inserted

    def update_traits(self, rater_id: str, answers: dict) -> None:
        """Merge questionnaire answers into a rater's traits (creates the rater if needed)."""
        with self.engine.begin() as conn:
            row = conn.execute(select(raters).where(raters.c.rater_id == rater_id)).mappings().first()
            traits = dict(row["traits"]) if row else {}
            traits.update(answers)
            self.upsert_rows(conn, raters, [{"rater_id": rater_id, "email": row["email"] if row else None,
                                         "traits": traits, "updated_at": _now()}], ["rater_id"])

    def raters_frame(self, rater_ids: Iterable[str] | None = None) -> pd.DataFrame:
        """Raw profile answers, one row per rater (index rater_id). Emails are not included."""
        query = select(raters.c.rater_id, raters.c.traits)
        if rater_ids is not None:
            query = query.where(raters.c.rater_id.in_(list(rater_ids)))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        frame = pd.DataFrame([{"rater_id": rid, **(traits or {})} for rid, traits in rows])
        if frame.empty:
            return pd.DataFrame(index=pd.Index([], name="rater_id"))
        return frame.set_index("rater_id")

    def add_raters(self, rater_ids: Iterable[str]) -> None:
        """Create the raters not in the store yet (no email, no traits); existing ones are left as they are."""
        rows = [{"rater_id": rid, "email": None, "traits": {}, "updated_at": _now()}
                for rid in dict.fromkeys(rater_ids)]
        if rows:
            with self.engine.begin() as conn:
                self.upsert_rows(conn, raters, rows, ["rater_id"], keep_existing=True)

    def rater_emails(self, every_rater: bool = False, rater_ids: Iterable[str] | None = None
                     ) -> dict[str, str | None]:
        """rater_id -> email of the raters with one (`every_rater`: of every rater, None when unknown);
        `rater_ids`: of these raters only (those in the store)."""
        query = select(raters.c.rater_id, raters.c.email)
        if rater_ids is not None:
            query = query.where(raters.c.rater_id.in_(list(rater_ids)))
        with self.engine.connect() as conn:
            return {rid: email for rid, email in conn.execute(
                query if every_rater else query.where(raters.c.email.is_not(None)))}

    # -- conversations and contexts ------------------------------------------------------------------
    def upsert_conversations(self, items: Iterable[Conversation]) -> None:
        convs, ctxs = {}, {}
        for conv in items:
            convs[conv.conversation_id] = {
                "conversation_id": conv.conversation_id,
                "messages": [{"role": m.role, "content": m.content} for m in conv.messages]}
            if conv.context:
                ctxs[(conv.conversation_id, conv.rater_id)] = {
                    "conversation_id": conv.conversation_id, "rater_id": conv.rater_id, "context": conv.context}
        with self.engine.begin() as conn:
            for chunk in _chunks(list(convs.values()), 500):
                self.upsert_rows(conn, conversations, chunk, ["conversation_id"])
            for chunk in _chunks(list(ctxs.values()), 500):
                self.upsert_rows(conn, contexts, chunk, ["conversation_id", "rater_id"])

    def contexts_for(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        pairs = set(pairs)
        if not pairs:
            return {}
        ids = {cid for cid, _ in pairs}
        with self.engine.connect() as conn:
            rows = conn.execute(select(contexts).where(contexts.c.conversation_id.in_(list(ids)))).all()
        return {(r.conversation_id, r.rater_id): r.context for r in rows if (r.conversation_id, r.rater_id) in pairs}

    def conversations_by_id(self) -> dict[str, list[Message]]:
        with self.engine.connect() as conn:
            return {cid: [Message(m["role"], m["content"]) for m in msgs]
                    for cid, msgs in conn.execute(select(conversations.c.conversation_id, conversations.c.messages))}

    # -- annotations and ratings -----------------------------------------------------------------------
    def upsert_annotation(self, annotation_id: int, task_id: int, conversation_id: str, turn_index: int | None,
                          rater_id: str | None, updated_at: str, values: dict[str, int],
                          expectation: str | None = None, comment: str | None = None, *,
                          author_id: int | None = None, changed_by: int | None = None,
                          quarantine: str | None = None, lead_time: float | None = None,
                          created_at: str | None = None, repeat_of: str | None = None,
                          held: dict | None = None, via: str | None = None) -> bool:
        """Insert or update one annotation with its ratings, keeping the change in the history. Returns
        False when nothing changed (the same or an older version was already stored), so a replayed
        webhook is a no-op. `quarantine`: why no rater is credited (then rater_id must be None). `held`:
        the version Label Studio holds when it is not what counts (see the `held` column); `values` are
        then what counts. `via`: who wrote the change (the history's `via`)."""
        with self.engine.begin() as conn:
            current = conn.execute(select(annotations.c.updated_at, annotations.c.deleted, annotations.c.rater_id,
                                          annotations.c.quarantine, annotations.c.held)
                                   .where(annotations.c.annotation_id == annotation_id)).first()
            if (current and not current.deleted and current.updated_at >= updated_at and current.rater_id == rater_id
                    and current.quarantine == quarantine and current.held == held):
                return False
            old = self._state(conn, annotation_id) if current and not current.deleted else None
            self.upsert_rows(conn, annotations, [{
                "annotation_id": annotation_id, "task_id": task_id, "conversation_id": conversation_id,
                "turn_index": turn_index, "rater_id": rater_id, "updated_at": updated_at,
                "expectation": expectation, "comment": comment, "deleted": False, "author_id": author_id,
                "quarantine": quarantine, "lead_time": lead_time, "created_at": created_at,
                "repeat_of": repeat_of, "held": held}], ["annotation_id"])
            conn.execute(delete(ratings).where(ratings.c.annotation_id == annotation_id))
            if values:
                conn.execute(ratings.insert(), [{"annotation_id": annotation_id, "control": k, "value": int(v)}
                                                for k, v in values.items()])
            new = {"values": {k: int(v) for k, v in sorted(values.items())}, "expectation": expectation,
                   "comment": comment, "rater_id": rater_id, "quarantine": quarantine, "author_id": author_id,
                   "held": held, "lead_time": lead_time}
            if old != new:
                conn.execute(rating_history.insert().values(
                    annotation_id=annotation_id, task_id=task_id, change="updated" if old else "created",
                    changed_by=changed_by if changed_by is not None else author_id, changed_at=_now(),
                    ls_updated_at=updated_at, old=old, new=new, via=via))
        return True

    @staticmethod
    def _state(conn, annotation_id: int) -> dict | None:
        row = conn.execute(select(annotations).where(annotations.c.annotation_id == annotation_id)).mappings().first()
        if row is None:
            return None
        values = dict(conn.execute(select(ratings.c.control, ratings.c.value)
                                   .where(ratings.c.annotation_id == annotation_id)).all())
        return {"values": {k: int(v) for k, v in sorted(values.items())}, "expectation": row["expectation"],
                "comment": row["comment"], "rater_id": row["rater_id"], "quarantine": row["quarantine"],
                "author_id": row["author_id"], "held": row["held"], "lead_time": row["lead_time"]}

    def has_ratings_from(self, conversation_id: str, message_index: int) -> bool:
        """Whether a turn of the conversation at or after `message_index` has a live or imported rating."""
        with self.engine.connect() as conn:
            synced = conn.scalar(select(annotations.c.annotation_id).where(
                annotations.c.conversation_id == conversation_id, annotations.c.deleted.is_(False),
                annotations.c.turn_index >= message_index).limit(1))
            imported = conn.scalar(select(imported_ratings.c.rater_id).where(
                imported_ratings.c.conversation_id == conversation_id,
                imported_ratings.c.turn_index >= message_index).limit(1))
        return synced is not None or imported is not None

    def delete_annotation(self, annotation_id: int, changed_by: int | None = None) -> bool:
        """Mark an annotation deleted (its rows stay, and the history keeps what it said)."""
        with self.engine.begin() as conn:
            old = self._state(conn, annotation_id)
            result = conn.execute(update(annotations).where(annotations.c.annotation_id == annotation_id,
                                                            annotations.c.deleted.is_(False)).values(deleted=True))
            if result.rowcount:
                task_id = conn.scalar(select(annotations.c.task_id).where(annotations.c.annotation_id == annotation_id))
                conn.execute(rating_history.insert().values(
                    annotation_id=annotation_id, task_id=task_id, change="deleted", changed_by=changed_by,
                    changed_at=_now(), old=old, new=None, via="label studio"))
        return result.rowcount > 0

    def history(self, annotation_id: int | None = None, rater_id: str | None = None,
                change_id: int | None = None) -> list[dict]:
        """Changes of synced ratings, oldest first (filtered by annotation, by rater before or after the
        change, or one change by its id)."""
        query = select(rating_history).order_by(rating_history.c.id)
        if annotation_id is not None:
            query = query.where(rating_history.c.annotation_id == annotation_id)
        if change_id is not None:
            query = query.where(rating_history.c.id == change_id)
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        if rater_id is not None:
            rows = [r for r in rows if rater_id in ((r["old"] or {}).get("rater_id"), (r["new"] or {}).get("rater_id"))]
        return rows

    def log_staff(self, action: str, **detail) -> None:
        log_staff_entry(self.engine, action, **detail)

    def staff_entries(self) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(staff_log).order_by(staff_log.c.id)).mappings()]

    def quarantined(self) -> list[dict]:
        """Live annotations credited to nobody, with the reason."""
        query = (select(annotations.c.annotation_id, annotations.c.task_id, annotations.c.conversation_id,
                        annotations.c.turn_index, annotations.c.author_id, annotations.c.quarantine)
                 .where(annotations.c.deleted.is_(False), annotations.c.quarantine.is_not(None))
                 .order_by(annotations.c.annotation_id))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def held(self) -> list[dict]:
        """Live annotations whose Label Studio version is not counted as their rater's (written there, not by
        the rater page): annotation_id, task_id, conversation_id, turn_index, rater_id (credited now, None
        when quarantined), held ({"rater_id" claimed, "values", ..., "changed_by", "reason"})."""
        query = (select(annotations.c.annotation_id, annotations.c.task_id, annotations.c.conversation_id,
                        annotations.c.turn_index, annotations.c.rater_id, annotations.c.held)
                 .where(annotations.c.deleted.is_(False), annotations.c.held.is_not(None))
                 .order_by(annotations.c.annotation_id))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings() if r["held"] is not None]

    def accepted_versions(self, annotation_id: int | None = None,
                          annotation_ids: list[int] | None = None) -> dict[int, list[dict]]:
        """annotation_id -> the versions staff accepted for it, oldest first ({"values", "expectation",
        "comment", "rater_id", "accepted_at"}); of one annotation, of `annotation_ids`, or of all."""
        query = select(accepted_versions).order_by(accepted_versions.c.id)
        if annotation_id is not None:
            query = query.where(accepted_versions.c.annotation_id == annotation_id)
        if annotation_ids is not None:
            query = query.where(accepted_versions.c.annotation_id.in_([int(a) for a in annotation_ids]))
        found: dict[int, list[dict]] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(query).mappings():
                found.setdefault(row["annotation_id"], []).append(
                    {**row["version"], "rater_id": row["rater_id"], "accepted_at": row["accepted_at"]})
        return found

    def record_accepted(self, annotation_id: int, rater_id: str, version: dict, actor: str | None = None) -> None:
        """A version counted as `rater_id`'s by a staff decision (a revert of sense7's, say) without a held
        change to move: the sync counts it from now on."""
        with self.engine.begin() as conn:
            conn.execute(accepted_versions.insert().values(
                annotation_id=annotation_id, rater_id=rater_id, version=_version(version), accepted_at=_now(),
                actor=actor or staff_user()))

    def accept_held(self, annotation_ids: list[int]) -> list[dict]:
        """Count each annotation's held Label Studio version as its rater's (`sense7 ratings accept`): all or
        nothing. LookupError (naming the id) for an unknown annotation or one with nothing held. Returns
        what was accepted: annotation_id, rater_id, values, cancelled. Each is a history entry and a
        staff-log line. An accepted cancellation removes the rating (deleted, as a skipped task)."""
        actor = staff_user()
        done = []
        with self.engine.begin() as conn:
            for annotation_id in annotation_ids:
                row = conn.execute(select(annotations).where(annotations.c.annotation_id == annotation_id,
                                                             annotations.c.deleted.is_(False))).mappings().first()
                if row is None:
                    raise LookupError(f"annotation {annotation_id}: not in the store (see `sense7 ratings quarantined`)")
                held = row["held"]
                if not held:
                    why = f"quarantined ({row['quarantine']})" if row["quarantine"] else "already counted as is"
                    raise LookupError(f"annotation {annotation_id}: nothing held to accept: {why}")
                old = self._state(conn, annotation_id)
                values = {k: int(v) for k, v in (held.get("values") or {}).items()}
                timed = {"lead_time": held["lead_time"]} if "lead_time" in held else {}
                conn.execute(update(annotations).where(annotations.c.annotation_id == annotation_id).values(
                    rater_id=held["rater_id"], quarantine=None, held=None, expectation=held.get("expectation"),
                    comment=held.get("comment"), deleted=bool(held.get("cancelled")), **timed))
                conn.execute(delete(ratings).where(ratings.c.annotation_id == annotation_id))
                if values:
                    conn.execute(ratings.insert(), [{"annotation_id": annotation_id, "control": k, "value": v}
                                                    for k, v in values.items()])
                conn.execute(accepted_versions.insert().values(
                    annotation_id=annotation_id, rater_id=held["rater_id"], version=_version(held),
                    accepted_at=_now(), actor=actor))
                new = None if held.get("cancelled") else self._state(conn, annotation_id)
                conn.execute(rating_history.insert().values(
                    annotation_id=annotation_id, task_id=row["task_id"], change="accepted", changed_by=None,
                    changed_at=_now(), ls_updated_at=row["updated_at"], old=old, new=new,
                    via="sense7 ratings accept"))
                conn.execute(staff_log.insert().values(at=_now(), actor=actor, action="ratings accept", detail={
                    "annotation": annotation_id, "rater": held["rater_id"], "changed_by": held.get("changed_by")}))
                done.append({"annotation_id": annotation_id, "rater_id": held["rater_id"], "values": values,
                             "cancelled": bool(held.get("cancelled"))})
        return done

    def annotation_versions(self, include_deleted: bool = False) -> dict[int, str]:
        """annotation_id -> updated_at, for reconciliation against the Label Studio API."""
        query = select(annotations.c.annotation_id, annotations.c.updated_at)
        if not include_deleted:
            query = query.where(annotations.c.deleted.is_(False))
        with self.engine.connect() as conn:
            return dict(conn.execute(query).all())

    def annotation_states(self) -> dict[int, tuple]:
        """annotation_id -> (updated_at, rater_id, quarantine, held) of live annotations: what a sync
        compares against."""
        query = select(annotations.c.annotation_id, annotations.c.updated_at, annotations.c.rater_id,
                       annotations.c.quarantine, annotations.c.held).where(annotations.c.deleted.is_(False))
        with self.engine.connect() as conn:
            return {aid: (updated, rater, quarantine, held) for aid, updated, rater, quarantine, held in conn.execute(query)}

    def ratings_frame(self) -> pd.DataFrame:
        """Long frame of live ratings (deleted annotations excluded): RATING_COLUMNS."""
        query = (select(annotations.c.conversation_id, annotations.c.turn_index, annotations.c.rater_id,
                        ratings.c.control, ratings.c.value)
                 .join(ratings, ratings.c.annotation_id == annotations.c.annotation_id)
                 .where(annotations.c.deleted.is_(False), annotations.c.rater_id.is_not(None),
                        annotations.c.quarantine.is_(None), annotations.c.repeat_of.is_(None)))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        frame = pd.DataFrame(rows, columns=RATING_COLUMNS)
        frame["turn_index"] = frame["turn_index"].astype("Int64")
        return frame

    def import_ratings(self, frame: pd.DataFrame) -> int:
        """Upsert validated ratings.csv rows (sense7.readers.formats.read_ratings). Returns rows written."""
        rows = [{"conversation_id": r.conversation_id, "rater_id": r.rater_id, "dimension": r.dimension,
                 "turn_index": -1 if pd.isna(r.turn_index) else int(r.turn_index), "rating": int(r.rating)}
                for r in frame.itertuples(index=False)]
        with self.engine.begin() as conn:
            for chunk in _chunks(rows, 500):
                self.upsert_rows(conn, imported_ratings, chunk, ["conversation_id", "turn_index", "rater_id", "dimension"])
        return len(rows)

    def imported_frame(self) -> pd.DataFrame:
        with self.engine.connect() as conn:
            frame = pd.DataFrame(conn.execute(select(
                imported_ratings.c.conversation_id, imported_ratings.c.turn_index, imported_ratings.c.rater_id,
                imported_ratings.c.dimension, imported_ratings.c.rating)).all(), columns=RATING_COLUMNS)
        frame["turn_index"] = frame["turn_index"].astype("Int64").mask(frame["turn_index"] == -1)
        return frame

    def expectation_frame(self) -> pd.DataFrame:
        query = (select(annotations.c.conversation_id, annotations.c.turn_index, annotations.c.rater_id,
                        annotations.c.expectation)
                 .where(annotations.c.deleted.is_(False), annotations.c.rater_id.is_not(None),
                        annotations.c.quarantine.is_(None), annotations.c.expectation.is_not(None),
                        annotations.c.repeat_of.is_(None)))
        with self.engine.connect() as conn:
            return pd.DataFrame(conn.execute(query).all(),
                                columns=["conversation_id", "turn_index", "rater_id", "expectation"])

    def rating_data(self, taxonomy):
        """Everything a model needs, as sense7.data.dataset.RatingData: synced annotations plus imported
        ratings (expectation answers included as `expectation_met` rows scored 1..3, as in ratings.csv)."""
        from sense7.data.dataset import RatingData

        frame = self.ratings_frame()
        exp = self.expectation_frame()
        if not exp.empty:
            exp = exp[exp["expectation"].isin(taxonomy.expectation_values)]
            exp = exp.assign(dimension=taxonomy.expectation_key,
                             rating=exp["expectation"].map(taxonomy.expectation_score)).drop(columns="expectation")
            exp["turn_index"] = exp["turn_index"].astype("Int64")
            frame = pd.concat([frame, exp[RATING_COLUMNS]], ignore_index=True)
        imported = self.imported_frame()
        if not imported.empty:
            # A rating synced from Label Studio wins over an imported one for the same turn and control.
            frame = pd.concat([frame, imported], ignore_index=True).drop_duplicates(
                ["conversation_id", "turn_index", "rater_id", "dimension"], keep="first")
        messages = self.conversations_by_id()
        pairs = set(zip(frame["conversation_id"], frame["rater_id"]))
        ctx = self.contexts_for(pairs)
        convs = {(cid, rid): Conversation(cid, rid, messages[cid], ctx.get((cid, rid), {}))
                 for cid, rid in pairs if cid in messages}
        return RatingData(conversations=convs, ratings=frame, raters=self.raters_frame())

    def counts(self) -> dict[str, int]:
        from sqlalchemy import func

        with self.engine.connect() as conn:
            return {
                "raters": conn.scalar(select(func.count()).select_from(raters)),
                "conversations": conn.scalar(select(func.count()).select_from(conversations)),
                "annotations": conn.scalar(select(func.count()).select_from(annotations)
                                           .where(annotations.c.deleted.is_(False))),
                "ratings": conn.scalar(select(func.count()).select_from(ratings).join(
                    annotations, annotations.c.annotation_id == ratings.c.annotation_id)
                    .where(annotations.c.deleted.is_(False))),
                "imported_ratings": conn.scalar(select(func.count()).select_from(imported_ratings)),
                "quarantined": conn.scalar(select(func.count()).select_from(annotations).where(
                    annotations.c.deleted.is_(False), annotations.c.quarantine.is_not(None))),
            }

    def snapshot(self) -> str:
        """A canonical dump of every table, for tests that prove a failed command changed nothing."""
        out = {}
        with self.engine.connect() as conn:
            for table in metadata.sorted_tables:
                rows = [dict(r) for r in conn.execute(select(table)).mappings()]
                if table is raters:  # the upsert time changes on a no-op re-import; the content does not
                    for r in rows:
                        r.pop("updated_at")
                for r in rows:  # a blob (a model version's bundle) by its SHA-256: PostgreSQL returns memoryviews
                    r.update({k: "sha256:" + hashlib.sha256(bytes(v)).hexdigest() for k, v in r.items()
                              if isinstance(v, (bytes, memoryview))})
                out[table.name] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
        return json.dumps(out, sort_keys=True)


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]
