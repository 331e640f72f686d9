"""The rater page's links and rating (blueprint `rating`): a private link opens a session, the rater is
sent to their next open item, rates their own turns one at a time and ends on the done page.

Who is who: the link (`/r/<secret>`) is the only credential. Opening it stores the link's hash in the
signed session cookie; every other route re-checks that hash against the store (`current_rater`) and
answers only from that rater's own queue; anything else is the same bare 404. Failed link openings are
counted per client address (`LinkGuesses`), and a valid link is never refused because of others' failures.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from flask import Blueprint, abort, redirect, render_template, request, session, url_for

from sense7.crowd.lifecycle import advance as advance_crowd
from sense7.privacy.participation import awaiting_choice
from sense7.store.rater_page_tables import QueueItem, token_hash
from sense7.labelstudio.protocol import rating_result
from sense7.rater_page.answers import echoed_form, form_answer, store_submission
from sense7.rater_page.forms import form_number
from sense7.rater_page.services import client_address, current_rater, page_services

log = logging.getLogger(__name__)

rating = Blueprint("rating", __name__)


@dataclass
class Progress:
    """What the page says about where the rater is: response 3 of 9 · conversation 2 of 5 · 14 of 60 done."""

    turn_number: int
    turns_in_conversation: int
    conversation_number: int
    conversations: int
    done: int
    total: int


def progress_of(items: list[QueueItem], current: QueueItem) -> Progress:
    ratings = [i for i in items if i.kind == "rating"]

    def group(item: QueueItem) -> tuple:  # a turn shown again later counts with the other repeats
        return bool((item.data or {}).get("repeat")), item.conversation_id

    conversations = list(dict.fromkeys(map(group, ratings)))
    same = [i for i in ratings if group(i) == group(current)]
    return Progress(turn_number=same.index(current) + 1, turns_in_conversation=len(same),
                    conversation_number=conversations.index(group(current)) + 1,
                    conversations=len(conversations), done=sum(i.answer is not None for i in ratings),
                    total=len(ratings))


@rating.get("/r/<token>")
def open_link(token: str):
    services = page_services()
    rater = services.links.rater_for(token)
    if rater is None:  # only failures count, and only against the address that failed
        abort(404 if services.link_guesses.fail(client_address()) else 429)
    session.clear()
    session.permanent = True
    session["link"] = token_hash(token)
    # The queue copy is made by `raters invite` and the worker; only a rater without one waits for
    # Label Studio here (thousands of raters opening links must not each query Label Studio).
    if not services.queue.has(rater) and not (services.refresh_queue and services.refresh_queue(rater)):
        return render_template("message.html", title="Not available right now",
                               text="Your conversations cannot be loaded at the moment. "
                                    "Please try again in a few minutes."), 503
    return redirect(url_for("rating.next_item"), code=303)


@rating.get("/")
def next_item():
    rater = current_rater()
    return redirect(where_next(rater, page_services().queue.items(rater)) or url_for("rating.done"), code=303)


def where_next(rater: str, items: list[QueueItem]) -> str | None:
    """The page of the rater's first open item of `items` (None when all are answered)."""
    # Donated conversations (an assistant's data export) are shown to their participant before any rating:
    # each can be left out of the study or of a release (sense7.privacy.participation).
    if awaiting_choice(page_services().store, rater):
        return url_for("participation.your_conversations")
    following = next((item for item in items if item.answer is None), None)
    if following is None:
        return None
    if following.kind == "profile":
        return url_for("participation.profile")
    return url_for("rating.task", task_id=following.task_id)


def own_turn(task_id: int) -> tuple[str, list[QueueItem], QueueItem]:
    """(rater, their queue, the turn): a bare 404 unless the task is a turn of this link's rater."""
    rater = current_rater()
    items = page_services().queue.items(rater)
    item = next((i for i in items if i.task_id == task_id and i.kind == "rating"), None)
    if item is None:
        abort(404)
    return rater, items, item


@rating.get("/task/<int:task_id>")
def task(task_id: int):
    rater, items, item = own_turn(task_id)
    revision = page_services().outbox.revision(rater, task_id) + 1
    return render_task(rater, items, item, item.answer, [], revision, time.time())


@rating.post("/task/<int:task_id>")
def save_task(task_id: int):
    rater, items, item = own_turn(task_id)
    services = page_services()
    tax = services.taxonomy
    answer, problems = form_answer(request.form, tax)
    check = tax.instructed_item((item.data or {}).get("instructed"))
    checked = form_number(request.form.get(check.key), 1, tax.levels) if check else None
    if check and checked is None:
        problems.append(check.key)
    if problems:
        return render_task(rater, items, item, answer, problems, *echoed_form(rater, item)), 422
    if check:  # an attention check: kept in the store only, never in Label Studio
        services.instructed_answers.record(rater, item.task_id, check.key, checked, check.expected)
    store_submission(rater, item, answer,
                     rating_result(answer["values"], tax, answer["expectation"], answer["comment"]))
    take_next_conversation(rater)
    return redirect(after_answer(rater, items, item), code=303)


def after_answer(rater: str, items: list[QueueItem], answered: QueueItem) -> str:
    """Where an answer sends the rater: straight to the page `next_item` would send them to (from the queue
    read for this answer, the answered turn now done), so that the next turn is one request away, not two;
    `next_item` itself when nothing of that queue is open, since taking the next conversation may just have
    added turns (it only adds them after these)."""
    rest = [item for item in items if item.task_id != answered.task_id]
    return where_next(rater, rest) or url_for("rating.next_item")


def take_next_conversation(rater: str) -> None:
    """A crowd participant who just finished a conversation gets their next one (chosen now, with this
    answer: sense7.crowd.lifecycle.advance) and the worker is asked for its tasks, which are made while
    they rate the one held ahead. The answer is already kept: a failure here is only logged (the finish
    page and the "preparing" page take the next one and ask again)."""
    services = page_services()
    try:
        moved = advance_crowd(services.store, rater)
        if moved and moved[1] and services.request_prepare is not None:
            services.request_prepare(moved[0], rater)
    except Exception as exc:
        log.warning("next crowd conversation not taken yet (%s); the finish page takes it", type(exc).__name__)


def render_task(rater: str, items: list[QueueItem], item: QueueItem, answer, problems, revision, rendered_at):
    tax = page_services().taxonomy
    ratings = [i for i in items if i.kind == "rating"]
    position = ratings.index(item)
    prefill = None
    # The study's pre-fill (sense7.store.study_design): only shown-arm turns have a prediction in the queue.
    if answer is None and item.prediction and item.prediction.get("values"):
        prefill = item.prediction
    if answer is None:
        prefill = live_prefill(rater, items, item) or prefill
    check = tax.instructed_item((item.data or {}).get("instructed"))
    check_answer = form_number(request.form.get(check.key), 1, tax.levels) \
        if check and request.method == "POST" else None
    return render_template("task.html", tax=tax, item=item, answer=answer or prefill or {},
                           instructed=check, instructed_answer=check_answer,
                           prefilled=prefill is not None, problems=problems, revision=revision,
                           rendered_at=rendered_at, progress=progress_of(items, item),
                           previous=ratings[position - 1].task_id if position else None,
                           following=ratings[position + 1].task_id if position + 1 < len(ratings) else None)


def live_prefill(rater: str, items: list[QueueItem], item: QueueItem) -> dict | None:
    """The live pre-fill (recorded before this page is sent), or None: the queue's pre-fill stays."""
    try:
        return page_services().live_prefills.prefill(rater, items, item)
    except Exception as exc:  # the page must render: the queue's pre-fill is always a valid answer
        log.warning("live pre-fill failed (%s); showing the queue's", type(exc).__name__)
        return None


@rating.get("/done")
def done():
    rater = current_rater()
    crowd = session.get("crowd")
    if isinstance(crowd, dict) and isinstance(crowd.get("study"), str):  # the study's finish page
        return redirect(url_for("crowd.finish_visit", study_id=crowd["study"]), code=303)
    page = page_services().settings.rater_page
    items = page_services().queue.items(rater)
    open_items = [i for i in items if i.answer is None]
    return render_template("done.html", remaining=len(open_items), code=page.completion_code,
                           url=page.completion_url, total=sum(i.kind == "rating" for i in items))
