"""Sync labels from Label Studio into the store (the domain service the sync jobs of sense7.tasks.sync run).

Label Studio's webhooks are fire-and-forget (1 s timeout, no retry), so they only *hint* that something
changed: the webhook names the annotation, and the sync reads the truth from the API. The periodic
`reconcile` reads every annotation of both projects (page by page) and is the source of truth:
upserts are keyed by annotation id + updated time, and annotations no longer in Label Studio are marked
deleted in the store.

Who rated: `completed_by` (a Label Studio user id) -> the rater whose attribution account it is, as the store
keeps it (sense7.store.account_ids: one indexed query, no Label Studio request). An author not kept there
(staff, an account made before accounts were kept) -> that user's email (users API: one `get` per new
author; only a reconciliation lists every user, and only when it meets one) -> our rater id
(`raters_by_email`: the rater's attribution address, or the email the store has for them). Attribution is
never guessed: an annotation whose author is not a known rater, or is a rater other than the task's own, is
*quarantined*: stored with the reason, counted, never trained on. A questionnaire answer changes traits only
when the rater it asks about wrote it. (Staff who enter a paper form use `sense7 ratings import`: an explicit,
logged entry.) Every change is kept in the store's rating history.

Label Studio cannot tell who wrote under an account (every account is staff, and the delivery job writes
with the service token): so an annotation credited to a rater counts as theirs only when a rater-page
submission stands behind it (the outbox, sense7.store.rater_page_tables.Outbox: same task, same *version*) or staff
accepted that version (`sense7 ratings accept`, logged). A version is everything of an annotation the store
believes: the result (compared as parsed levels, expectation and comment), the seconds on the task
(`lead_time`: the rater page's own, which delivery writes), whether it was cancelled (skipped), and its
author (`completed_by`: the rater's own account, or, on an annotation delivered as the task's rater's and
re-assigned since, whoever it names now). Anything else written there is *held*: kept with its author and
reason, shown in the history as a Label Studio change, never trained on as the rater's. What counts instead
is the rater's last delivered (or accepted) version of that annotation; with none, the annotation is
quarantined. A cancelled annotation nothing of a rater's stands behind is a skipped task: no rating.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from label_studio_sdk.core.api_error import ApiError

from sense7.labelstudio.client import list_tasks
from sense7.labelstudio.protocol import (
    ensure_webhook,
    iso_time,
    parse_annotation,
    parse_profile_annotation,
    rating_result,
    user_id,
)
from sense7.labelstudio.rater_accounts import account_email, ensure_account, raters_by_email
from sense7.store.account_ids import AccountIds
from sense7.store.rater_page_tables import Outbox
from sense7.taxonomy import Taxonomy


@dataclass
class SyncResult:
    seen: int = 0          # annotations read from Label Studio
    upserted: int = 0      # new or changed rows written
    unchanged: int = 0     # already stored at this version
    deleted: int = 0       # marked deleted in the store (gone from Label Studio, or cancelled)
    quarantined: int = 0   # annotations credited to nobody: author not a known rater, or not the task's rater
    credited: int = 0      # new or changed rows credited to a rater (what counts toward a retrain)
    invalid: list[str] = field(default_factory=list)  # annotation id + reason, skipped
    profiles: int = 0      # questionnaire answers written to rater traits
    held: int = 0          # versions credited to a rater's account that no submission stands behind (not counted)

    def as_dict(self) -> dict:
        return asdict(self)


def _seconds(value) -> float | None:
    """Seconds on the task (Label Studio's lead_time, a submission's) when a sane number, else None; to the
    millisecond, as delivery writes them (sense7.labelstudio.rater_accounts.write_annotation)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return round(seconds, 3) if 0 <= seconds < 10 ** 7 else None


# The history's `via`: who wrote a change.
VIA_RATER_PAGE = "rater page"
VIA_LABEL_STUDIO = "label studio"
VIA_ACCEPTED = "sense7 ratings accept"


def rating_version(result: list[dict], taxonomy: Taxonomy) -> dict:
    """What a rating annotation says, in the one form results are compared in ("same result"): the levels
    per control, the expectation answer and the comment (item order, ids and ignored items do not count)."""
    values, expectation, comment = parse_annotation(result or [], taxonomy)
    return {"values": dict(sorted(values.items())), "expectation": expectation, "comment": comment}


# A version's `author`: None when the rater's own account wrote it; on an annotation delivered as its task's
# rater's and re-assigned since, the Label Studio user it names now, or NO_USER (a deleted user, say).
NO_USER = "none"


def submitted_version(revision: dict, taxonomy: Taxonomy) -> dict:
    """What a rater-page submission (an outbox row) delivers, as annotation versions are compared: its result,
    its seconds on the page (delivered as the annotation's lead_time), never cancelled, by the rater's own
    account (author None)."""
    return {**rating_version(revision["result"], taxonomy), "lead_time": _seconds(revision.get("lead_time")),
            "cancelled": False, "author": None}


def same_version(accepted: dict, version: dict) -> bool:
    """Whether a version staff accepted is `version`. One accepted before lead times, cancellations and
    authors were compared names none of them: it was live and by the rater's account, at any lead time."""
    defaults = {"cancelled": False, "author": None}
    for key, value in version.items():
        if key in accepted:
            if accepted[key] != value:
                return False
        elif key == "lead_time":
            continue
        elif key not in defaults or defaults[key] != value:
            return False
    return True


def changed_fields(version: dict, instead: dict | None) -> str:
    """What of `version` no submission has, as staff would have written it in Label Studio."""
    if instead is None:
        return "this result"
    parts = []
    if any(version.get(k) != instead.get(k) for k in ("values", "expectation", "comment")):
        parts.append("this result")
    if version.get("lead_time") != instead.get("lead_time"):
        parts.append(f"lead_time {version.get('lead_time')}")
    if version.get("cancelled") != instead.get("cancelled"):
        parts.append(f"was_cancelled {str(bool(version.get('cancelled'))).lower()}")
    if version.get("author") != instead.get("author"):
        parts.append(f"completed_by user {version.get('author')}")
    return " and ".join(parts) or "this result"


def _naive(moment):
    """Store times compared across tables (SQLite gives them without a zone, PostgreSQL with UTC)."""
    return moment.replace(tzinfo=None) if moment is not None and moment.tzinfo else moment


def parse_profile_result(result: list[dict], taxonomy: Taxonomy) -> tuple[dict, list[str]]:
    """Questionnaire answers -> (valid {field: value}, the profile fields whose answers were invalid)."""
    answers = parse_profile_annotation(result, taxonomy)
    fields = {f.key for f in taxonomy.profile_fields}
    answered = {item.get("from_name") for item in result or [] if item.get("from_name") in fields}
    return answers, sorted(answered - set(answers))


class LabelSync:
    """Reads annotations from Label Studio and writes them to the store (idempotently)."""

    def __init__(self, client, store, taxonomy: Taxonomy, rating_project: int, profile_project: int | None = None,
                 user_emails: dict[int, str] | None = None):
        self.client = client
        self.store = store
        self.taxonomy = taxonomy
        self.rating_project = rating_project
        self.profile_project = profile_project
        # Label Studio user id -> email, of authors the kept accounts do not name. A worker passes one dict
        # for its life (an email never changes for a user id; a new user is fetched on first sight), saving
        # a users call per webhook job.
        self._emails: dict[int, str] = {} if user_emails is None else user_emails
        # Loaded once per batch or reconciliation so that 10,000 annotations cost no per-row lookups:
        self._rater_by_account: dict[int, str] | None = None  # kept accounts (the batch's authors' or all)
        self._rater_by_email: dict[str, str] | None = None
        self._stored: dict[int, tuple] | None = None  # annotation id -> (updated_at, rater, quarantine, held)
        self._submitted: dict[tuple[str, int], list[dict]] | None = None  # (rater, task) -> outbox revisions
        self._accepted: dict[int, list[dict]] | None = None  # annotation id -> versions staff accepted
        # Whether a user missing from the emails may be found by listing every user rather than one `get`:
        # a reconciliation only (it reads every annotation anyway), once (email_of clears it).
        self._may_list = False

    @classmethod
    def from_runtime(cls, rt) -> "LabelSync":
        """From a job's runtime (sense7.tasks.runtime.Runtime: client, store, taxonomy, project ids, and the
        user emails its process already knows)."""
        rating, profile = rt.project_ids
        return cls(rt.client, rt.store, rt.taxonomy, rating, profile, user_emails=rt.user_emails)

    # -- users ---------------------------------------------------------------------------------------
    def _load_users(self) -> None:
        self._emails.clear()
        self._emails.update({u.id: (u.email or "").strip().lower() for u in self.client.users.list()})

    def email_of(self, user_id) -> str | None:
        if isinstance(user_id, dict):  # some export formats inline the user
            return (user_id.get("email") or "").strip().lower() or None
        if user_id is None:
            return None
        if user_id not in self._emails and self._may_list:
            # A reconciliation meeting an author nobody keeps and no earlier job met (a store whose accounts
            # predate revision 0004, say): one list instead of a request per such author.
            self._may_list = False
            self._load_users()
        if user_id not in self._emails:  # a sync job: one small request, whatever the number of users
            try:
                self._emails[user_id] = (self.client.users.get(user_id).email or "").strip().lower()
            except ApiError as exc:
                if exc.status_code != 404:
                    raise
                return None
        return self._emails.get(user_id) or None

    def kept_rater(self, completed_by) -> str | None:
        """The rater whose kept attribution account wrote the annotation (sense7.store.account_ids), else
        None: from the batch's map when one is loaded, otherwise with one indexed query."""
        account = user_id(completed_by)
        if account is None:
            return None
        if self._rater_by_account is not None:
            return self._rater_by_account.get(account)
        return AccountIds(self.store).raters_of([account]).get(account)

    def author_rater(self, completed_by, expected: str | None = None) -> str | None:
        """The rater who wrote an annotation; None when the author is no rater. First the kept accounts
        (no Label Studio request); for an author not kept, its email (email_of) read back to a rater.
        `expected`: the rater it most likely is (the task's own), checked first with one indexed query
        where no batch map is loaded: a single annotation's sync then costs the same at any number of
        raters, and the whole map is built only when the author is somebody else."""
        kept = self.kept_rater(completed_by)
        if kept is not None:
            return kept
        email = self.email_of(completed_by)
        if not email:
            return None
        if self._rater_by_email is None and expected:
            stored = self.store.rater_emails(every_rater=True, rater_ids=[expected])
            if expected in stored and email in (account_email(expected), stored[expected]):
                return expected
        known = self._rater_by_email if self._rater_by_email is not None else raters_by_email(self.store)
        return known.get(email)

    def attribution(self, completed_by, task_data: dict) -> tuple[str | None, str | None]:
        """(rater, None) when the task's own rater wrote the annotation, else (None, why not)."""
        author = user_id(completed_by)
        owner = task_data.get("rater_id")
        rater = self.author_rater(completed_by, expected=str(owner) if owner not in (None, "") else None)
        if rater is None:
            return None, f"author (Label Studio user {author}) is not a known rater"
        if owner not in (None, "") and str(owner) != rater:
            return None, f"rater {rater} answered a task of rater {owner}"
        return rater, None

    # -- what stands behind an annotation ----------------------------------------------------------------
    def _revisions(self, rater: str, task_id: int) -> list[dict]:
        if self._submitted is not None:
            return self._submitted.get((rater, task_id), [])
        return Outbox(self.store).revisions(rater, task_id).get((rater, task_id), [])

    def _accepted_versions(self, annotation_id: int) -> list[dict]:
        if self._accepted is not None:
            return self._accepted.get(annotation_id, [])
        return self.store.accepted_versions(annotation_id).get(annotation_id, [])

    def delivered_to(self, rater: str, task_id: int, annotation_id: int) -> bool:
        """Whether delivery wrote a submission of `rater` for the task as this very annotation."""
        return any(r["annotation_id"] == annotation_id and r["delivered_at"] is not None
                   for r in self._revisions(rater, task_id))

    def standing(self, rater: str, task_id: int, annotation_id: int, version: dict,
                 of_revision=None) -> tuple[str | None, dict | None]:
        """(who wrote this version, None) when it counts as `rater`'s: VIA_RATER_PAGE when a submission of
        theirs for the task has it (the newest delivered one, or a newer one on its way: delivery writes
        before it marks), VIA_ACCEPTED when staff accepted it for this annotation. Otherwise (None, what
        counts instead): the newer of their last version delivered to this annotation and the last accepted
        one, or None. `of_revision`: outbox row -> version (submitted_version by default)."""
        of_revision = of_revision or (lambda revision: submitted_version(revision, self.taxonomy))
        revisions = [r for r in self._revisions(rater, task_id) if r["annotation_id"] in (None, annotation_id)]
        delivered = [r for r in revisions if r["delivered_at"] is not None]
        newest = delivered[-1] if delivered else None
        behind = ([newest] if newest else []) + [r for r in revisions if r["delivered_at"] is None
                                                  and (newest is None or r["revision"] > newest["revision"])]
        if any(of_revision(r) == version for r in behind):
            return VIA_RATER_PAGE, None
        accepted = [a for a in self._accepted_versions(annotation_id) if a["rater_id"] == rater]
        if any(same_version(a, version) for a in accepted):
            return VIA_ACCEPTED, None
        options = []
        if newest is not None:
            options.append((_naive(newest["delivered_at"]), of_revision(newest)))
        if accepted:
            last = accepted[-1]
            options.append((_naive(last["accepted_at"]), {"cancelled": False, "author": None, "lead_time": None,
                                                         **{k: last[k] for k in version if k in last}}))
        return None, (max(options, key=lambda option: option[0])[1] if options else None)

    # -- one annotation --------------------------------------------------------------------------------
    def _skipped(self, annotation_id: int, result: SyncResult, changed_by: int | None = None) -> bool:
        """A cancelled (skipped) annotation that is nobody's rating: no rating in the store. False."""
        if self._stored is None or annotation_id in self._stored:
            result.deleted += int(self.store.delete_annotation(annotation_id, changed_by=changed_by))
        return False

    def apply(self, annotation: dict, task_data: dict, project: int, result: SyncResult) -> bool:
        """Write one annotation (as Label Studio returns it) to the store. False when it is no rating: a
        skipped (cancelled) task that no delivered or accepted rating stands behind."""
        ann_id = int(annotation["id"])
        result.seen += 1
        cancelled = bool(annotation.get("was_cancelled"))
        author = user_id(annotation.get("completed_by"))
        changer = user_id(annotation.get("updated_by")) or author
        if project == self.profile_project:
            if cancelled:
                return self._skipped(ann_id, result, changer)
            self._apply_profile(annotation, task_data, result)
            return True
        try:
            values, expectation, comment = parse_annotation(annotation.get("result") or [], self.taxonomy)
            conversation_id = str(task_data["conversation_id"])
            turn = task_data.get("turn_index")
            turn_index = None if turn in (None, "") else int(turn)
        except (ValueError, KeyError, TypeError) as exc:
            if cancelled:
                return self._skipped(ann_id, result, changer)
            result.invalid.append(f"annotation {ann_id}: {exc}")
            return True
        task_id = int(annotation["task"])
        rater, quarantine = self.attribution(annotation.get("completed_by"), task_data)
        owner = task_data.get("rater_id")
        reassigned = (rater is None and owner not in (None, "")
                      and self.delivered_to(str(owner), task_id, ann_id))
        if reassigned:  # delivered as the owner's answer, its completed_by changed since: still theirs, held
            rater, quarantine = str(owner), None
        version = {"values": dict(sorted(values.items())), "expectation": expectation, "comment": comment,
                   "lead_time": _seconds(annotation.get("lead_time")), "cancelled": cancelled,
                   "author": (NO_USER if author is None else author) if reassigned else None}
        if cancelled and rater is None:
            return self._skipped(ann_id, result, changer)
        counted, held, via = version, None, VIA_LABEL_STUDIO
        if rater is not None:
            via, instead = self.standing(rater, task_id, ann_id, version)
            if via is None:  # written in Label Studio under the rater's account: not the rater's word
                if cancelled and instead is None:  # their account skipped a task: nothing of theirs to keep
                    return self._skipped(ann_id, result, changer)
                via = VIA_LABEL_STUDIO
                reason = (f"written in Label Studio by user {changer}, not on the rater page: no submission of "
                          f"rater {rater} for task {task_id} has {changed_fields(version, instead)}")
                held = {"rater_id": rater, **version, "changed_by": changer, "reason": reason}
                result.held += 1
                if instead is not None:
                    counted = instead  # the rater's own last version keeps counting
                else:
                    rater, quarantine = None, reason
        if counted["cancelled"]:  # staff accepted the cancellation: no rating any more
            return self._skipped(ann_id, result, changer)
        result.quarantined += quarantine is not None
        updated_at = iso_time(annotation.get("updated_at"))
        if self._stored is not None and self._stored.get(ann_id) == (updated_at, rater, quarantine, held):
            result.unchanged += 1  # the same version is stored: skip the write transaction
            return True
        changed = self.store.upsert_annotation(
            ann_id, task_id, conversation_id, turn_index, rater,
            updated_at, counted["values"], counted["expectation"], counted["comment"], author_id=author,
            quarantine=quarantine, held=held, via=via,
            changed_by=author if via == VIA_RATER_PAGE else changer, lead_time=counted["lead_time"],
            created_at=iso_time(annotation.get("created_at")) if annotation.get("created_at") else None,
            repeat_of=task_data.get("repeat_of") or None)
        result.credited += bool(changed and rater is not None and held is None)  # a held change adds nothing
        if changed:
            result.upserted += 1
        else:
            result.unchanged += 1
        return True

    def _apply_profile(self, annotation: dict, task_data: dict, result: SyncResult) -> None:
        answers, bad = parse_profile_result(annotation.get("result") or [], self.taxonomy)
        if bad:  # the valid answers are still kept
            result.invalid.append(f"profile annotation {annotation['id']}: invalid answer for {', '.join(bad)}")
        rater, quarantine = self.attribution(annotation.get("completed_by"), task_data)
        if rater is not None:
            via, _ = self.standing(rater, int(annotation["task"]), int(annotation["id"]), answers,
                                   of_revision=lambda revision: parse_profile_result(revision["result"],
                                                                                     self.taxonomy)[0])
            if via is None:
                rater = None
                quarantine = (f"written in Label Studio by user {user_id(annotation.get('updated_by'))}, not on the "
                              f"rater page: no questionnaire submission has these answers")
        if rater is None:  # nobody's traits change on a stranger's word
            result.quarantined += 1
            result.invalid.append(f"profile annotation {annotation['id']}: {quarantine}")
            return
        self.store.update_traits(rater, answers)
        result.profiles += 1

    def sync_annotation(self, annotation_id: int) -> SyncResult:
        """Fetch one annotation from the API (the truth, not the webhook payload) and store it."""
        result = SyncResult()
        try:
            ann = self.client.annotations.get(annotation_id)
        except ApiError as exc:
            if exc.status_code == 404:
                result.deleted += int(self.store.delete_annotation(annotation_id))
                return result
            raise
        project = ann.project
        if project not in (self.rating_project, self.profile_project):
            return result  # another project's annotation: not ours
        task = self.client.tasks.get(ann.task)
        annotation = ann.model_dump(mode="json") if hasattr(ann, "model_dump") else ann.dict()
        annotation["updated_at"] = iso_time(ann.updated_at)
        self.apply(annotation, dict(task.data or {}), project, result)
        return result

    def sync_tasks(self, project: int, annotations_by_task: dict[int, set[int]],
                   result: SyncResult | None = None, batch: int = 200) -> SyncResult:
        """Store every annotation of these tasks, reading up to `batch` tasks (with their annotations)
        per Label Studio request: the coalesced form of sync_annotation. An annotation named here that its
        task no longer holds was deleted. Tasks of another project are not ours and are skipped."""
        result = result or SyncResult()
        if project not in (self.rating_project, self.profile_project):
            return result
        ids = sorted(annotations_by_task)
        for start in range(0, len(ids), batch):
            part = ids[start:start + batch]
            query = json.dumps({"selectedItems": {"all": False, "included": part}})
            found = set()
            # fields="all": annotations in full (with `include` Label Studio drops their author and times).
            # One more than asked for per page: a full page would make list_tasks ask for a next one (a
            # second filtered query, answered 404), doubling the requests of every drain round.
            tasks = list(list_tasks(self.client, len(part) + 1, project=project, fields="all", query=query))
            self._preload(tasks)
            try:
                self._apply_tasks(tasks, project, annotations_by_task, found, result)
            finally:
                self._rater_by_account = self._rater_by_email = self._submitted = self._accepted = None
            for task_id in set(part) - found:  # the task itself was deleted
                for gone in annotations_by_task[task_id]:
                    result.deleted += int(self.store.delete_annotation(gone))
        return result

    def _preload(self, tasks: list) -> None:
        """What `apply` looks up per annotation, for a batch of tasks in three queries instead of three per
        annotation: the raters' emails, the rater page's submissions for these tasks and the versions staff
        accepted for these annotations. Read after the tasks, so a submission behind an annotation read
        here is in the outbox already (delivery writes to Label Studio after the submission is stored)."""
        annotations = [dict(a) for task in tasks for a in task.annotations or []]
        ids = [int(a["id"]) for a in annotations]
        authors = {user_id(a.get("completed_by")) for a in annotations}
        self._rater_by_account = AccountIds(self.store).raters_of(authors - {None})
        # The address map only when an author is no kept account (staff, say): one read of the raters.
        self._rater_by_email = raters_by_email(self.store) if authors - set(self._rater_by_account) else {}
        self._submitted = Outbox(self.store).revisions(task_ids=[task.id for task in tasks])
        self._accepted = self.store.accepted_versions(annotation_ids=ids)

    def _apply_tasks(self, tasks: list, project: int, annotations_by_task: dict[int, set[int]], found: set,
                     result: SyncResult) -> None:
        for task in tasks:
            found.add(task.id)
            present = set()
            for annotation in task.annotations or []:
                annotation = dict(annotation)
                annotation.setdefault("task", task.id)
                present.add(int(annotation["id"]))
                self.apply(annotation, dict(task.data or {}), project, result)
            for gone in annotations_by_task.get(task.id, set()) - present:
                result.deleted += int(self.store.delete_annotation(gone))

    def sync_named(self, named: list[tuple[int, int, int]], deleted: list[int], result: SyncResult) -> SyncResult:
        """What webhooks named: (project, task, annotation) triples read per task in batches (sync_tasks),
        and deletions to verify (delete_annotations); counts added to `result`."""
        by_project: dict[int, dict[int, set[int]]] = {}
        for project, task, annotation in named:
            by_project.setdefault(project, {}).setdefault(task, set()).add(annotation)
        for project, tasks in by_project.items():
            self.sync_tasks(project, tasks, result)
        if deleted:
            result.deleted += self.delete_annotations(deleted).deleted
        return result

    def delete_annotations(self, annotation_ids: list[int]) -> SyncResult:
        """A deletion webhook: believe it only after the API confirms the annotation is gone."""
        result = SyncResult()
        for ann_id in annotation_ids:
            one = self.sync_annotation(int(ann_id))
            result.deleted += one.deleted
            result.upserted += one.upserted
            result.unchanged += one.unchanged
        return result

    # -- history ---------------------------------------------------------------------------------------
    def revert(self, change_id: int) -> SyncResult:
        """Undo one recorded change in Label Studio (the system of record), then sync the annotation so the
        store follows: an edit gets its earlier version back (result, lead_time, not cancelled, and the
        rater's account as completed_by when it was re-assigned), a deletion is re-created with its original
        author (so it stays attributed to its rater), a creation is deleted. The revert itself is a new
        change in the history."""
        entries = self.store.history(change_id=change_id)
        if not entries:
            raise LookupError(f"no rating change #{change_id} (see `sense7 ratings history`)")
        entry = entries[0]
        before, ann_id = entry["old"], entry["annotation_id"]
        try:
            current = self.client.annotations.get(ann_id)
        except ApiError as exc:
            if exc.status_code != 404:
                raise
            current = None
        if before is None:  # the change created it: remove it
            if current is not None:
                self.client.annotations.delete(ann_id)
            return self.sync_annotation(ann_id)
        result = rating_result(before["values"], self.taxonomy, before.get("expectation"), before.get("comment"))
        # A live rating is never a skipped one; its seconds on the task as they were (if the change kept them).
        restored = {"result": result, "was_cancelled": False,
                    **({"lead_time": before["lead_time"]} if "lead_time" in before else {})}
        if current is not None:
            account = self._rater_account(before, user_id(current.completed_by))
            self.client.annotations.update(ann_id, **restored, **({"completed_by": account} if account else {}))
            self._accept_restored(ann_id, before)
            return self.sync_annotation(ann_id)
        if entry["task_id"] is None:
            raise LookupError(f"change #{change_id} does not record its task: it cannot be re-created")
        author = self._rater_account(before, before.get("author_id")) or before.get("author_id")
        created = self.client.annotations.create(entry["task_id"], completed_by=author, **restored)
        self._accept_restored(created.id, before)
        return self.sync_annotation(created.id)

    def _rater_account(self, before: dict, author: int | None) -> int | None:
        """When what counted was a rater's and `author` is not their account (re-assigned in Label Studio since):
        the rater's account, the one delivery writes as. Else None (the author stays)."""
        rater = before.get("rater_id")
        if rater and self.author_rater(author, rater) != rater:
            return ensure_account(self.client, self.store, rater)
        return None

    def _accept_restored(self, annotation_id: int, before: dict) -> None:
        """A revert restores what counted as a rater's: an explicit staff command, so that version keeps
        counting as theirs (an accepted version) although no submission of the rater page has it now."""
        if before.get("rater_id"):
            self.store.record_accepted(annotation_id, before["rater_id"], before)

    # -- reconciliation --------------------------------------------------------------------------------
    # Tasks per Label Studio request during a reconciliation. One export request for the whole project
    # timed out (over 120 s) at 56,000 annotations; pages keep every request short at any size.
    RECONCILE_PAGE = 1000

    def exported_tasks(self, project: int) -> Iterator[dict]:
        """Every annotated task of the project with its annotations in full, page by page (the Data
        Manager's list, filtered to tasks with annotations, in id order)."""
        query = json.dumps({"filters": {"conjunction": "or", "items": [
            {"filter": "filter:tasks:total_annotations", "operator": "greater", "type": "Number", "value": 0},
            {"filter": "filter:tasks:cancelled_annotations", "operator": "greater", "type": "Number", "value": 0}]}})
        for task in list_tasks(self.client, self.RECONCILE_PAGE, project=project, fields="all", query=query):
            # The same shapes as the drain's reads (sync_tasks), so `apply` sees one kind of annotation.
            yield {"id": task.id, "data": dict(task.data or {}),
                   "annotations": [dict(a) for a in task.annotations or []]}

    def reconcile(self) -> SyncResult:
        """Make the store equal to Label Studio for both projects (the source of truth)."""
        result = SyncResult()
        self._may_list = True
        self._rater_by_account = AccountIds(self.store).raters_of()
        self._rater_by_email = raters_by_email(self.store)
        self._stored = self.store.annotation_states()
        self._submitted = Outbox(self.store).revisions()
        self._accepted = self.store.accepted_versions()
        try:
            return self._reconcile(result)
        finally:
            self._may_list = False
            self._rater_by_account = self._rater_by_email = self._stored = self._submitted = self._accepted = None

    def _reconcile(self, result: SyncResult) -> SyncResult:
        live: set[int] = set()
        for project in (self.rating_project, self.profile_project):
            if project is None:
                continue
            for task in self.exported_tasks(project):
                data = task.get("data") or {}
                for annotation in task.get("annotations") or []:
                    annotation.setdefault("task", task["id"])
                    if self.apply(annotation, data, project, result) and project == self.rating_project:
                        live.add(int(annotation["id"]))  # (a cancelled one held as a rater's rating too)
        for ann_id in set(self._stored) - live:
            result.deleted += int(self.store.delete_annotation(ann_id))
        return result

    # -- webhook registration --------------------------------------------------------------------------
    def ensure_webhooks(self, url: str, headers: dict) -> list[int]:
        """Register (once per project) the webhook that tells us about annotation changes; returns ids.
        Running it again changes nothing; a hook with the same URL but other settings is updated, and
        duplicates (which would deliver every event twice) are removed. `headers`: webhook_headers()."""
        return [ensure_webhook(self.client, project, url, headers)
                for project in (self.rating_project, self.profile_project) if project is not None]
