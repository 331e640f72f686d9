"""Crowd studies' jobs (the work is sense7.crowd and the Label Studio adapters).

`sense7.crowd_prepare(study, rater)`: a participant consented and holds their slots
(sense7.crowd.lifecycle.take_slots; asked at consent, so the work overlaps their comprehension check); their tasks are created in Label Studio for the assigned
conversations only (bulk, with the served model's pre-annotations and the study's design, exactly as
`sense7 import` does), with their questionnaire task, and their queue is copied into the store. The rater
page never waits for Label Studio: it shows "preparing" until the copy is there. Idempotent: a retry skips
tasks that exist, looked up among the participant's own tasks (a filtered query: the job costs O(participant),
not O(project)). Task data carry the pseudonymous rater id only (the platform id never leaves
sense7.crowd's completions table).

`sense7.crowd_expire_leases` (beat, every minute): leases that ended give their unfinished conversations
back to the pool (sense7.crowd.lifecycle.expire_leases).
"""

from __future__ import annotations

import logging

from celery import shared_task
from sense7.tasks import names
from sense7.tasks.broker import broker_app, queue_once, redis_client
from sense7.tasks.celery_app import get_app
from sense7.tasks.runtime import RETRY, Runtime, as_retryable, current_runtime, describe_error

log = logging.getLogger(__name__)


PREPARE_FLAG_TTL = 120  # (s) a participant's job queued or running: asking again meanwhile queues nothing


def prepare_flag(rater_id: str) -> str:
    return f"sense7:crowd-prepare:{rater_id}"


def request_prepare(study_id: str, rater_id: str, app=None) -> bool:
    """Queue the participant's job unless one is queued or running (a burst of arrivals must not queue the
    same work twice: the page asks at consent and again if the participant waits). True when queued."""
    return queue_once(app or broker_app(), prepare_flag(rater_id), PREPARE_FLAG_TTL, names.CROWD_PREPARE,
                      args=(study_id, rater_id))


def _predictor(rt: Runtime):
    """The served model's import predictor, or None (no version yet, or it cannot load): tasks are then
    created without pre-annotations and the pre-annotate job fills them later."""
    try:
        label_config = rt.client.projects.get(rt.rating_project).label_config
        return rt.serving_model.import_predictor(label_config)
    except Exception as exc:
        log.warning("crowd tasks created without pre-annotations (%s)", describe_error(exc))
        return None


def prepare_participant(rt: Runtime, study_id: str, rater_id: str) -> int:
    """Create the participant's assigned tasks and questionnaire in Label Studio and copy their queue into
    the store; returns the rating tasks in their queue (0: nothing to prepare)."""
    from sense7.crowd.lifecycle import conversations_for
    from sense7.crowd.participants import Participants, Studies
    from sense7.data.raterpage import RaterQueue
    from sense7.labelstudio.importer import import_conversations, import_profile_tasks
    from sense7.labelstudio.rater_accounts import copy_queue

    found = Studies(rt.store).get(study_id)
    if found is None:
        return 0
    participant = Participants(rt.store, found[0]).get(rater_id)
    if participant is None or participant.state not in ("checking", "rating"):
        return 0
    conversations = conversations_for(rt.store, found[0], rater_id)
    try:
        import_conversations(rt.client, rt.rating_project, conversations, rt.store, predict=_predictor(rt),
                             design=rt.settings.study, taxonomy=rt.taxonomy, rater_id=rater_id)
        import_profile_tasks(rt.client, rt.profile_project, [rater_id])
        copy_queue(rt.client, rt.store, rt.rating_project, rt.profile_project, rt.taxonomy, rater_id)
    except Exception as exc:
        raise as_retryable(exc) from None
    return sum(item.kind == "rating" for item in RaterQueue(rt.store).items(rater_id))


@shared_task(name=names.CROWD_PREPARE, **RETRY)
def prepare_task(study_id: str, rater_id: str) -> dict:
    try:
        return {"tasks": prepare_participant(current_runtime(), study_id, rater_id)}
    finally:  # done (or failed: a retry or the page's next ask queues it again)
        try:
            redis_client(get_app().conf.broker_url).delete(prepare_flag(rater_id))
        except Exception as exc:
            log.warning("crowd prepare flag not cleared (%s): it expires by itself", describe_error(exc))


@shared_task(name=names.CROWD_EXPIRE)
def expire_task() -> dict:
    from sense7.crowd.lifecycle import expire_leases

    result = expire_leases(current_runtime().store)
    return {"participants": result.participants, "released": result.released}
