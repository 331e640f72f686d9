"""Raters in Label Studio without a login of their own: their attribution accounts, their queue of tasks
(copied into the store for the rater page: `copy_queues`, `copy_queue`), and their answers written as
annotations.

A rater rates on sense7's rater page, never in Label Studio. So that Label Studio (the system of record)
credits each annotation to its rater explicitly, every rater has an *attribution account*: a Label Studio
user with a reserved address derived from the rater id (`account_email`, never a mailbox and never the
rater's own email: every Label Studio account reads the user list, and Label Studio shows each annotation's
author by email) and a random password that is discarded at once, so nobody can sign in with it. The
rater page knows the rater from their private link and writes as that account; the sync attributes the
annotation through that address (`raters_by_email`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from typing import Any

from label_studio_sdk import LabelStudio

from sense7.labelstudio.client import list_tasks, rater_query, raters_tasks
from sense7.labelstudio.protocol import parse_annotation, parse_profile_annotation, user_id
from sense7.store.account_ids import AccountIds
from sense7.store.database import Store
from sense7.store.rater_page_tables import RaterQueue
from sense7.store.study_design import SHOWN, arm_of
from sense7.taxonomy import Taxonomy

RESERVED_DOMAIN = "raters.sense7.invalid"  # RFC 2606: never a real mailbox


@functools.lru_cache(maxsize=65536)  # the sync maps every rater's address per batch: hash each id once
def account_email(rater_id: str) -> str:
    """The address of a rater's attribution account: stable, reserved and derived from the rater id alone
    (which may itself be a platform id, so only a hash of it appears)."""
    return f"rater-{hashlib.sha256(rater_id.encode()).hexdigest()[:20]}@{RESERVED_DOMAIN}"


def raters_by_email(store: Store) -> dict[str, str]:
    """Label Studio email -> rater: every rater's attribution address, and the email the store has for a
    rater (an account made before attribution addresses, or a staff member's own login: see
    ensure_accounts)."""
    emails = store.rater_emails(every_rater=True)
    found = {account_email(rater_id): rater_id for rater_id in emails}
    found.update({email: rater_id for rater_id, email in emails.items() if email})
    return found


def ensure_users(client: LabelStudio, emails: dict[str, str], users: dict[str, int] | None = None
                 ) -> dict[str, int]:
    """rater_id -> Label Studio user id, creating a user (password discarded) per email not there yet.
    `users`: email -> user id of every Label Studio user, when the caller has listed them already. Without
    it, each user is created first and the list is read only if Label Studio says an address is taken (a
    retry after a crash, an account made elsewhere): listing every user costs a request that grows with the
    study (0.45 s at 100 users), creating one 0.07 s."""
    existing = dict(users) if users is not None else None
    ids = {}
    for rater_id, email in emails.items():
        email = email.lower()
        if existing is None:
            made = _create_user(client, email)
            if made is not None:
                ids[rater_id] = made
                continue
            existing = {(u.email or "").lower(): u.id for u in client.users.list()}
        if email not in existing:
            existing[email] = _create_user(client, email, taken_is_error=True)
        ids[rater_id] = existing[email]
    return ids


def _create_user(client: LabelStudio, email: str, taken_is_error: bool = False) -> int | None:
    """A new user at `email`: its id, or None when Label Studio answers that the address is taken."""
    from label_studio_sdk.core.api_error import ApiError

    try:
        return client.users.create(username=email.split("@")[0][:30] + "-" + secrets.token_hex(3), email=email,
                                   password=secrets.token_urlsafe(24)).id
    except ApiError as exc:
        errors = (exc.body or {}).get("validation_errors", {}) if isinstance(exc.body, dict) else {}
        if exc.status_code == 400 and "email" in errors and not taken_is_error:
            return None
        raise


def ensure_accounts(client: LabelStudio, store: Store, rater_ids) -> dict[str, int]:
    """The raters' attribution accounts (and the raters in the store): created when missing, each account at
    its rater's reserved address, and kept in the store (sense7.store.account_ids), so that a rater's account
    is looked up in Label Studio once, not at every round of every job (`forget` a kept id found stale:
    copy_queue does).

    A rater whose own email already has an account in Label Studio keeps that account, so their earlier
    annotations and later ones stay on one account: a staff member's own login (their email is in Label
    Studio because they are staff), or an account sense7 made with the rater's email before attribution
    addresses (`move_accounts` moves those to the reserved address)."""
    rater_ids = list(rater_ids)
    store.add_raters(rater_ids)  # a crowd participant may have no row yet: the sync knows raters by theirs
    kept = AccountIds(store)
    known = kept.of(rater_ids)
    missing = [r for r in rater_ids if r not in known]
    if not missing:
        return known
    stored = store.rater_emails(rater_ids=missing)  # own emails: staff, raters imported with one
    users = {(u.email or "").lower(): u.id for u in client.users.list()} if stored else None
    own = {r: users[stored[r]] for r in missing if users is not None and stored.get(r) in users}
    found = {**own, **ensure_users(client, {r: account_email(r) for r in missing if r not in own}, users)}
    kept.remember(found)
    return {**known, **found}


def ensure_account(client: LabelStudio, store: Store, rater_id: str) -> int:
    return ensure_accounts(client, store, [rater_id])[rater_id]


def is_account_of(client: LabelStudio, store: Store, rater_id: str, account: int) -> bool:
    """Whether Label Studio user `account` still exists and is the rater's (their reserved address, or the
    email the store has for them)."""
    from label_studio_sdk.core.api_error import ApiError

    try:
        email = (client.users.get(account).email or "").strip().lower()
    except ApiError as exc:
        if exc.status_code == 404:
            return False
        raise
    stored = store.rater_emails(rater_ids=[rater_id]).get(rater_id)
    return email in (account_email(rater_id), stored)


def made_by_sense7(username: str, email: str) -> bool:
    """Whether a user with this username and email is an attribution account (ensure_users' usernames:
    the address's first 30 characters before the @, a dash and 6 hex digits), not somebody's login."""
    return re.fullmatch(re.escape(email.split("@")[0][:30]) + r"-[0-9a-f]{6}", username or "") is not None


def move_accounts(client: LabelStudio, store: Store, projects) -> dict[str, int]:
    """Move every attribution account that carries a rater's own email (made before attribution
    addresses) to the rater's reserved address: a new account at that address takes over the old
    account's annotations in `projects` (their author changes, nothing else), then the old account and
    with it the email are deleted. Label Studio refuses to change a user's email, hence the move.
    Staff members' own logins are left alone. Re-running after an interruption finishes the job.
    Returns counts: accounts moved, annotations moved, staff logins left."""
    stored = {email: rater for rater, email in store.rater_emails().items()
              if not email.endswith("@" + RESERVED_DOMAIN)}
    users = {(u.email or "").lower(): u for u in client.users.list()}
    with_rater_email = {email: user for email, user in users.items() if email in stored}
    old = {u.id: stored[email] for email, u in with_rater_email.items() if made_by_sense7(u.username, email)}
    new = ensure_users(client, {rater: account_email(rater) for rater in old.values()},
                       {email: u.id for email, u in users.items()})
    annotations = 0
    for project in projects if old else ():
        for task in list_tasks(client, 1000, project=project, fields="all"):
            for annotation in (dict(a) for a in task.annotations or []):
                author = user_id(annotation.get("completed_by"))
                if author in old:
                    client.annotations.update(annotation["id"], completed_by=new[old[author]])
                    annotations += 1
    AccountIds(store).remember(new)  # before the old accounts go: a kept id never names a deleted account
    for uid in sorted(old):
        client.users.delete(uid)
    return {"accounts": len(old), "annotations": annotations, "staff_logins_left": len(with_rater_email) - len(old)}


def _latest(items: list[dict], key: str = "created_at") -> dict | None:
    return max(items, key=lambda item: (str(item.get(key) or ""), item.get("id") or 0)) if items else None


def _answer_from(annotation: dict | None, taxonomy: Taxonomy, kind: str) -> dict | None:
    if annotation is None:
        return None
    if kind == "profile":
        return {"traits": parse_profile_annotation(annotation.get("result") or [], taxonomy)}
    values, expectation, comment = parse_annotation(annotation.get("result") or [], taxonomy)
    return {"values": values, "expectation": expectation, "comment": comment}


def _queue_item(task, kind: str, account: int | None, taxonomy: Taxonomy) -> dict:
    """One task as the rater page keeps it: texts, latest prediction, the rater's own latest answer (by
    their account; annotations by anyone else are never shown to the rater)."""
    data = dict(task.data or {})
    annotations = [dict(a) for a in (task.annotations or [])
                   if account is not None and user_id(dict(a).get("completed_by")) == account
                   and not dict(a).get("was_cancelled")]
    # (the task's key: what finds a task the page showed before Label Studio had it, RaterQueue.replace)
    item: dict[str, Any] = {"task_id": task.id, "kind": kind, "prediction": None,
                            "answer": _answer_from(_latest(annotations, "updated_at"), taxonomy, kind),
                            "conversation_id": None, "turn_index": None, "position": -1,
                            "data": {"task_key": data.get("task_key")}}
    if kind == "profile":
        return item
    # The study's hidden arm (sense7.store.study_design) never shows a prediction, whatever Label Studio holds.
    prediction = _latest([dict(p) for p in (task.predictions or [])]) if arm_of(data) == SHOWN else None
    if prediction:
        values, expectation, _ = parse_annotation(prediction.get("result") or [], taxonomy)
        if values:
            item["prediction"] = {"version": prediction.get("model_version"), "values": values,
                                  "expectation": expectation}
    return {**item, "conversation_id": data.get("conversation_id"), "turn_index": data.get("turn_index"),
            "data": {"task_key": data.get("task_key"), "history": data.get("history") or [], "turn": data.get("turn") or [],
                     "repeat": bool(data.get("repeat_of")), "instructed": data.get("instructed")}}


def _in_order(items: list[dict]) -> list[dict]:
    """The order the page asks: the questionnaire, then the turns conversation by conversation, then the
    turns the study shows a second time (repeats, sense7.store.study_design), so they come back later."""
    ratings = sorted((i for i in items if i["kind"] == "rating"),
                     key=lambda i: (bool(i["data"].get("repeat")), str(i["conversation_id"]),
                                    int(i["turn_index"] or 0)))
    for position, item in enumerate(ratings):
        item["position"] = position
    return [i for i in items if i["kind"] == "profile"][:1] + ratings


def _projects(rating_project: int, profile_project: int | None) -> list[tuple[int, str]]:
    return ([(profile_project, "profile")] if profile_project else []) + [(rating_project, "rating")]


def fetch_queue(client: LabelStudio, rating_project: int, profile_project: int | None, rater_id: str,
                account: int, taxonomy: Taxonomy) -> list[dict]:
    """One rater's tasks from Label Studio (a Data Manager filter on data.rater_id), in the page's order."""
    items = []
    for project, kind in _projects(rating_project, profile_project):
        for task in list_tasks(client, 1000, project=project, fields="all", query=rater_query(rater_id)):
            if (task.data or {}).get("rater_id") == rater_id:  # the filter is Label Studio's: check it anyway
                items.append(_queue_item(task, kind, account, taxonomy))
    return _in_order(items)


def fetch_all_queues(client: LabelStudio, rating_project: int, profile_project: int | None,
                     accounts: dict[str, int | None], taxonomy: Taxonomy, filtered: bool = False) -> dict[str, list[dict]]:
    """The queues of these raters (rater_id -> account) in one pass over both projects: a page per 1,000
    tasks instead of two filtered queries per rater, so that opening a link never waits for Label Studio.
    `filtered`: read only these raters' tasks (OR-filtered queries, a few raters each), for a handful of
    raters in a large project (a burst of crowd participants)."""
    found: dict[str, list[dict]] = {rater: [] for rater in accounts}
    for project, kind in _projects(rating_project, profile_project):
        tasks = (raters_tasks(client, project, list(accounts), fields="all") if filtered
                 else list_tasks(client, 1000, project=project, fields="all"))
        for task in tasks:
            rater = (task.data or {}).get("rater_id")
            if rater in found:
                found[rater].append(_queue_item(task, kind, accounts[rater], taxonomy))
    return {rater: _in_order(items) for rater, items in found.items()}


def copy_queues(client: LabelStudio, store: Store, rating_project: int, profile_project: int | None,
                taxonomy: Taxonomy, rater_ids, filtered: bool = False, make_accounts: bool = True) -> int:
    """Copy these raters' queues from Label Studio into the store (sense7.store.rater_page_tables.RaterQueue), in one
    pass over both projects (fetch_all_queues; `filtered`: over these raters' tasks only); returns the
    raters copied. The queue job's work, and the crowd's prepare job's. `make_accounts=False`: raters whose
    account is not kept yet get none here (no annotation can be theirs before it exists); delivery makes it
    with their first answer. The crowd's first turns then never wait for Label Studio to create users."""
    rater_ids = sorted(rater_ids)
    if make_accounts:
        accounts: dict[str, int | None] = dict(ensure_accounts(client, store, rater_ids))
    else:
        store.add_raters(rater_ids)  # the sync knows raters by their row
        accounts = {r: None for r in rater_ids} | AccountIds(store).of(rater_ids)
    queues = fetch_all_queues(client, rating_project, profile_project, accounts, taxonomy, filtered=filtered)
    queue = RaterQueue(store)
    for rater, items in queues.items():
        queue.replace(rater, items)
    return len(queues)


def copy_queue(client: LabelStudio, store: Store, rating_project: int, profile_project: int | None,
               taxonomy: Taxonomy, rater_id: str, account: int | None = None) -> int:
    """Copy one rater's queue into the store with a filtered query (fetch_queue): what the rater page does
    when a rater without a copy opens their link. `account`: the rater's attribution account as the caller
    last knew it; returns the account, so the caller can keep it. A kept account is checked first (one small
    request): `move_accounts` replaces accounts, and a queue read through a replaced one would show the
    rater none of their earlier answers."""
    if account is None:
        account = ensure_account(client, store, rater_id)
    if not is_account_of(client, store, rater_id, account):
        AccountIds(store).forget([rater_id])  # replaced (move_accounts) or deleted in Label Studio: find it again
        account = ensure_account(client, store, rater_id)
    RaterQueue(store).replace(rater_id, fetch_queue(client, rating_project, profile_project, rater_id, account,
                                                    taxonomy))
    return account


def write_annotation(client: LabelStudio, task_id: int, account: int, result: list[dict],
                     lead_time: float | None, known: int | None = None, check: bool = True) -> int:
    """Write the rater's answer to the task; returns the annotation id.

    known: the annotation an earlier revision became (updated in place). Otherwise, with `check`, the task
    is read first and an annotation the account already has there is updated, so that a delivery repeated
    after a crash (created, not yet marked delivered) never makes a second one; without `check` (a first
    attempt of a first answer: nothing can exist yet) it is created in one request."""
    extra = {"lead_time": round(lead_time, 3)} if lead_time is not None else {}
    current = None
    if known is not None:
        current = {"id": known}
    elif check:
        task = client.tasks.get(task_id)
        own = [dict(a) for a in (task.annotations or []) if user_id(dict(a).get("completed_by")) == account]
        current = _latest(own, "updated_at")
    if current is None:
        return client.annotations.create(task_id, result=result, completed_by=account, **extra).id
    # The rater's whole answer, over whatever staff set there since: never a skip, this revision's seconds.
    client.annotations.update(current["id"], result=result, was_cancelled=False,
                              lead_time=extra.get("lead_time"))
    return int(current["id"])
