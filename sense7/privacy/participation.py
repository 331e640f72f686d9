"""Participants' rights in the store: their choices per conversation, and withdrawal with erasure.

- `ConversationChoices`: on the rater page a participant leaves any of their conversations out of the study
  (not in their queue, never trained on, never released) and/or out of a release (rated, not released). The
  latest choice per (rater, conversation) and when it was made; changeable at any time, a conversation put
  back in the study returns to the queue. What a choice takes out depends on whose the conversation is
  (`conversation_owners`): its owner's takes out the conversation with everyone's ratings of it; anyone
  else's (a rater it was assigned to) only their own ratings of it (`LeftOut`).
- `Withdrawals`: a withdrawal is requested (the rater page's button, or `sense7 raters withdraw`), then
  erased (`erase_rater_rows`, called by sense7.tasks.erasure after Label Studio's side). Until then the row
  names the rater; the erasure's one transaction deletes every row of theirs and leaves a receipt without
  personal data (who asked, when, counts).
- `ERASURE`: how every table of the store is erased. A table the plan does not name stops the erasure
  before anything is deleted (and its test), so a new table is never silently left holding a rater's rows.
- A crowd participant's erasure keeps one thing: the SHA-256 of their pseudonymous id in `crowd_withdrawn`
  (`sense7.store.tables.withdrawn_id_hash`), so that the same platform id is never seated again
  (sense7.crowd.participants).
  The receipt counts it (`crowd_withdrawn_kept`).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import delete, or_, select, update

from sense7.data.items import encoder_texts
from sense7.store import tables
from sense7.store.text_vectors import text_sha256
from sense7.store.database import Store, staff_user

PARTICIPANT = "participant"  # requested_by of a withdrawal asked for on the rater page
REDACTED = "[withdrawn]"


class WithdrawalError(ValueError):
    """One clear line: an unknown rater, a withdrawal already asked for; nothing was changed."""


def _now() -> datetime:
    return datetime.now(timezone.utc)




@dataclass(frozen=True)
class Choice:
    in_study: bool
    in_release: bool
    chosen_at: datetime | None  # None: not chosen yet (the default: in the study and in a release)


class ConversationChoices:
    """What each participant chose for each conversation of theirs."""

    def __init__(self, store: Store):
        self.store = store

    def choose(self, rater_id: str, conversation_id: str, in_study: bool, in_release: bool) -> None:
        """Record a choice (left out of the study implies out of a release)."""
        row = {"rater_id": rater_id, "conversation_id": conversation_id, "in_study": bool(in_study),
               "in_release": bool(in_study and in_release), "chosen_at": _now()}
        with self.store.engine.begin() as conn:
            self.store.upsert_rows(conn, tables.conversation_choices, [row], ["rater_id", "conversation_id"])

    def confirm(self, rater_id: str, conversation_ids) -> int:
        """Record the default (in the study, in a release) for those not chosen yet: the participant saw
        them and went on. Returns how many were recorded."""
        chosen = self.of(rater_id)
        rows = [{"rater_id": rater_id, "conversation_id": cid, "in_study": True, "in_release": True,
                 "chosen_at": _now()} for cid in conversation_ids if cid not in chosen]
        with self.store.engine.begin() as conn:
            self.store.upsert_rows(conn, tables.conversation_choices, rows, ["rater_id", "conversation_id"],
                                   keep_existing=True)
        return len(rows)

    def of(self, rater_id: str) -> dict[str, Choice]:
        t = tables.conversation_choices
        with self.store.engine.connect() as conn:
            return {r.conversation_id: Choice(r.in_study, r.in_release, r.chosen_at) for r in conn.execute(
                select(t).where(t.c.rater_id == rater_id))}

    def out_of_study(self, rater_id: str | None = None) -> set[tuple[str, str]]:
        """(conversation_id, rater_id) pairs left out of the study."""
        t = tables.conversation_choices
        query = select(t.c.conversation_id, t.c.rater_id).where(t.c.in_study.is_(False))
        if rater_id is not None:
            query = query.where(t.c.rater_id == rater_id)
        with self.store.engine.connect() as conn:
            return {(cid, rid) for cid, rid in conn.execute(query)}

    def out_of_release(self) -> "LeftOut":
        """What is not released: conversations their owner left out of a release (or of the study), with
        everyone's ratings of them; and the ratings of a conversation someone else (not its owner) left out
        (only theirs)."""
        t = tables.conversation_choices
        return self._left_out(or_(t.c.in_release.is_(False), t.c.in_study.is_(False)))

    def out_of_training(self) -> "LeftOut":
        """What is not trained on: conversations their owner left out of the study, with everyone's ratings
        of them; and each other rater's own ratings of a conversation they left out of the study."""
        return self._left_out(tables.conversation_choices.c.in_study.is_(False))

    def _left_out(self, condition) -> "LeftOut":
        t = tables.conversation_choices
        with self.store.engine.connect() as conn:
            chosen = {(cid, rid) for cid, rid in conn.execute(select(t.c.conversation_id, t.c.rater_id).where(condition))}
        owners = conversation_owners(self.store, {cid for cid, _ in chosen})
        whole = frozenset(cid for cid, rid in chosen if rid in owners.get(cid, ()))
        return LeftOut(whole, frozenset(pair for pair in chosen if pair[0] not in whole))


@dataclass(frozen=True)
class LeftOut:
    """What participants' choices take out: whole `conversations` (their owner chose) and `ratings`, the
    (conversation_id, rater_id) pairs whose rater chose for a conversation that is not theirs."""

    conversations: frozenset = frozenset()
    ratings: frozenset = frozenset()

    def keeps(self, conversation_id: str, rater_id: str) -> bool:
        return conversation_id not in self.conversations and (conversation_id, rater_id) not in self.ratings


def conversation_owners(store: Store, conversation_ids=None) -> dict[str, set[str]]:
    """Whose each conversation is (None: every conversation): the donor(s) it was imported for.

    - a conversation donated from an export: the rater whose context names its `source`;
    - otherwise: the raters it was imported for (their context row): for a crowd study's pool, the pool's
      rater id (`crowd init` keeps that row); for a staff import, its rater;
    - a conversation with no such row: every rater who has it (their tasks, ratings), as nobody's else.
    A crowd participant never owns one: they were assigned the pool's conversations (their context rows are
    the pool's, copied when their tasks were made)."""
    wanted = None if conversation_ids is None else set(conversation_ids)
    if wanted is not None and not wanted:
        return {}
    donors: dict[str, set[str]] = {}
    imported: dict[str, set[str]] = {}
    holders: dict[str, set[str]] = {}
    # A few chosen conversations (the usual case) are asked for by id, in chunks the database accepts.
    chunks = [None] if wanted is None else [sorted(wanted)[i:i + 500] for i in range(0, len(wanted), 500)]

    def rows(conn, *columns):
        for chunk in chunks:
            query = select(*columns)
            yield from conn.execute(query if chunk is None else query.where(columns[0].in_(chunk)))

    with store.engine.connect() as conn:
        participants = set(conn.execute(select(tables.crowd_participants.c.rater_id)).scalars())
        c = tables.contexts
        for cid, rid, context in rows(conn, c.c.conversation_id, c.c.rater_id, c.c.context):
            if rid not in participants:
                imported.setdefault(cid, set()).add(rid)
                if isinstance(context, dict) and context.get("source"):
                    donors.setdefault(cid, set()).add(rid)
        for table in (tables.rater_tasks, tables.task_arms, tables.annotations, tables.imported_ratings):
            for cid, rid in rows(conn, table.c.conversation_id, table.c.rater_id):
                if rid is not None and cid is not None and rid not in participants and cid not in imported:
                    holders.setdefault(cid, set()).add(rid)
    return {**holders, **imported, **donors}


def drop_left_out(data, store: Store):
    """RatingData without what choices took out of the study (training): a conversation its owner left out,
    with everyone's ratings of it; each other rater's own ratings of a conversation they left out."""
    from dataclasses import replace

    left_out = ConversationChoices(store).out_of_training()
    if not (left_out.conversations or left_out.ratings) or data.ratings.empty:
        return data
    keep = [left_out.keeps(cid, rid) for cid, rid in zip(data.ratings["conversation_id"], data.ratings["rater_id"])]
    return replace(data, ratings=data.ratings[keep])


def study_conversations(conn, rater_id: str) -> set[str]:
    """A crowd participant's pool conversations: the study's, not theirs (they rate them; only the pool's
    owner may leave one out). Empty for anyone who is not a crowd participant."""
    if conn.scalar(select(tables.crowd_participants.c.rater_id).where(
            tables.crowd_participants.c.rater_id == rater_id)) is None:
        return set()
    return {cid for (cid,) in conn.execute(select(tables.crowd_pool.c.conversation_id))}


def rater_conversations(store: Store, rater_id: str) -> list[str]:
    """The conversations that are this rater's (their contexts, their queue, their tasks), in order; a crowd
    study's pool conversations are never a participant's own."""
    found: dict[str, None] = {}
    with store.engine.connect() as conn:
        for table in (tables.rater_tasks, tables.task_arms, tables.contexts):
            for (cid,) in conn.execute(select(table.c.conversation_id).where(
                    table.c.rater_id == rater_id, table.c.conversation_id.is_not(None))):
                found[cid] = None
        pool = study_conversations(conn, rater_id)
    return sorted(c for c in found if c not in pool)


def is_known_rater(store: Store, rater_id: str) -> bool:
    with store.engine.connect() as conn:
        for table in (tables.raters, tables.rater_links, tables.contexts, tables.task_arms, tables.rater_tasks,
                      tables.imported_ratings, tables.crowd_participants):
            if conn.scalar(select(table.c.rater_id).where(table.c.rater_id == rater_id).limit(1)) is not None:
                return True
    return False


class Withdrawals:
    """Withdrawals requested and erased; receipts."""

    def __init__(self, store: Store):
        self.store = store

    def request(self, rater_id: str, requested_by: str) -> str:
        """Record a withdrawal and revoke the rater's link at once, in one transaction; returns the receipt.
        An unknown rater or one already withdrawn: WithdrawalError, nothing changed."""
        t = tables.withdrawals
        with self.store.engine.begin() as conn:
            pending = conn.execute(select(t.c.requested_at).where(t.c.rater_id == rater_id)).first()
            if pending is not None:
                asked = f"{pending.requested_at:%Y-%m-%d %H:%M}"
                raise WithdrawalError(f"rater {rater_id}: already withdrawn (asked {asked} UTC, waiting for "
                                      "`sense7 raters erase --confirm`); nothing changed")
            if not is_known_rater(self.store, rater_id):
                raise WithdrawalError(f"rater {rater_id}: no such rater in the store (never known, or already "
                                      "erased); nothing changed")
            receipt = secrets.token_hex(8)
            conn.execute(t.insert().values(receipt=receipt, rater_id=rater_id, requested_by=requested_by,
                                           requested_at=_now()))
            conn.execute(update(tables.rater_links).where(tables.rater_links.c.rater_id == rater_id,
                                                          tables.rater_links.c.revoked_at.is_(None))
                         .values(revoked_at=_now()))
        return receipt

    def pending(self) -> list[dict]:
        """Withdrawals asked for and not erased yet, oldest first."""
        t = tables.withdrawals
        with self.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(t).where(t.c.rater_id.is_not(None))
                                                  .order_by(t.c.requested_at)).mappings()]

    def pending_raters(self) -> set[str]:
        return {w["rater_id"] for w in self.pending()}

    def receipts(self) -> list[dict]:
        """Erased withdrawals: receipt, requested_by/at, confirmed_by, erased_at, counts, model versions."""
        t = tables.withdrawals
        with self.store.engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(t).where(t.c.rater_id.is_(None))
                                                  .order_by(t.c.requested_at)).mappings()]

    def set_retrain(self, receipt: str, note: str) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(update(tables.withdrawals).where(tables.withdrawals.c.receipt == receipt)
                         .values(retrain=note[:300]))

    def versions_to_remove(self) -> set[str]:
        """Model versions trained on erased raters' data and not removed yet."""
        out: set[str] = set()
        for row in self.receipts():
            versions = row["model_versions"] or {}
            out |= set(versions.get("trained_on", [])) - set(versions.get("removed", []))
        return out

    def mark_removed(self, removed: set[str]) -> None:
        t = tables.withdrawals
        with self.store.engine.begin() as conn:
            for row in conn.execute(select(t.c.receipt, t.c.model_versions).where(t.c.rater_id.is_(None))).all():
                versions = dict(row.model_versions or {})
                hit = sorted(set(versions.get("trained_on", [])) & removed)
                if hit:
                    versions["removed"] = sorted(set(versions.get("removed", [])) | set(hit))
                    conn.execute(update(t).where(t.c.receipt == row.receipt).values(model_versions=versions))


# How each table is erased for one rater (sense7.store's tables, every one of them):
#   rater: rows whose rater_id is theirs; annotation: rows of their annotations; conversation: conversations
#   only they had; history: changes of their annotations or naming them; redact: their id replaced in place;
#   none: holds nothing of a rater's; receipt: the withdrawal itself, turned into the receipt; tombstone:
#   written by the erasure (a crowd participant's hashed pseudonymous id: a withdrawal is final), never deleted.
ERASURE = {
    "raters": "rater", "contexts": "rater", "imported_ratings": "rater", "rater_links": "rater",
    "rater_tasks": "rater", "submissions": "rater", "task_arms": "rater", "recorded_predictions": "rater",
    "instructed_answers": "rater", "conversation_choices": "rater", "accepted_versions": "rater",
    "rater_accounts": "rater", "provisional_tasks": "rater",
    "annotations": "annotation", "ratings": "annotation", "rating_history": "history",
    "conversations": "conversation", "staff_log": "redact", "study_values": "none", "withdrawals": "receipt",
    # crowd studies (sense7.crowd): the participant's rows, their platform id (completions) included
    "crowd_participants": "rater", "crowd_slots": "rater", "crowd_released": "rater", "crowd_completions": "rater",
    "crowd_studies": "none", "crowd_pool": "none", "crowd_withdrawn": "tombstone",
    # model versions (sense7.model.registry): a version trained on the rater's ratings is deleted by the retrain
    # that replaces it (`Retrainer.remove_withdrawn_versions`; the receipt lists them), every host's cached copy
    # at that host's next swap or prune
    "model_versions": "retrain", "model_pointer": "none",
    # text vectors (sense7.model.vector_cache): every encoder's vectors of the texts of the conversations erased
    # (keyed by the texts' hashes: sense7.data.items.encoder_texts at the default history length)
    "text_vectors": "conversation texts",
}


def check_plan() -> None:
    missing = sorted(set(tables.metadata.tables) - set(ERASURE))
    if missing:
        raise RuntimeError(f"the erasure plan names no way to erase table(s) {', '.join(missing)}: "
                           "add them to sense7.privacy.participation.ERASURE")


def _redact(value, pattern: re.Pattern):
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, list):
        return [_redact(v, pattern) for v in value]
    if isinstance(value, dict):
        return {k: _redact(v, pattern) for k, v in value.items()}
    return value


def erase_rater_rows(store: Store, rater_id: str, account_id: int | None = None, confirmed_by: str = "",
                     label_studio: dict | None = None, model_versions: list[str] | None = None) -> dict:
    """Delete every row of `rater_id` (and their Label Studio account's `account_id`) in one transaction and
    turn their withdrawal into its receipt. Returns the counts per table (what the receipt keeps)."""
    check_plan()
    by_rater = [tables.metadata.tables[name] for name, how in ERASURE.items() if how == "rater"]
    counts: dict[str, int] = {}
    with store.engine.begin() as conn:
        t = tables.withdrawals
        receipt = conn.scalar(select(t.c.receipt).where(t.c.rater_id == rater_id))
        if receipt is None:
            raise WithdrawalError(f"rater {rater_id}: no withdrawal asked for; nothing changed")
        # Their conversations, and those nobody else has (a conversation given to several raters stays).
        theirs, others = set(), set()
        for table in (tables.contexts, tables.rater_tasks, tables.task_arms, tables.recorded_predictions,
                      tables.annotations, tables.imported_ratings, tables.conversation_choices):
            for cid, rid in conn.execute(select(table.c.conversation_id, table.c.rater_id)):
                if rid == rater_id:
                    theirs.add(cid)
                elif rid is not None:  # a quarantined annotation (credited to nobody) makes nobody an owner
                    others.add(cid)
        own_conversations = {c for c in theirs - others if c is not None}
        task_ids = {tid for (tid,) in conn.execute(select(tables.rater_tasks.c.task_id).where(
            tables.rater_tasks.c.rater_id == rater_id))}
        task_ids |= {tid for (tid,) in conn.execute(select(tables.submissions.c.task_id).where(
            tables.submissions.c.rater_id == rater_id))}
        a = tables.annotations
        conditions = [a.c.rater_id == rater_id, a.c.task_id.in_(task_ids), a.c.conversation_id.in_(own_conversations)]
        if account_id is not None:
            conditions.append(a.c.author_id == account_id)
        annotation_ids = {aid for (aid,) in conn.execute(select(a.c.annotation_id).where(or_(*conditions)))}
        h = tables.rating_history
        history_ids = {row.id for row in conn.execute(select(h.c.id, h.c.annotation_id, h.c.old, h.c.new))
                       if row.annotation_id in annotation_ids
                       or rater_id in ((row.old or {}).get("rater_id"), (row.new or {}).get("rater_id"))}
        counts["rating_history"] = conn.execute(delete(h).where(h.c.id.in_(history_ids))).rowcount
        counts["ratings"] = conn.execute(delete(tables.ratings).where(
            tables.ratings.c.annotation_id.in_(annotation_ids))).rowcount
        counts["annotations"] = conn.execute(delete(a).where(a.c.annotation_id.in_(annotation_ids))).rowcount
        # A crowd participant's withdrawal stays final after their rows are gone: the same platform id (the same
        # pseudonymous id) is refused at the study's entry. Only the id's hash is kept.
        studies = {sid for (sid,) in conn.execute(select(tables.crowd_participants.c.study_id).where(
            tables.crowd_participants.c.rater_id == rater_id))}
        if studies:
            store.upsert_rows(conn, tables.crowd_withdrawn, [
                {"study_id": sid, "id_hash": tables.withdrawn_id_hash(rater_id)} for sid in sorted(studies)],
                ["study_id", "id_hash"])
        counts["crowd_withdrawn_kept"] = len(studies)
        for table in by_rater:
            counts[table.name] = conn.execute(delete(table).where(table.c.rater_id == rater_id)).rowcount
        erased_texts = [text_sha256(t) for (messages,) in conn.execute(select(tables.conversations.c.messages).where(
            tables.conversations.c.conversation_id.in_(own_conversations))) for t in encoder_texts(messages)]
        counts["text_vectors"] = sum(conn.execute(delete(tables.text_vectors).where(
            tables.text_vectors.c.text_sha256.in_(erased_texts[start:start + 500]))).rowcount
            for start in range(0, len(erased_texts), 500))
        counts["conversations"] = conn.execute(delete(tables.conversations).where(
            tables.conversations.c.conversation_id.in_(own_conversations))).rowcount
        # Staff entries stay (what was done, when), with their id and conversation ids replaced.
        names = [rater_id, *sorted(own_conversations, key=len, reverse=True)]
        pattern = re.compile("|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-])" for n in names))
        redacted = 0
        for row in conn.execute(select(tables.staff_log.c.id, tables.staff_log.c.detail)).all():
            clean = _redact(row.detail, pattern)
            if clean != row.detail:
                conn.execute(update(tables.staff_log).where(tables.staff_log.c.id == row.id).values(detail=clean))
                redacted += 1
        counts["staff_log_redacted"] = redacted
        counts = {k: int(v) for k, v in counts.items()}
        conn.execute(update(t).where(t.c.receipt == receipt).values(
            rater_id=None, confirmed_by=confirmed_by or staff_user(), erased_at=_now(),
            counts={"store": counts, "label_studio": label_studio or {}},
            model_versions={"trained_on": sorted(model_versions or []), "removed": []}))
    return {"receipt": receipt, "store": counts, "label_studio": label_studio or {}}


def own_conversations(store: Store, rater_id: str) -> list[dict]:
    """The rater's conversations as the store keeps them (scrubbed at import): conversation_id, title (from
    the export's context, scrubbed too), messages, choice. What the rater page's "Your conversations" shows."""
    ids = rater_conversations(store, rater_id)
    with store.engine.connect() as conn:
        texts = {cid: msgs for cid, msgs in conn.execute(select(
            tables.conversations.c.conversation_id, tables.conversations.c.messages).where(
            tables.conversations.c.conversation_id.in_(ids)))}
        contexts = {cid: ctx for cid, ctx in conn.execute(select(
            tables.contexts.c.conversation_id, tables.contexts.c.context).where(
            tables.contexts.c.rater_id == rater_id))}
    choices = ConversationChoices(store).of(rater_id)
    return [{"conversation_id": cid, "title": (contexts.get(cid) or {}).get("title"), "messages": texts[cid],
             "donated": bool((contexts.get(cid) or {}).get("source")),
             "choice": choices.get(cid, Choice(True, True, None))} for cid in ids if cid in texts]


def awaiting_choice(store: Store, rater_id: str) -> bool:
    """Whether the rater has a donated conversation (imported from an export: its context names a `source`)
    they have not seen on "Your conversations" yet. One small query per page, no texts read."""
    with store.engine.connect() as conn:
        donated = {cid for cid, ctx in conn.execute(select(tables.contexts.c.conversation_id,
                                                           tables.contexts.c.context).where(
            tables.contexts.c.rater_id == rater_id)) if (ctx or {}).get("source")}
        donated -= study_conversations(conn, rater_id)
        if not donated:
            return False
        chosen = {cid for (cid,) in conn.execute(select(tables.conversation_choices.c.conversation_id).where(
            tables.conversation_choices.c.rater_id == rater_id))}
    return bool(donated - chosen)
