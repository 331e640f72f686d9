"""The rater page's participation (blueprint `participation`): the rater's profile questionnaire, their
donated conversations (each kept in or left out of the study and of a release: sense7.privacy.participation)
and their withdrawal. Every route learns its rater from the session (`current_rater`); anything not theirs
is the bare 404."""

from __future__ import annotations

import time

from flask import Blueprint, abort, redirect, render_template, request, session, url_for

from sense7.crowd.lifecycle import withdraw as settle_crowd_withdrawal
from sense7.privacy.participation import PARTICIPANT, WithdrawalError, Withdrawals, own_conversations
from sense7.store.rater_page_tables import QueueItem
from sense7.labelstudio.protocol import profile_result
from sense7.rater_page.answers import echoed_form, profile_answer, store_submission
from sense7.rater_page.services import current_rater, page_services

participation = Blueprint("participation", __name__)


def profile_item(rater: str) -> QueueItem:
    item = next((i for i in page_services().queue.items(rater) if i.kind == "profile"), None)
    if item is None:
        abort(404)
    return item


@participation.get("/profile")
def profile():
    rater = current_rater()
    item = profile_item(rater)
    services = page_services()
    return render_template("profile.html", tax=services.taxonomy, item=item,
                           answer=(item.answer or {}).get("traits") or {},
                           revision=services.outbox.revision(rater, item.task_id) + 1, rendered_at=time.time(),
                           problems=[])


@participation.post("/profile")
def save_profile():
    rater = current_rater()
    item = profile_item(rater)
    tax = page_services().taxonomy
    answer, problems = profile_answer(request.form, tax)
    if problems:
        revision, rendered_at = echoed_form(rater, item)
        return render_template("profile.html", tax=tax, item=item, answer=answer["traits"],
                               revision=revision, rendered_at=rendered_at, problems=problems), 422
    store_submission(rater, item, answer, profile_result(answer["traits"], tax))
    return redirect(url_for("rating.next_item"), code=303)


@participation.get("/conversations")
def your_conversations():
    rater = current_rater()
    return render_template("conversations.html", conversations=own_conversations(page_services().store, rater),
                           problems=[])


@participation.post("/conversations/choice")
def choose_conversation():
    """One conversation's choice; a conversation that is not this rater's: the bare 404."""
    rater = current_rater()
    store = page_services().store
    wanted = request.form.get("conversation")
    if wanted not in {c["conversation_id"] for c in own_conversations(store, rater)}:
        abort(404)
    study, release = request.form.get("study"), request.form.get("release")
    if study not in ("in", "out") or release not in ("in", "out"):
        return render_template("conversations.html", conversations=own_conversations(store, rater),
                               problems=["study" if study not in ("in", "out") else "release"]), 422
    page_services().choices.choose(rater, wanted, in_study=study == "in", in_release=release == "in")
    return redirect(url_for("participation.your_conversations"), code=303)


@participation.post("/conversations/confirm")
def confirm_conversations():
    """Seen, and nothing (more) to leave out: the rest stay in the study and in a release."""
    rater = current_rater()
    services = page_services()
    services.choices.confirm(rater, [c["conversation_id"] for c in own_conversations(services.store, rater)])
    return redirect(url_for("rating.next_item"), code=303)


@participation.get("/withdraw")
def withdraw():
    current_rater()
    return render_template("withdraw.html")


@participation.post("/withdraw")
def withdraw_now():
    """The link is revoked in the same transaction that records the withdrawal: the next request with
    this cookie or the link is a bare 404. Staff confirm the erasure (`sense7 raters erase --confirm`)."""
    rater = current_rater()
    store = page_services().store
    try:
        Withdrawals(store).request(rater, PARTICIPANT)
    except WithdrawalError:  # a second post racing the first: the link is already revoked
        abort(404)
    settle_crowd_withdrawal(store, rater)  # a crowd participant's slots back to the pool, their seat freed
    crowd = isinstance(session.get("crowd"), dict)
    session.clear()
    return render_template("message.html", title="You have withdrawn from this study",
                           text="Your link no longer works. The study's staff will erase your answers, "
                                "your questionnaire and your conversations; nothing that identifies you is "
                                "kept. Thank you for your time."
                                + (" No completion code is given after a withdrawal: please return your "
                                   "submission on the platform." if crowd else ""))
