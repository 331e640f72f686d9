"""LabelSync against the real Label Studio, in this process (no worker): reconciliation semantics."""

from __future__ import annotations

import os
import re

import pytest
from sense7.labelstudio.label_sync import LabelSync

from sense7.labelstudio.client import UsersCallLog, create_profile_project, create_rating_project
from sense7.labelstudio.importer import import_conversations, import_profile_tasks
from sense7.labelstudio.protocol import iso_time
from sense7.store.database import Store
from sense7.taxonomy import PROFILE_OBJECT_TAG, load_taxonomy
from tests.support.jobs import annotate, ensure_users, make_conversations, make_raters, project_tasks, rating_result

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

pytestmark = pytest.mark.labelstudio

_n = iter(range(1, 10_000))


@pytest.fixture
def synced(label_studio, tmp_path):
    """Fresh projects and store, three raters with users, their conversations imported."""
    client = label_studio.client
    n = next(_n)
    rating = create_rating_project(client, f"sync logic rating {n} {os.getpid()}", TAXONOMY)
    profile = create_profile_project(client, f"sync logic profile {n} {os.getpid()}", TAXONOMY)
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    raters = make_raters(3, prefix=f"s{n}x")
    store.upsert_raters(raters)
    import_conversations(client, rating, make_conversations([r["rater_id"] for r in raters], per_rater=2, turns=2,
                                                            prefix=f"s{n}"), store, taxonomy=TAXONOMY)
    users = ensure_users(client, raters)
    return LabelSync(client, store, load_taxonomy(), rating, profile), raters, users


def test_reconcile_is_idempotent_and_follows_updates_and_deletions(synced):
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    tasks = project_tasks(client, syncer.rating_project)
    anns = [annotate(client, t, users[t.data["rater_id"]], store=store) for t in tasks[:6]]
    first = syncer.reconcile()
    assert (first.seen, first.upserted, first.unchanged, first.deleted, first.quarantined) == (6, 6, 0, 0, 0)
    again = syncer.reconcile()
    assert (again.upserted, again.unchanged) == (0, 6)

    def overall():
        frame = store.ratings_frame()
        return frame[(frame["conversation_id"] == tasks[0].data["conversation_id"])
                     & (frame["turn_index"] == tasks[0].data["turn_index"])
                     & (frame["dimension"] == "overall")]["rating"].tolist()

    delivered = overall()
    # A staff update in Label Studio (new updated_at) is recorded as held; the rater's rating stays.
    client.annotations.update(anns[0].id, result=rating_result("no such text", bias=3))
    updated = syncer.reconcile()
    assert (updated.upserted, updated.unchanged, updated.held) == (1, 5, 1)
    assert overall() == delivered != [5]
    assert syncer.reconcile().upserted == 0  # stable: the held version is not rewritten every pass
    # The rater answers again on the page: delivered over the staff version, it counts again.
    annotate(client, tasks[0], users[tasks[0].data["rater_id"]], bias=3, store=store)
    assert syncer.reconcile().upserted == 1 and overall() == [5] and store.held() == []

    # Deleted in Label Studio -> marked deleted here, and gone from the training data.
    client.annotations.delete(anns[1].id)
    gone = syncer.reconcile()
    assert gone.deleted == 1 and set(store.annotation_versions()) == {a.id for a in anns} - {anns[1].id}
    assert len(store.ratings_frame()) == 5 * len(syncer.taxonomy.controls)
    # A re-created annotation (same task) comes back.
    back = annotate(client, tasks[1], users[raters[0]["rater_id"]])
    assert syncer.reconcile().upserted == 1 and back.id in store.annotation_versions()


def test_single_annotation_sync_fetches_the_truth_and_maps_the_rater(synced):
    syncer, raters, users = synced
    client = syncer.client
    task = project_tasks(client, syncer.rating_project)[0]
    owner = task.data["rater_id"]
    ann = annotate(client, task, users[owner], store=syncer.store)
    result = syncer.sync_annotation(ann.id)
    assert result.upserted == 1 and result.quarantined == 0
    assert syncer.store.annotation_versions() == {ann.id: iso_time(client.annotations.get(ann.id).updated_at)}
    assert set(syncer.store.ratings_frame()["rater_id"]) == {owner}
    assert syncer.sync_annotation(ann.id).unchanged == 1
    # Deleted: the id alone (as in an ANNOTATIONS_DELETED webhook) is checked against the API.
    client.annotations.delete(ann.id)
    assert syncer.delete_annotations([ann.id]).deleted == 1
    assert syncer.store.annotation_versions() == {}


def test_single_annotation_sync_checks_the_author_against_the_tasks_rater(synced):
    """One annotation synced alone (a webhook's path) is credited through the task's own rater without the
    whole address map; anybody else's annotation still gets the same reasons as in a batch."""
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    tasks = project_tasks(client, syncer.rating_project)
    owner = tasks[4].data["rater_id"]
    other = next(r["rater_id"] for r in raters if r["rater_id"] != owner)
    by_other = annotate(client, tasks[4], users[other])
    by_admin = annotate(client, tasks[5], client.users.whoami().id)
    assert syncer.sync_annotation(by_other.id).quarantined == 1
    assert syncer.sync_annotation(by_admin.id).quarantined == 1
    reasons = {row["annotation_id"]: row["quarantine"] for row in store.quarantined()}
    assert reasons[by_other.id] == f"rater {other} answered a task of rater {owner}"
    assert "not a known rater" in reasons[by_admin.id]
    by_owner = annotate(client, tasks[4], users[owner], store=store)
    assert syncer.sync_annotation(by_owner.id).credited == 1
    assert set(store.ratings_frame()["rater_id"]) == {owner}


def test_attribution_is_never_guessed_a_strangers_annotation_is_quarantined(synced):
    """The admin (any staff account) and a rater answering another rater's task are credited to nobody:
    the annotation is kept with the reason and counted, but never reaches the training data."""
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    tasks = project_tasks(client, syncer.rating_project)
    admin = client.users.whoami().id
    by_admin = annotate(client, tasks[0], admin)
    owner = tasks[2].data["rater_id"]
    other = next(r["rater_id"] for r in raters if r["rater_id"] != owner)
    by_other = annotate(client, tasks[2], users[other])
    by_owner = annotate(client, tasks[3], users[tasks[3].data["rater_id"]], store=store)
    client.annotations.create(tasks[1].id, result=[], was_cancelled=True, completed_by=users[raters[0]["rater_id"]])
    result = syncer.reconcile()
    assert (result.upserted, result.quarantined) == (3, 2)
    assert set(store.annotation_versions()) == {by_admin.id, by_other.id, by_owner.id}
    reasons = {row["annotation_id"]: row["quarantine"] for row in store.quarantined()}
    assert set(reasons) == {by_admin.id, by_other.id}
    assert "not a known rater" in reasons[by_admin.id] and f"rater {other} answered a task of rater {owner}" == reasons[by_other.id]
    # Never trained on: the training data holds the owner's rating only.
    data = store.rating_data(syncer.taxonomy)
    assert set(data.ratings["rater_id"]) == {tasks[3].data["rater_id"]}
    turns = set(zip(data.ratings["conversation_id"], data.ratings["turn_index"].astype(int)))
    assert turns == {(tasks[3].data["conversation_id"], tasks[3].data["turn_index"])}
    assert store.counts()["quarantined"] == 2


def test_a_strangers_questionnaire_answers_leave_traits_unchanged(synced):
    syncer, raters, users = synced
    client = syncer.client
    rater, other = raters[0]["rater_id"], raters[2]["rater_id"]
    import_profile_tasks(client, syncer.profile_project, [rater])
    task = next(iter(client.tasks.list(project=syncer.profile_project, include="id,data")))
    before = syncer.store.raters_frame([rater]).loc[rater].to_dict()
    forged = [{"from_name": "age_band", "to_name": PROFILE_OBJECT_TAG, "type": "choices",
               "value": {"choices": ["65+" if before.get("age_band") != "65+" else "18-24"]}}]
    client.annotations.create(task.id, result=forged, completed_by=client.users.whoami().id)  # staff
    client.annotations.create(task.id, result=forged, completed_by=users[other])  # another rater
    outcome = syncer.reconcile()
    assert (outcome.profiles, outcome.quarantined) == (0, 2)
    assert syncer.store.raters_frame([rater]).loc[rater].to_dict() == before


def test_edits_and_deletions_keep_history_and_revert_restores_them(synced):
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    task = project_tasks(client, syncer.rating_project)[0]
    owner = task.data["rater_id"]
    ann = annotate(client, task, users[owner], store=store)
    syncer.sync_annotation(ann.id)
    original = store.ratings_frame().sort_values("dimension").reset_index(drop=True)
    client.annotations.update(ann.id, result=rating_result("no such text", bias=3))
    syncer.sync_annotation(ann.id)
    # The staff edit is history (held, by the staff member), not the rater's rating.
    assert store.ratings_frame().sort_values("dimension").reset_index(drop=True).equals(original)
    changes = store.history(annotation_id=ann.id)
    assert [c["change"] for c in changes] == ["created", "updated"]
    assert [c["via"] for c in changes] == ["rater page", "label studio"]
    assert changes[1]["old"]["values"] == {r.dimension: r.rating for r in original.itertuples()}
    assert changes[1]["old"]["rater_id"] == changes[1]["new"]["rater_id"] == owner
    assert changes[1]["new"]["held"]["values"]["overall"] == 5

    # Revert the edit: Label Studio gets the old result back, the store follows, history grows.
    syncer.revert(changes[1]["id"])
    assert store.ratings_frame().sort_values("dimension").reset_index(drop=True).equals(original)
    assert [c["change"] for c in store.history(annotation_id=ann.id)] == ["created", "updated", "updated"]
    assert store.held() == []

    # A deletion is kept too, and reverting it re-creates the rating with its rater as author.
    client.annotations.delete(ann.id)
    syncer.delete_annotations([ann.id])
    assert store.ratings_frame().empty
    deleted = store.history(annotation_id=ann.id)[-1]
    assert deleted["change"] == "deleted" and deleted["old"]["rater_id"] == owner
    syncer.revert(deleted["id"])
    restored = store.ratings_frame()
    assert set(restored["rater_id"]) == {owner}
    assert restored.sort_values("dimension").reset_index(drop=True)[["dimension", "rating"]].equals(
        original[["dimension", "rating"]])
    assert store.quarantined() == []
    with pytest.raises(LookupError):
        syncer.revert(10_000_000)


def test_questionnaire_answers_become_traits_and_bad_answers_are_named(synced):
    syncer, raters, users = synced
    client = syncer.client
    rater = raters[1]["rater_id"]
    import_profile_tasks(client, syncer.profile_project, [rater])
    task = next(iter(client.tasks.list(project=syncer.profile_project, include="id,data")))

    def choice(key, value):
        return {"from_name": key, "to_name": PROFILE_OBJECT_TAG, "type": "choices", "value": {"choices": [value]}}

    result = [choice("age_band", "35-44"), choice("tipi_1", "6"), choice("tipi_2", "9"), choice("llm_use", "daily")]
    # Written in Label Studio under the rater's account with no rater-page submission: not the rater's word.
    before = syncer.store.raters_frame([rater]).loc[rater].to_dict()
    forged = client.annotations.create(task.id, result=result, completed_by=users[rater])
    outcome = syncer.reconcile()
    assert (outcome.profiles, outcome.quarantined) == (0, 1)
    assert syncer.store.raters_frame([rater]).loc[rater].to_dict() == before
    client.annotations.delete(forged.id)
    # Answered on the rater page (the outbox) and delivered: their traits.
    annotate(client, task, users[rater], store=syncer.store, result=result, kind="profile")
    outcome = syncer.reconcile()
    assert outcome.profiles == 1
    assert any("tipi_2" in problem for problem in outcome.invalid), outcome.invalid
    traits = syncer.store.raters_frame([rater]).loc[rater]
    assert traits["age_band"] == "35-44" and traits["tipi_1"] == 6 and traits["llm_use"] == "daily"
    assert traits["tipi_2"] == raters[1]["traits"]["tipi_2"]  # the out-of-range 9 did not overwrite it
    # Questionnaire annotations are not ratings.
    assert syncer.store.annotation_versions() == {}


def test_webhook_registration_is_idempotent(synced):
    syncer, _, _ = synced
    url = "http://127.0.0.2:9/webhook"  # the one local address Label Studio may call
    ids = syncer.ensure_webhooks(url, {"X-Sense7-Secret": "s3cret"})
    assert len(ids) == 2 and syncer.ensure_webhooks(url, {"X-Sense7-Secret": "s3cret"}) == ids
    hooks = syncer.client.webhooks.list(project=str(syncer.rating_project))
    assert len(hooks) == 1 and hooks[0].headers == {"X-Sense7-Secret": "s3cret"} and hooks[0].send_payload
    # A changed secret updates the same hook instead of adding one.
    assert syncer.ensure_webhooks(url, {"X-Sense7-Secret": "rotated"}) == ids
    assert syncer.client.webhooks.get(ids[0]).headers == {"X-Sense7-Secret": "rotated"}
    # A duplicate (made by hand or by an older version) is removed: it would deliver every event twice.
    syncer.client.webhooks.create(url=url, project=syncer.rating_project, actions=["ANNOTATION_CREATED"])
    assert syncer.ensure_webhooks(url, {"X-Sense7-Secret": "rotated"}) == ids
    assert len(syncer.client.webhooks.list(project=str(syncer.rating_project))) == 1


def test_label_studio_errors_leave_the_job_without_headers(label_studio):
    from label_studio_sdk.core.api_error import ApiError
    from sense7.tasks.runtime import LabelStudioError, as_retryable

    with pytest.raises(ApiError) as caught:
        label_studio.client.projects.get(987654321)
    assert "headers" in str(caught.value)  # the SDK's own text: response headers, cookies included
    converted = as_retryable(caught.value)
    assert isinstance(converted, LabelStudioError) and str(converted) == "Label Studio answered HTTP 404"


# -- issue 23 item 1: attribution that cannot be forged from Label Studio ---------------------------------

def _cli(monkeypatch, tmp_path, store, *args):
    from typer.testing import CliRunner

    from sense7.cli import app

    monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SENSE7_STORE_URL", store.url)
    return CliRunner().invoke(app, list(args))


def _training(store, owner: str) -> dict:
    """What a retrain would learn from `owner`: {(conversation, turn, dimension): rating}."""
    ratings = store.rating_data(TAXONOMY).ratings
    mine = ratings[ratings["rater_id"] == owner]
    return {(r.conversation_id, int(r.turn_index), r.dimension): int(r.rating) for r in mine.itertuples()}


def test_a_forged_post_under_a_raters_account_is_quarantined_until_accepted(synced, tmp_path, monkeypatch):
    """The probe: staff POST an annotation on rater X's task with completed_by = X's attribution account.
    Label Studio answers 201 and credits X, but no rater-page submission stands behind it: quarantined with
    the reason (webhook path and reconciliation alike), never trained on, the history names the staff user;
    `sense7 ratings accept` (logged; an unknown id is one error line and writes nothing) makes it count."""
    from sense7.labelstudio.label_sync import SyncResult

    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    task = project_tasks(client, syncer.rating_project)[0]
    owner, staff = task.data["rater_id"], client.users.whoami().id
    forged = annotate(client, task, users[owner])  # straight into Label Studio: no outbox submission
    assert user_id_of(client.annotations.get(forged.id).completed_by) == users[owner]  # Label Studio credits X
    result = syncer.sync_named([(syncer.rating_project, task.id, forged.id)], [], SyncResult())  # the webhook's drain
    assert (result.upserted, result.quarantined, result.held, result.credited) == (1, 1, 1, 0)
    [row] = store.quarantined()
    assert row["annotation_id"] == forged.id
    assert row["quarantine"] == (f"written in Label Studio by user {staff}, not on the rater page: no submission "
                                 f"of rater {owner} for task {task.id} has this result")
    assert store.ratings_frame().empty and _training(store, owner) == {}
    [change] = store.history(annotation_id=forged.id)
    assert (change["via"], change["changed_by"], change["new"]["rater_id"]) == ("label studio", staff, None)
    again = syncer.reconcile()  # the periodic reconciliation agrees, and is stable
    assert (again.upserted, again.quarantined) == (0, 1) and len(store.quarantined()) == 1

    before = store.snapshot()
    refused = _cli(monkeypatch, tmp_path, store, "ratings", "accept", str(forged.id), "987654321")
    assert refused.exit_code == 1 and "error: annotation 987654321: not in the store" in " ".join(refused.output.split())
    assert store.snapshot() == before  # all or nothing: the known id was not accepted either
    listed = _cli(monkeypatch, tmp_path, store, "ratings", "quarantined")
    assert f"annotation {forged.id} " in listed.output and "not on the rater page" in " ".join(listed.output.split())

    accepted = _cli(monkeypatch, tmp_path, store, "ratings", "accept", str(forged.id))
    assert accepted.exit_code == 0, accepted.output
    assert f"annotation {forged.id}: counted as rater {owner}'s" in " ".join(accepted.output.split())
    assert store.quarantined() == [] and len(_training(store, owner)) > 0
    [entry] = store.staff_entries()
    assert entry["action"] == "ratings accept" and entry["detail"]["annotation"] == forged.id
    assert store.history(annotation_id=forged.id)[-1]["via"] == "sense7 ratings accept"
    settled = syncer.reconcile()  # Label Studio still holds the accepted version: nothing changes
    assert (settled.upserted, settled.quarantined, settled.held) == (0, 0, 0)
    # Accepting again is refused: nothing is held any more.
    twice = _cli(monkeypatch, tmp_path, store, "ratings", "accept", str(forged.id))
    assert twice.exit_code == 1 and f"annotation {forged.id}: nothing held to accept" in " ".join(twice.output.split())


def test_a_staff_change_to_a_delivered_rating_stays_the_staff_members_until_accepted(synced, tmp_path, monkeypatch):
    """A staff PATCH of a rater's delivered annotation: the history keeps it as the staff member's (the
    delivery as the rater page's), the rater's delivered rating is what a retrain learns until accepted."""
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    task = project_tasks(client, syncer.rating_project)[1]
    owner, staff = task.data["rater_id"], client.users.whoami().id
    delivered = annotate(client, task, users[owner], store=store)  # the rater page's path
    assert syncer.sync_annotation(delivered.id).credited == 1
    rated = _training(store, owner)
    assert rated and rated[(task.data["conversation_id"], task.data["turn_index"], "overall")] != 5
    client.annotations.update(delivered.id, result=rating_result("no such text", bias=3))  # staff PATCH
    changed = syncer.sync_annotation(delivered.id)
    assert (changed.upserted, changed.held, changed.quarantined, changed.credited) == (1, 1, 0, 0)
    assert _training(store, owner) == rated  # the delivered rating, not the staff's
    first, second = store.history(annotation_id=delivered.id)
    assert (first["change"], first["via"], first["changed_by"]) == ("created", "rater page", users[owner])
    assert (second["change"], second["via"], second["changed_by"]) == ("updated", "label studio", staff)
    assert second["new"]["held"]["changed_by"] == staff and second["new"]["held"]["values"]["overall"] == 5
    shown = _cli(monkeypatch, tmp_path, store, "ratings", "history", "--annotation", str(delivered.id))
    text = " ".join(shown.output.split())  # the console wraps long lines
    assert f"created by the rater page (account {users[owner]})" in text
    assert f"updated by user {staff} in Label Studio" in text and "[not counted: " in text
    assert syncer.reconcile().upserted == 0 and _training(store, owner) == rated

    accepted = _cli(monkeypatch, tmp_path, store, "ratings", "accept", str(delivered.id))
    assert accepted.exit_code == 0, accepted.output
    now = _training(store, owner)
    assert {k: v for k, v in now.items() if k[2] != TAXONOMY.expectation_key} == \
        {k: 5 for k in rated if k[2] != TAXONOMY.expectation_key}
    assert store.held() == [] and [e["action"] for e in store.staff_entries()] == ["ratings accept"]
    assert syncer.reconcile().upserted == 0 and _training(store, owner) == now


def user_id_of(value) -> int | None:
    from sense7.labelstudio.protocol import user_id

    return user_id(value)




def test_a_drain_round_looks_up_attribution_per_batch_not_per_annotation(synced):
    """What webhooks named, read in one round: the rater page's submissions, the staff-accepted versions and
    the raters' emails are read once for the batch (not once per annotation), each new author no account is
    kept for (these raters' logins at their own emails) is read once by id, never by listing every user
    (sense7.store.account_ids keeps the attribution accounts: tests/labelstudio/test_sync_attribution.py),
    and every annotation is still credited to its rater; one written in Label Studio directly is still not."""
    from sqlalchemy import event

    from sense7.labelstudio.label_sync import SyncResult

    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    tasks = project_tasks(client, syncer.rating_project)
    anns = [annotate(client, t, users[t.data["rater_id"]], store=store) for t in tasks[:6]]
    forged = annotate(client, tasks[6], users[tasks[6].data["rater_id"]])  # not through the rater page
    named = [(syncer.rating_project, t.id, a.id) for t, a in zip(tasks, anns + [forged])]
    counted = UsersCallLog(client)
    fresh = LabelSync(counted, store, syncer.taxonomy, syncer.rating_project, syncer.profile_project)
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2].lower()))
    result = fresh.sync_named(named, [], SyncResult())
    assert (result.seen, result.upserted, result.credited) == (7, 7, 6)
    assert result.quarantined == 1  # the forged one is not its rater's (held, nobody credited)
    reads = [s for s in statements if s.lstrip().startswith("select")]

    def reading(table: str) -> int:
        return sum(bool(re.search(rf"\bfrom {table}\b", s)) for s in reads)

    assert (reading("submissions"), reading("accepted_versions"), reading("raters")) == (1, 1, 1)
    authors = {users[t.data["rater_id"]] for t in tasks[:7]}
    assert counted.calls == ["get"] * len(authors)  # one small request per new author, no list of every user
    credited = {r for r in store.ratings_frame()["rater_id"].unique()}
    assert credited == {t.data["rater_id"] for t in tasks[:6]}


# -- issue 37 item 9: staff edits outside the result ------------------------------------------------------

def test_a_staff_lead_time_edit_is_held_and_never_makes_a_rater_too_fast(synced, tmp_path, monkeypatch):
    """The probe: staff PATCH `lead_time` to 0.5 s on every delivered rating of rater X. Each change is held
    (the history names the staff user and the time they wrote), X's own seconds on the page keep counting:
    no too_fast flag, X stays in retraining. A revert puts X's time back in Label Studio; an accepted one
    still leaves rater quality on the page's own time."""
    from sense7.labelstudio.label_sync import SyncResult
    from sense7.research.study_analysis import flagged_weights, study_status
    from sense7.settings import QualityPolicy

    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    owner, staff = raters[0]["rater_id"], client.users.whoami().id
    mine = [t for t in project_tasks(client, syncer.rating_project) if t.data["rater_id"] == owner]
    delivered = [annotate(client, t, users[owner], store=store, lead_time=20.0 + i) for i, t in enumerate(mine)]
    assert syncer.reconcile().credited == len(mine) == 4
    policy = QualityPolicy(min_tasks=4)  # judged on these four ratings

    def quality():
        [row] = [r for r in study_status(store, {}, policy)["raters"] if r["rater_id"] == owner]
        return row["median_seconds"], row["flags"], flagged_weights(store, policy)[owner]

    assert quality() == (21.5, [], 1.0)
    for ann in delivered:
        client.annotations.update(ann.id, lead_time=0.5)  # staff, as any Label Studio account may
    changed = syncer.sync_named([(syncer.rating_project, t.id, a.id) for t, a in zip(mine, delivered)], [],
                                SyncResult())  # the webhooks' drain
    assert quality() == (21.5, [], 1.0)  # not too_fast: the page's own seconds
    assert (changed.upserted, changed.held, changed.credited, changed.quarantined) == (4, 4, 0, 0)
    assert syncer.reconcile().upserted == 0  # stable
    first = delivered[0].id
    [row] = [r for r in store.held() if r["annotation_id"] == first]
    assert row["rater_id"] == owner and row["held"]["lead_time"] == 0.5 and row["held"]["changed_by"] == staff
    assert row["held"]["reason"] == (f"written in Label Studio by user {staff}, not on the rater page: no submission "
                                     f"of rater {owner} for task {mine[0].id} has lead_time 0.5")
    change = store.history(annotation_id=first)[-1]
    assert (change["change"], change["via"], change["changed_by"]) == ("updated", "label studio", staff)
    assert change["old"]["lead_time"] == change["new"]["lead_time"] == 20.0
    shown = _cli(monkeypatch, tmp_path, store, "ratings", "history", "--annotation", str(first)).output
    shown = " ".join(shown.split())  # the console wraps long lines
    assert f"updated by user {staff} in Label Studio" in shown and "lead_time=0.5 by user" in shown

    # Reverted: Label Studio has the rater's 20 s again, nothing is held for it, the history grew.
    syncer.revert(change["id"])
    assert client.annotations.get(first).lead_time == 20.0
    assert first not in {r["annotation_id"] for r in store.held()}
    assert store.history(annotation_id=first)[-1]["new"]["held"] is None
    # Accepted (an explicit staff decision): nothing held any more; quality still times the page's work.
    accepted = _cli(monkeypatch, tmp_path, store, "ratings", "accept", *(str(a.id) for a in delivered[1:]))
    assert accepted.exit_code == 0, accepted.output
    assert store.held() == [] and syncer.reconcile().upserted == 0
    assert quality() == (21.5, [], 1.0)


def test_a_staff_cancel_of_a_delivered_rating_is_held_and_revert_restores_it(synced, tmp_path, monkeypatch):
    """The probe: staff PATCH `{"was_cancelled": true}` on rater X's delivered rating. The rating stays in the
    store as X's (held, with the staff user in the history) through webhook syncs and reconciliations; `ratings
    revert` un-cancels it in Label Studio; X answering again on the page un-cancels it too; only an accepted
    cancellation removes the rating."""
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    task = project_tasks(client, syncer.rating_project)[2]
    owner, staff = task.data["rater_id"], client.users.whoami().id
    ann = annotate(client, task, users[owner], store=store, lead_time=12.0)
    assert syncer.sync_annotation(ann.id).credited == 1
    rated = _training(store, owner)

    client.annotations.update(ann.id, was_cancelled=True)
    cancelled = syncer.sync_annotation(ann.id)
    assert (cancelled.deleted, cancelled.held, cancelled.upserted) == (0, 1, 1)
    assert _training(store, owner) == rated and ann.id in store.annotation_versions()
    again = syncer.reconcile()  # the periodic reconciliation keeps it too (it is not a skipped task)
    assert (again.deleted, again.upserted) == (0, 0) and _training(store, owner) == rated
    change = store.history(annotation_id=ann.id)[-1]
    assert (change["change"], change["via"], change["changed_by"]) == ("updated", "label studio", staff)
    assert change["new"]["held"]["cancelled"] is True and change["new"]["rater_id"] == owner
    assert "has was_cancelled true" in change["new"]["held"]["reason"]

    syncer.revert(change["id"])
    restored = client.annotations.get(ann.id)
    assert restored.was_cancelled is False and restored.lead_time == 12.0
    assert store.held() == [] and _training(store, owner) == rated

    # Cancelled again, then the rater answers anew on the page: delivery writes a live answer.
    client.annotations.update(ann.id, was_cancelled=True)
    syncer.sync_annotation(ann.id)
    newer = annotate(client, task, users[owner], store=store, bias=3, lead_time=9.0)
    assert newer.id == ann.id and newer.was_cancelled is False and newer.lead_time == 9.0
    assert syncer.sync_annotation(ann.id).credited == 1 and store.held() == []
    rated = _training(store, owner)

    # Only staff accepting the cancellation removes the rating (logged); it stays removed.
    client.annotations.update(ann.id, was_cancelled=True)
    syncer.sync_annotation(ann.id)
    accepted = _cli(monkeypatch, tmp_path, store, "ratings", "accept", str(ann.id))
    assert accepted.exit_code == 0, accepted.output
    assert f"annotation {ann.id}: cancelled: no rating of rater {owner}'s" in " ".join(accepted.output.split())
    assert _training(store, owner) == {k: v for k, v in rated.items() if k[:2] != (task.data["conversation_id"],
                                                                                     task.data["turn_index"])}
    assert ann.id not in store.annotation_versions()
    settled = syncer.reconcile()
    assert (settled.upserted, settled.deleted, settled.held) == (0, 0, 0) and ann.id not in store.annotation_versions()


def test_a_delivered_rating_given_to_another_author_is_held_and_revert_gives_it_back(synced):
    """Staff PATCH `completed_by` of rater X's delivered rating (to themselves, or to rater Y's account): Label
    Studio no longer credits X, but sense7 delivered this annotation as X's answer: X's rating keeps counting,
    the change is held and named; a revert gives the annotation back to X's account."""
    syncer, raters, users = synced
    client, store = syncer.client, syncer.store
    task = project_tasks(client, syncer.rating_project)[3]
    owner, staff = task.data["rater_id"], client.users.whoami().id
    other = next(r["rater_id"] for r in raters if r["rater_id"] != owner)
    ann = annotate(client, task, users[owner], store=store)
    syncer.sync_annotation(ann.id)
    rated = _training(store, owner)
    for new_author in (staff, users[other]):
        client.annotations.update(ann.id, completed_by=new_author)
        moved = syncer.sync_annotation(ann.id)
        assert (moved.held, moved.quarantined, moved.credited) == (1, 0, 0)
        assert _training(store, owner) == rated and store.quarantined() == []
        change = store.history(annotation_id=ann.id)[-1]
        assert change["via"] == "label studio" and change["changed_by"] == staff
        assert change["new"]["held"]["author"] == new_author
        assert f"has completed_by user {new_author}" in change["new"]["held"]["reason"]
    syncer.revert(change["id"])
    assert user_id_of(client.annotations.get(ann.id).completed_by) == users[owner]
    assert store.held() == [] and _training(store, owner) == rated
