"""The sync credits an annotation through the attribution accounts the store keeps (sense7.store.account_ids):
a sync job meeting a rater it has not seen reads the store, never the list of every Label Studio user (a
request that grows with the study, made once per job before issue 40's follow-up). An author not kept
(staff, another account) costs one `users.get` and is still never credited to the task's rater. Against the
session's real Label Studio; the users calls are counted around the real client (every call is made)."""

from __future__ import annotations

import secrets

import pytest

from sense7.labelstudio.client import UsersCallLog, create_profile_project, create_rating_project
from sense7.labelstudio.importer import import_conversations
from sense7.labelstudio.label_sync import LabelSync, SyncResult
from sense7.labelstudio.rater_accounts import ensure_accounts
from sense7.store.account_ids import AccountIds
from sense7.store.database import Store
from sense7.taxonomy import load_taxonomy
from tests.support.jobs import annotate, ensure_users, make_conversations, make_raters, project_tasks

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = pytest.mark.labelstudio




@pytest.fixture
def study(label_studio, tmp_path):
    """Fresh projects and store; three raters whose attribution accounts are made and kept as delivery
    makes them (ensure_accounts), their conversations imported."""
    client = label_studio.client
    tag = secrets.token_hex(3)
    rating = create_rating_project(client, f"sync attribution rating {tag}", TAXONOMY)
    profile = create_profile_project(client, f"sync attribution profile {tag}", TAXONOMY)
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    raters = make_raters(3, prefix=f"att{tag}x")
    store.upsert_raters(raters)
    ids = [r["rater_id"] for r in raters]
    import_conversations(client, rating, make_conversations(ids, per_rater=2, turns=2, prefix=f"att{tag}"),
                         store, taxonomy=TAXONOMY)
    accounts = ensure_accounts(client, store, ids)
    return client, store, rating, profile, accounts


def test_a_sync_job_credits_known_raters_without_listing_users(study):
    """Each job is a new syncer sharing the worker's email cache: the old code listed every user in each job
    that met a rater it had not seen; now the kept accounts answer, and only the staff author (not kept) is
    fetched, once, by id. A staff annotation and one by another rater's account stay quarantined."""
    client, store, rating, profile, accounts = study
    tasks = project_tasks(client, rating)
    by_rater = {}
    for task in tasks:
        by_rater.setdefault(task.data["rater_id"], []).append(task)
    owners = sorted(by_rater)
    counted, worker_emails = UsersCallLog(client), {}

    def job() -> LabelSync:
        return LabelSync(counted, store, TAXONOMY, rating, profile, user_emails=worker_emails)

    # A webhook's job per rater's first annotation (sync_annotation), then a drain round (sync_named).
    firsts = {owner: annotate(client, by_rater[owner][0], accounts[owner], store=store) for owner in owners}
    for owner, ann in firsts.items():
        assert job().sync_annotation(ann.id).credited == 1
    seconds = [(rating, by_rater[o][1].id, annotate(client, by_rater[o][1], accounts[o], store=store).id)
               for o in owners[:2]]
    drained = job().sync_named(seconds, [], SyncResult())
    assert (drained.credited, drained.quarantined) == (2, 0)
    assert counted.calls == []  # every author a kept account: no users request at all

    # Not the task's rater's: staff (a user no account is kept for) and another rater's own account.
    staff = client.users.whoami().id
    task = by_rater[owners[2]][1]
    by_staff = annotate(client, task, staff)
    by_other = annotate(client, task, accounts[owners[0]])
    assert job().sync_annotation(by_staff.id).quarantined == 1
    assert job().sync_annotation(by_other.id).quarantined == 1
    assert job().sync_named([(rating, task.id, by_staff.id), (rating, task.id, by_other.id)], [],
                            SyncResult()).quarantined == 2
    assert counted.calls == ["get"]  # the staff author, once, by id; its email kept by the worker
    reasons = {row["annotation_id"]: row["quarantine"] for row in store.quarantined()}
    assert reasons[by_other.id] == f"rater {owners[0]} answered a task of rater {owners[2]}"
    assert reasons[by_staff.id] == f"author (Label Studio user {staff}) is not a known rater"
    frame = store.ratings_frame()  # each credited rating its task's rater's; the two strangers' none
    credited = set(zip(frame["conversation_id"], frame["turn_index"].astype(int), frame["rater_id"]))
    assert credited == {(t.data["conversation_id"], int(t.data["turn_index"]), o) for o in owners
                        for t in by_rater[o][:1 if o == owners[2] else 2]}

    # A reconciliation with every author placed lists nobody either, and agrees with the jobs.
    outcome = job().reconcile()
    assert (outcome.seen, outcome.quarantined) == (7, 2)
    assert counted.calls == ["get"]


def test_an_author_not_kept_is_found_by_id_and_still_checked_against_the_tasks_rater(study):
    """An account nobody keeps (a login at the rater's own email, as accounts were made before attribution
    addresses) is read with one `users.get` and credited through its email as before; an account whose kept
    id was dropped is found by its address, and still never credited to another rater's task."""
    client, store, rating, profile, accounts = study
    tasks = project_tasks(client, rating)
    task = tasks[0]
    owner = task.data["rater_id"]
    other = next(r for r in accounts if r != owner)
    email = next(e for r, e in store.rater_emails().items() if r == owner)
    own_login = ensure_users(client, [{"rater_id": owner, "email": email}])[owner]  # their email's account
    counted = UsersCallLog(client)
    syncer = LabelSync(counted, store, TAXONOMY, rating, profile, user_emails={})
    ann = annotate(client, task, own_login, store=store)
    assert syncer.sync_annotation(ann.id).credited == 1
    assert counted.calls == ["get"]
    # The other rater's account, its kept id dropped: no longer any rater's by id, and its reserved address
    # still names the other rater (found by one get), never the task's.
    AccountIds(store).forget([other])
    stray = annotate(client, task, accounts[other])
    assert syncer.sync_annotation(stray.id).quarantined == 1
    assert counted.calls == ["get", "get"]
    reasons = {row["annotation_id"]: row["quarantine"] for row in store.quarantined()}
    assert reasons[stray.id] == f"rater {other} answered a task of rater {owner}"
