"""Crowd studies' jobs (the work is sense7.crowd and the Label Studio adapters).

`sense7.crowd_prepare` (coalesced): participants who passed the comprehension check hold their slots
(sense7.crowd.lifecycle.start_rating; the page asks at the check and serves the questionnaire from the store
meanwhile, RaterQueue.provide_questionnaire, so the round is rarely waited for; an entry still at the check has no
slot and gets no task). One job works for everyone waiting, however many arrive at once: the rater page asks
with `request_prepare`,
which queues the job unless one is queued or running (queue_once: a Redis flag renewed while it runs). The
job reads who is waiting from the store (participants rating who hold a conversation whose tasks are not in
their queue copy: sense7.crowd.lifecycle.waiting_for_tasks; the first two at the check, then each next one as
it is taken, sense7.crowd.lifecycle.top_up), creates all their assigned tasks in Label Studio in ONE bulk
import (with the served model's pre-annotations and the study's design, exactly as `sense7 import` does),
their questionnaire tasks in one more, copies their queues into the store in one filtered pass, and loops
until nobody is waiting. A burst of arrivals therefore costs a few requests per round, not 8-10 per
participant, and later arrivals join the next round instead of queueing behind one job each.

Idempotent: before importing, the round looks up the tasks that exist among these participants' own
(OR-filtered queries, a few raters each: O(participants), not O(project)), so a retry after a crash
mid-way (Label Studio committed, the job died before the queue copy) creates nothing twice. One job runs
at a time (a lease lock, as delivery's); participants are never lost: the store is the list of who waits,
a starting worker queues the job (tasks/recovery.py), and a job that finished with its flag still set
looks once more after clearing it. Task data carry the pseudonymous rater id only (the platform id never
leaves sense7.crowd's completions table).

`sense7.crowd_expire_leases` (beat, every minute): reservations and leases that ended, and withdrawals, give
their unfinished conversations and seats back (sense7.crowd.lifecycle.expire_leases); with a Prolific API
token (SENSE7_PROLIFIC_TOKEN), so do participants whose submission Prolific reports returned or timed out
(`end_returned_submissions`: at once, not when their lease ends; Prolific down: the next pass asks again).
The Label Studio tasks of given-back items (an expired lease's, a withdrawal's) that nobody answered are
deleted (`clear_released_tasks`): no orphan tasks; ratings already given stay.
"""

from __future__ import annotations

import contextlib
import logging
import time

from celery import shared_task
from sense7.tasks import names
from sense7.tasks.broker import broker_app, lease_or_ask_again, queue_once, redis_client
from sense7.tasks.celery_app import get_app
from sense7.tasks.runtime import RETRY, Runtime, as_retryable, current_runtime, describe_error

log = logging.getLogger(__name__)

SCHEDULED_KEY = "sense7:crowd-prepare:scheduled"  # a prepare job is queued or running (renewed while it
SCHEDULED_TTL = 60                                 # runs; a starting worker clears it: tasks/recovery.py)
LOCK_KEY = "sense7:crowd-prepare:lock"  # the one prepare job that runs (two would import the same people)
HELD_RETRY = 2.0  # (s) a job that found the lock held runs again this much later
ROUND = 200  # participants per round at most (one bulk import each): bounds a round's time and memory
JOB_BUDGET = 120.0  # (s) no new round after this: the job ends and queues its successor (arrivals that never
                    # stop would otherwise keep one job running into its soft time limit, JobSettings.sync_soft_limit)


class StepTimes:
    """Seconds per named step of a round, for its log line (what an operator watches when first turns lag)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.seconds.items())


def request_prepare(study_id: str | None = None, rater_id: str | None = None, app=None) -> bool:
    """Queue the prepare job unless one is queued or running (it takes everyone waiting, so a burst of
    arrivals queues one job). The arguments are who asked (the page passes them); the job reads who waits
    from the store. True when this call queued it."""
    return queue_once(app or broker_app(), SCHEDULED_KEY, SCHEDULED_TTL, names.CROWD_PREPARE)


def _predictor(rt: Runtime):
    """The served model's import predictor, or None (no version yet, or it cannot load): tasks are then
    created without pre-annotations and the pre-annotate job fills them later."""
    try:
        label_config = rt.client.projects.get(rt.rating_project).label_config
        return rt.serving_model.import_predictor(label_config)
    except Exception as exc:
        log.warning("crowd tasks created without pre-annotations (%s)", describe_error(exc))
        return None


def prepare_round(rt: Runtime, waiting: list[tuple[str, str]], predict=None) -> dict[str, int]:
    """Create the tasks of these (study, rater) participants in Label Studio (one bulk import of all their
    assigned conversations, one of their questionnaires) and copy their queues into the store (one filtered
    pass); returns rater -> rating tasks in their queue. Participants no longer seated are left out."""
    from sense7.crowd.lifecycle import conversations_for
    from sense7.crowd.participants import Participants, Studies
    from sense7.store.rater_page_tables import RaterQueue
    from sense7.labelstudio.importer import import_conversations, import_profile_tasks
    from sense7.labelstudio.rater_accounts import copy_queues

    studies, pools, conversations, raters = {}, {}, [], []
    texts = rt.store.conversations_by_id()  # once per round: each participant's conversations are read from it
    for study_id, rater_id in waiting:
        if study_id not in studies:
            found = Studies(rt.store).get(study_id)
            studies[study_id] = found[0] if found else None
            pools[study_id] = Studies(rt.store).pool(study_id) if found else None
        study = studies[study_id]
        if study is None:
            continue
        participant = Participants(rt.store, study).get(rater_id)
        if participant is None or participant.state != "rating":
            continue  # never a task for an entry that has not passed the check
        conversations += conversations_for(rt.store, study, rater_id, pools[study_id], texts)
        raters.append(rater_id)
    if not raters:
        return {}
    steps = StepTimes()
    try:
        with steps("rating tasks"):
            import_conversations(rt.client, rt.rating_project, conversations, rt.store, predict=predict,
                                 design=rt.settings.study, taxonomy=rt.taxonomy, rater_ids=raters)
        with steps("questionnaires"):
            import_profile_tasks(rt.client, rt.profile_project, raters, filtered=True)
        with steps("queue copy"):
            copy_queues(rt.client, rt.store, rt.rating_project, rt.profile_project, rt.taxonomy, raters,
                        filtered=True, make_accounts=False)  # delivery makes new participants' accounts
    except Exception as exc:
        raise as_retryable(exc) from None
    log.info("crowd prepare round: %d participants, %d conversations; %s", len(raters), len(conversations), steps)
    from sense7.store.rater_page_tables import Outbox

    if Outbox(rt.store).has_deliverable():  # questionnaires answered before their task existed are
        from sense7.tasks.delivery import request_delivery  # deliverable now (RaterQueue.replace gave them its id)

        try:
            request_delivery()
        except Exception as exc:  # beat's periodic delivery takes them
            log.warning("could not ask for delivery after a prepare round: %s", describe_error(exc))
    from sense7.crowd.lifecycle import clear_again

    # A lease that ended (or a withdrawal) while the round ran: the tasks just made for them are orphans,
    # cleared by the next expiry pass.
    ended = []
    for study_id, rater_id in waiting:
        if rater_id in raters:
            now = Participants(rt.store, studies[study_id]).get(rater_id)
            if now is None or now.state not in ("rating", "completed"):
                ended.append(rater_id)
    if ended:
        clear_again(rt.store, ended)
    queue = RaterQueue(rt.store)
    return {r: sum(item.kind == "rating" for item in queue.items(r)) for r in raters}


def prepare_waiting(rt: Runtime, on_round=None, limit: int = ROUND, seen: set | None = None,
                    budget: float | None = None) -> dict:
    """Rounds of `prepare_round` over everyone waiting, until nobody is, or `budget` s have passed (a
    participant whose round left a conversation of theirs without tasks is not taken again by this job: the
    next job, or the page's next ask, tries again; `seen` collects them. One given a next conversation while
    their round ran is taken again by the next round). Counts."""

    from sense7.crowd.lifecycle import unprepared, waiting_for_tasks

    seen = set() if seen is None else seen
    started = time.monotonic()
    rounds = participants = tasks = 0
    predict = None
    while True:
        if on_round:
            on_round()
        if budget is not None and time.monotonic() - started > budget:
            break  # the caller queues the next job for whoever still waits
        waiting = waiting_for_tasks(rt.store, limit=limit, skip=seen)
        if not waiting:
            break
        if rounds == 0:
            predict = _predictor(rt)  # once per job: loading the served model is the costly part
        raters = [rater for _, rater in waiting]
        before = unprepared(rt.store, raters)
        made = prepare_round(rt, waiting, predict)
        after = unprepared(rt.store, raters)
        seen.update(r for r in raters if before.get(r, set()) & after.get(r, set()) or r not in made)
        rounds += 1
        participants += len(made)
        tasks += sum(made.values())
    return {"rounds": rounds, "participants": participants, "tasks": tasks}


def prepare_participant(rt: Runtime, study_id: str, rater_id: str) -> int:
    """One participant's round (a retry, a test): their tasks made (none twice) and queue copied; returns
    the rating tasks in their queue (0: nothing to prepare)."""
    return prepare_round(rt, [(study_id, rater_id)], _predictor(rt)).get(rater_id, 0)


@shared_task(name=names.CROWD_PREPARE, **RETRY)
def prepare_task(study_id: str | None = None, rater_id: str | None = None) -> dict:
    """Everyone waiting (the arguments of a message queued by an older page are ignored: the job takes all)."""
    rt = current_runtime()
    app = get_app()
    conn = redis_client(app.conf.broker_url)
    lease = lease_or_ask_again(app, conn, LOCK_KEY, SCHEDULED_KEY, SCHEDULED_TTL, names.CROWD_PREPARE, HELD_RETRY)
    if lease is None:  # another job holds the lock (or a killed worker's lease has not run out yet)
        return {"rounds": 0, "participants": 0, "tasks": 0, "skipped": "another prepare job holds the lock; asked again"}
    seen: set[str] = set()
    try:
        result = prepare_waiting(rt, seen=seen, budget=JOB_BUDGET)
    finally:  # done (or failed: the retry, beat's next expiry pass or the page's next ask queues it again)
        try:
            conn.delete(SCHEDULED_KEY)
        except Exception as exc:
            log.warning("crowd prepare flag not cleared (%s): it expires by itself", describe_error(exc))
        lease.release()
    # A participant who consented (or finished a conversation) after the last round saw the flag still set and
    # queued nothing (someone whose round made nothing is left to the page's next ask: no job chasing its own
    # tail).
    from sense7.crowd.lifecycle import waiting_for_tasks

    if waiting_for_tasks(rt.store, limit=1, skip=seen):
        request_prepare()
    return result


ENDED = ("abandoned", "screened_out", "completed", "full", "withdrawn")  # their unanswered questionnaire goes too


def clear_released_tasks(rt: Runtime) -> int:
    """Delete the Label Studio tasks of given-back conversations that their participant left unanswered
    (and the questionnaire of a participant who ended without answering it), so no orphan task stays for
    exports and staff to trip over; answered tasks stay (ratings given are kept), and so does a task with a
    page submission not delivered yet. One OR-filtered read per few participants and one bulk delete
    (the Data Manager's delete_tasks action) per project; idempotent (a repeat finds them gone) and
    resumable (the store marks each given-back row once its tasks are cleared). Returns tasks deleted."""
    from sense7.crowd.lifecycle import answered_tasks, forget_tasks, mark_cleared, released_to_clear
    from sense7.labelstudio.client import raters_tasks

    pending = {entry.rater_id: entry for entry in released_to_clear(rt.store)}
    if not pending:
        return 0
    answered = {rater: answered_tasks(rt.store, rater) for rater in pending}
    doomed: dict[int, list[int]] = {}
    by_rater: dict[str, list[int]] = {}
    try:
        for project, kind in ((rt.rating_project, "rating"), (rt.profile_project, "profile")):
            for task in raters_tasks(rt.client, project, list(pending), fields="task_only",
                                     include="id,data,total_annotations"):
                data, entry = task.data or {}, pending[(task.data or {}).get("rater_id")]
                if (getattr(task, "total_annotations", None) or 0) > 0 or task.id in answered[entry.rater_id]:
                    continue  # a rating given (or on its way to Label Studio) stays
                if kind == "rating" and data.get("conversation_id") not in entry.conversations:
                    continue
                if kind == "profile" and entry.state not in ENDED:
                    continue
                doomed.setdefault(project, []).append(task.id)
                by_rater.setdefault(entry.rater_id, []).append(task.id)
        for project, ids in doomed.items():
            rt.client.actions.create(id="delete_tasks", project=project,
                                     selected_items={"all": False, "included": sorted(ids)})
    except Exception as exc:
        raise as_retryable(exc) from None
    for rater, ids in by_rater.items():
        forget_tasks(rt.store, rater, ids)
    mark_cleared(rt.store, [row for entry in pending.values() for row in entry.rows])
    return sum(len(ids) for ids in doomed.values())


def end_returned_submissions(store, prolific) -> dict:
    """Participants (checking or rating) whose Prolific submission was returned or timed out: abandoned now,
    their slots and seat free for the next participant (sense7.crowd.lifecycle.end_returned). `prolific`: a
    sense7.crowd.prolific.ProlificClient. A study Prolific cannot answer for is asked again next pass."""
    from sense7.crowd.lifecycle import Expired, end_returned
    from sense7.crowd.participants import Participants, Studies
    from sense7.crowd.prolific import ProlificUnavailable

    studies, total = Studies(store), Expired()
    for study_id in studies.ids():
        study = studies.get(study_id)[0]
        for platform_study in sorted(Participants(store, study).platform_studies()):
            try:
                left = prolific.participants_left(platform_study)
            except ProlificUnavailable as exc:
                log.warning("Prolific's API did not answer (%s): returned submissions are freed next pass", exc)
                continue
            ended = end_returned(store, study, left)
            total.participants += ended.participants
            total.released += ended.released
    return {"participants": total.participants, "released": total.released}


@shared_task(name=names.CROWD_EXPIRE)
def expire_task() -> dict:
    from sense7.crowd.lifecycle import expire_leases, waiting_for_tasks
    from sense7.crowd.prolific import ProlificClient

    rt = current_runtime()
    result = expire_leases(rt.store)
    prolific = ProlificClient.from_settings(rt.settings)
    returned = end_returned_submissions(rt.store, prolific) if prolific else {"participants": 0, "released": 0}
    try:
        cleared = clear_released_tasks(rt)
    except Exception as exc:  # Label Studio down: the next pass (a minute later) clears them
        log.warning("given-back crowd tasks not cleared yet: %s", describe_error(exc))
        cleared = 0
    if waiting_for_tasks(rt.store, limit=1):  # a safety net: nobody waits on a job that was lost
        try:
            request_prepare()
        except Exception as exc:
            log.warning("could not ask for the crowd prepare job: %s", describe_error(exc))
    return {"participants": result.participants, "released": result.released, "withdrawn": result.withdrawn,
            "returned": returned["participants"], "tasks_deleted": cleared}
