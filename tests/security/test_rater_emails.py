"""No rater's email reaches Label Studio: attribution accounts have reserved addresses derived from the rater
id, so Label Studio's user list (which every account reads) and its exports (which name each annotator by
email) hold none; accounts an earlier sense7 made with raters' emails are moved off them by
`sense7 raters move-accounts`, their ratings kept. Against the session's real Label Studio."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from sense7.labelstudio.importer import import_conversations
from sense7.labelstudio.label_sync import LabelSync
from sense7.labelstudio.protocol import user_id
from sense7.labelstudio.rater_accounts import account_email, copy_queue, ensure_accounts, ensure_users
from sense7.store.tables import annotations as annotations_table, rater_tasks
from tests.support.jobs import annotate, make_conversations, make_raters, project_tasks

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]

SENSE7 = str(Path(sys.executable).parent / "sense7")


def study(stack, n_raters: int):
    """Raters with emails at a domain of this test's own, their conversations imported: (runtime, raters,
    domain)."""
    rt = stack.runtime()
    tag = secrets.token_hex(3)
    domain = f"private-{tag}.test"
    raters = make_raters(n_raters, prefix=f"e{tag}x", domain=domain)
    rt.store.upsert_raters(raters)
    convs = make_conversations([r["rater_id"] for r in raters], per_rater=1, turns=2, prefix=f"e{tag}")
    import_conversations(rt.client, rt.rating_project, convs, rt.store, taxonomy=rt.taxonomy)
    return rt, raters, domain


def rate_all(rt, accounts: dict[str, int]) -> dict[int, int]:
    """Each task rated by its rater's account, the rater page's way (a submission in the outbox, then the
    annotation): task id -> annotation id."""
    return {task.id: annotate(rt.client, task, accounts[task.data["rater_id"]], store=rt.store).id
            for task in project_tasks(rt.client, rt.rating_project) if task.data["rater_id"] in accounts}


def stored_authors(rt) -> dict[int, tuple]:
    """annotation id -> (rater, quarantine reason, held) as the store has it."""
    t = annotations_table
    with rt.store.engine.connect() as conn:
        return {r.annotation_id: (r.rater_id, r.quarantine, r.held) for r in conn.execute(
            select(t.c.annotation_id, t.c.rater_id, t.c.quarantine, t.c.held).where(t.c.deleted.is_(False)))}


def copied_answers(rt, rater: str) -> list[bool]:
    """Per task of the rater's queue copy, whether the copy holds their answer as read from Label Studio
    (not the page's own submissions, which the page would show first)."""
    with rt.store.engine.connect() as conn:
        return [answer is not None for (answer,) in conn.execute(
            select(rater_tasks.c.answer).where(rater_tasks.c.rater_id == rater).order_by(rater_tasks.c.position))]


def exported(rt, export_type: str) -> str:
    return b"".join(rt.client.projects.exports.download_sync(rt.rating_project, export_type=export_type,
                                                             download_all_tasks=True)).decode()


def test_attribution_accounts_carry_no_rater_email_into_label_studio_or_its_exports(job_stack):
    rt, raters, domain = study(job_stack, 2)
    accounts = ensure_accounts(rt.client, rt.store, [r["rater_id"] for r in raters])
    made = rate_all(rt, accounts)
    result = LabelSync.from_runtime(rt).reconcile()
    assert result.quarantined == 0 and result.held == 0
    # The sync credits each annotation to its rater through the reserved address.
    assert {made[t]: stored_authors(rt)[made[t]][0] for t in made} == \
        {made[t.id]: t.data["rater_id"] for t in project_tasks(rt.client, rt.rating_project)}

    users = [(u.email, u.username, u.first_name, u.last_name) for u in rt.client.users.list()]
    mine = {account_email(r["rater_id"]) for r in raters}
    assert mine <= {email for email, *_ in users}
    assert domain not in json.dumps(users)
    for export_type in ("JSON", "JSON_MIN", "CSV"):
        assert domain not in exported(rt, export_type), export_type
    # Exports name each annotator by user id (Label Studio 1.23): the ids of the reserved-address accounts.
    email_of = {u.id: u.email for u in rt.client.users.list()}
    assert {email_of[row["annotator"]] for row in json.loads(exported(rt, "JSON_MIN"))} == mine
    assert not any(r["rater_id"] in account_email(r["rater_id"]) for r in raters)  # a hash, not the id


def test_move_accounts_takes_old_accounts_off_raters_emails_and_keeps_their_ratings(job_stack):
    rt, raters, domain = study(job_stack, 3)
    old_rater, staff_rater, new_rater = (r["rater_id"] for r in raters)
    emails = {r["rater_id"]: r["email"] for r in raters}
    # What sense7 made before reserved addresses: an account with the rater's email. And a staff member
    # who rates too, with their own login.
    old = ensure_users(rt.client, {old_rater: emails[old_rater]})[old_rater]
    staff = rt.client.users.create(username=emails[staff_rater], email=emails[staff_rater],
                                   password=secrets.token_urlsafe(16)).id
    accounts = ensure_accounts(rt.client, rt.store, [old_rater, staff_rater, new_rater])
    assert accounts[old_rater] == old and accounts[staff_rater] == staff  # one account per rater, as before
    assert rt.client.users.get(accounts[new_rater]).email == account_email(new_rater)
    made = rate_all(rt, accounts)
    LabelSync.from_runtime(rt).reconcile()
    before = stored_authors(rt)
    assert sorted(rater for rater, _, _ in before.values()) == sorted([old_rater, staff_rater, new_rater] * 2)

    # The rater page keeps each rater's account between queue copies (sense7.rater_page.wsgi).
    kept = copy_queue(rt.client, rt.store, rt.rating_project, None, rt.taxonomy, old_rater)
    assert kept == old and copied_answers(rt, old_rater) == [True, True]

    env = {**job_stack.env, "SENSE7_HOME": str(job_stack.tmp / "home")}
    moved = subprocess.run([SENSE7, "raters", "move-accounts"], env=env, capture_output=True, text=True,
                           cwd=job_stack.tmp, timeout=300)
    assert moved.returncode == 0, moved.stderr
    assert "1 account(s) moved to reserved addresses with 2 annotation(s); 1 staff login(s)" in moved.stdout

    by_email = {(u.email or "").lower(): u.id for u in rt.client.users.list()}
    assert emails[old_rater] not in by_email and old not in by_email.values()
    assert by_email[emails[staff_rater]] == staff  # a staff login is nobody's to move
    moved_to = by_email[account_email(old_rater)]
    old_tasks = [t for t, a in made.items() if before[a][0] == old_rater]
    assert {user_id(rt.client.annotations.get(made[t]).completed_by) for t in old_tasks} == {moved_to}
    # The sync sees the same annotations, credited to the same raters, none quarantined or held.
    result = LabelSync.from_runtime(rt).reconcile()
    assert result.quarantined == 0 and result.held == 0
    assert stored_authors(rt) == before
    assert ensure_accounts(rt.client, rt.store, [old_rater])[old_rater] == moved_to
    # A page still holding the old account copies the queue through the new one, earlier answers included.
    assert copy_queue(rt.client, rt.store, rt.rating_project, None, rt.taxonomy, old_rater, kept) == moved_to
    assert copied_answers(rt, old_rater) == [True, True]

    again = subprocess.run([SENSE7, "raters", "move-accounts"], env=env, capture_output=True, text=True,
                           cwd=job_stack.tmp, timeout=300)
    assert again.returncode == 0 and "0 account(s) moved" in again.stdout
    # Of the three raters' emails, only the staff member's own login is left in Label Studio.
    assert [e for e in (u.email or "" for u in rt.client.users.list()) if domain in e] == [emails[staff_rater]]


def test_erasing_a_staff_member_who_rated_keeps_their_login_and_deletes_their_ratings(job_stack):
    rt, raters, domain = study(job_stack, 2)
    staff_rater, other = (r["rater_id"] for r in raters)
    email = raters[0]["email"]
    staff = rt.client.users.create(username=email, email=email, password=secrets.token_urlsafe(16)).id
    accounts = ensure_accounts(rt.client, rt.store, [staff_rater, other])
    assert accounts[staff_rater] == staff
    made = rate_all(rt, accounts)
    # The staff member also annotated the other rater's task (review work, say): it is theirs to erase too.
    other_task = next(t for t in project_tasks(rt.client, rt.rating_project) if t.data["rater_id"] == other)
    extra = annotate(rt.client, other_task, staff).id
    from sense7.labelstudio.erasure import erase_rater, rater_users

    emails = {email, account_email(staff_rater)}
    counts = erase_rater(rt.client, [rt.rating_project], staff_rater, rater_users(rt.client, emails))
    assert counts["staff_logins_kept"] == 1 and counts["accounts"] == 0
    assert rt.client.users.get(staff).email == email  # the login stays
    tasks = list(rt.client.tasks.list(project=rt.rating_project, fields="all", page_size=1000))
    left = {dict(a)["id"] for t in tasks for a in (t.annotations or [])}
    assert extra not in left and made[other_task.id] in left  # their annotation gone, the other rater's kept
    assert not [t for t in project_tasks(rt.client, rt.rating_project) if t.data["rater_id"] == staff_rater]
    # An attribution account sense7 made is deleted as before.
    counts = erase_rater(rt.client, [rt.rating_project], other, rater_users(rt.client, {account_email(other)}))
    assert counts["accounts"] == 1 and counts["staff_logins_kept"] == 0 and counts["tasks"] >= 1
    assert account_email(other) not in {(u.email or "").lower() for u in rt.client.users.list()}
