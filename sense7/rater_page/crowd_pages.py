"""The rater page's crowd-study routes (blueprint `crowd`, registered by sense7.rater_page.app).

    /s/<study>?PROLIFIC_PID=..&STUDY_ID=..&SESSION_ID=..  -> consent (agree | decline)
        decline -> the no-consent code or redirect (only the answer, its version and time are recorded)
        agree   -> a short reservation (`check_minutes`) that holds nothing: no seat, no slot, no rater-page
                   link, no Label Studio task -> the comprehension check (two attempts; failing twice: return
                   your submission, the screen-out code or redirect, never rejected) -> passed: a seat and the
                   slots taken at once, the rating lease started, a rater-page link issued into this session
                   and the worker asked for the tasks -> the questionnaire at once, from the store (its
                   task is made by the worker meanwhile: RaterQueue.provide) -> "preparing" for whatever of
                   the worker's round is left -> the turns -> finish: the completion code or redirect, only once every
                   turn of every conversation held is answered. No seat or no slot left at the check: the
                   full page (its code, or "return your submission"); a `full` participant may enter again.

Who is who: the platform id becomes a pseudonymous rater id (sense7.crowd.participants); only the session
cookie (same browser, bound to this entry's resume code) or the resume code (another browser) reopens a
participant's visit. A platform id that has entered before, without either, gets the resume form and nothing
else (a `full` one enters again). Withdrawn participants (the page's button, `sense7 raters withdraw`, and
after the erasure) never get a page, a link or a seat again. Malformed platform ids get one plain "this link
is not valid" page; an unknown study the bare 404 of every unknown URL. New entries are counted per client
address (the app's `limits` limiter in Redis; addresses through SENSE7_TRUSTED_PROXIES); entries are refused
as full only when every seat (the participant cap) or every slot is taken. With SENSE7_PROLIFIC_TOKEN an entry
whose Prolific submission does not hold a place is refused (sense7.crowd.prolific). Resume-code failures
count like failed link openings. Nothing here logs a platform id (nothing is logged per request at all).
"""

from __future__ import annotations

import time

from flask import Blueprint, abort, redirect, render_template, request, session, url_for
from markdown_it import MarkdownIt
from markupsafe import Markup

from sense7.crowd.lifecycle import assignments_of, finish, give_back, start_rating, unprepared
from sense7.crowd.participants import (AlreadyEntered, Participant, Participants, pseudonymous_id,
                                       study_secret, valid_platform_id)
from sense7.crowd.study import CrowdStudy
from sense7.store.rater_page_tables import token_hash
from sense7.rater_page.forms import form_number
from sense7.rater_page.services import client_address, page_services

ASK_AGAIN = 30.0  # (s) a participant still "preparing" after this asks the worker again (idempotent job)
PARAM_FIELDS = (("participant_param", "platform_id"), ("study_param", "platform_study"),
                ("session_param", "platform_session"))

crowd = Blueprint("crowd", __name__, url_prefix="/s")
markdown = MarkdownIt("commonmark", {"html": False})  # the consent file's raw HTML is shown as text


def study_or_404(study_id: str) -> tuple[CrowdStudy, bool]:
    found = page_services().studies.get(study_id)
    if found is None:
        abort(404)
    return found


def participant_or_404(study_id: str) -> tuple[CrowdStudy, Participant]:
    """The study and this session's participant of it; anyone else gets the bare 404."""
    study, _ = study_or_404(study_id)
    who = current(study)
    if who is None:
        abort(404)
    return study, who


def current(study: CrowdStudy) -> Participant | None:
    """This session's participant of the study (None: none, another study's, gone, or a session of an
    earlier entry of theirs: a participant who entered again after `full` has a new resume code)."""
    held = session.get("crowd")
    if not isinstance(held, dict) or held.get("study") != study.study_id:
        return None
    who = Participants(page_services().store, study).get(held.get("rater"))
    # (A session made before visits were recorded has none: it stays valid.)
    return who if who is not None and held.get("visit", who.visit) == who.visit else None


def hold(study: CrowdStudy, who: Participant) -> None:
    session["crowd"] = {"study": study.study_id, "rater": who.rater_id, "visit": who.visit}


def message(title: str, text: str, status: int = 200, **extra):
    return render_template("crowd_message.html", title=title, text=text, **extra), status


def not_valid():
    return message("This link is not valid",
                   "Please open the study from the recruitment platform's page again.", 400)


def ending(study: CrowdStudy, outcome: str, title: str, text: str, status: int = 200):
    """The platform's code for this outcome, and its URL when the study gives one: the page goes there by
    itself (a meta refresh, and a link). Not an HTTP redirect: these pages often answer a form, and the
    page's CSP (form-action 'self') makes browsers refuse a form's redirect chain leaving the site."""
    code, url = study.redirect_for(outcome)
    return message(title, text, status, code=code, url=url)


def full_page(study: CrowdStudy):
    code, url = study.redirect_for("full")
    return ending(study, "full", "This study is full",
                  "There is no place left right now. Please return your submission on the platform (you will "
                  "not be rejected)" + (", using this code if asked:" if code or url else ".")
                  + " While the study is open you may also try again later from the platform's link.", 403)


def continue_as(study: CrowdStudy, who: Participant):
    state, sid = who.state, study.study_id
    if state == "checking":
        return redirect(url_for("crowd.check", study_id=sid), code=303)
    if state == "rating":
        return redirect(url_for("crowd.wait", study_id=sid), code=303)
    if state == "completed":
        return redirect(url_for("crowd.finish_visit", study_id=sid), code=303)
    if state == "screened_out":
        return ending(study, "screen_out", "Thank you for your time",
                      "The answers to the questions about the instructions were not right twice, so this "
                      "study cannot continue. Please return your submission on the platform (you will not "
                      "be rejected), using this code if asked:")
    if state == "declined":
        return ending(study, "no_consent", "You chose not to take part",
                      "Nothing about you was kept. Please return to the platform, using this code if asked:")
    if state == "full":
        return full_page(study)
    if state == "withdrawn":
        return message("You have withdrawn from this study",
                       "Nothing more can be done here, and no completion code is given. Please return your "
                       "submission on the platform.", 403)
    return message("Your time for this study has run out",
                   "The answers you gave are kept. Please return to the platform.", 403)


def entered_before(study: CrowdStudy):
    return render_template("crowd_resume.html", study=study, problem=None,
                           known=True), 200


def no_room(study: CrowdStudy, rater: str) -> bool:
    """Every seat (the cap: participants inside the study and completed) or every slot this participant
    could take is taken. Entries at the check hold neither, so they never fill a study."""
    if Participants(page_services().store, study).seated() >= study.participant_cap:
        return True
    return not assignments_of(page_services().store, study).has_room(rater)


@crowd.get("/<study_id>")
def entry(study_id: str):
    study, is_open = study_or_404(study_id)
    names = study.platform
    given = {field: request.args.get(names[param]) for param, field in PARAM_FIELDS}
    who = current(study)
    secret = study_secret(page_services().settings, study.study_id)
    if who is not None and (given["platform_id"] is None or (
            valid_platform_id(given["platform_id"])
            and pseudonymous_id(secret, study.study_id, given["platform_id"]) == who.rater_id)) \
            and not (who.state == "full" and given["platform_id"] is not None and is_open):
        return continue_as(study, who)
    if not valid_platform_id(given["platform_id"]) or any(
            value is not None and not valid_platform_id(value) for value in given.values()):
        return not_valid()
    rater = pseudonymous_id(secret, study.study_id, given["platform_id"])
    before = Participants(page_services().store, study).get(rater)
    if before is not None and before.state != "full":
        return entered_before(study)  # a platform id alone never opens anyone's visit (withdrawn ones too)
    if not is_open:
        return message("This study is closed", "It is not taking new participants. Thank you for your "
                       "interest; please return to the platform.", 403)
    if no_room(study, rater):
        return full_page(study)
    if not page_services().crowd_entries.fail(client_address()):
        abort(429)
    prolific = page_services().prolific
    if study.entry_from_elsewhere(given["platform_study"]) or (
            prolific is not None and not prolific.entry_allowed(given["platform_id"], given["platform_study"],
                                                                given["platform_session"])):
        return message("This study cannot be started from here",
                       "The recruitment platform does not show you taking part in this study right now. "
                       "Please start it from the platform's study page.", 403)
    session.clear()
    session["crowd_entry"] = {"study": study.study_id, **given}
    return render_template("crowd_consent.html", study=study, consent=Markup(markdown.render(study.consent_text)))


@crowd.post("/<study_id>/consent")
def consent(study_id: str):
    study, is_open = study_or_404(study_id)
    entry_ = session.get("crowd_entry")
    if not isinstance(entry_, dict) or entry_.get("study") != study.study_id \
            or not valid_platform_id(entry_.get("platform_id")):
        abort(404)
    choice = request.form.get("consent")
    if choice not in ("agree", "decline"):
        abort(422)
    participants = Participants(page_services().store, study)
    secret = study_secret(page_services().settings, study.study_id)
    rater = pseudonymous_id(secret, study.study_id, entry_["platform_id"])
    session.pop("crowd_entry", None)
    try:
        if choice == "decline":
            participants.decline(rater)  # the answer, its version and time: nothing else
            hold(study, participants.get(rater))
            return continue_as(study, participants.get(rater))
        if not is_open:
            return message("This study is closed", "It is not taking new participants. Please return to "
                           "the platform.", 403)
        code = participants.agree(rater, {field: entry_.get(field) for _, field in PARAM_FIELDS})
    except AlreadyEntered:
        return entered_before(study)
    # Agreed: a reservation only. The seat, the slots, the link and the tasks come with a passed check.
    hold(study, participants.get(rater))
    session["resume_code"] = code
    session.permanent = True
    return redirect(url_for("crowd.check", study_id=study.study_id), code=303)


def render_check(study: CrowdStudy, who: Participant, answers: dict, wrong: bool, status: int = 200):
    return render_template("crowd_check.html", study=study, answers=answers, wrong=wrong,
                           attempts_left=2 - who.check_attempts,
                           resume_code=session.get("resume_code")), status


@crowd.get("/<study_id>/check")
def check(study_id: str):
    study, who = participant_or_404(study_id)
    if who.state != "checking":
        return continue_as(study, who)
    return render_check(study, who, {}, wrong=who.check_attempts > 0)


@crowd.post("/<study_id>/check")
def answer_check(study_id: str):
    study, who = participant_or_404(study_id)
    if who.state != "checking":
        return continue_as(study, who)
    answers = {}
    for number, question in enumerate(study.questions, start=1):
        choice = form_number(request.form.get(f"q{number}"), 1, len(question.choices))
        if choice is not None:
            answers[number] = choice
    if len(answers) < len(study.questions):
        return render_check(study, who, answers, wrong=False, status=422)
    participants = Participants(page_services().store, study)
    if all(answers[n] == q.answer for n, q in enumerate(study.questions, start=1)):
        if start_rating(page_services().store, study, who.rater_id) is None:  # full, or the reservation ran out
            return continue_as(study, participants.get(who.rater_id))
        open_rating(study, who.rater_id)  # the link and the tasks: only now
        return redirect(url_for("crowd.wait", study_id=study.study_id), code=303)
    outcome = participants.failed_check(who.rater_id, who.check_attempts)
    if outcome == "checking":
        return render_check(study, participants.get(who.rater_id), {}, wrong=True)
    if outcome == "screened_out":
        give_back(page_services().store, study, who.rater_id)  # nothing to give back but what an older version took
    return continue_as(study, participants.get(who.rater_id))


def open_rating(study: CrowdStudy, rater: str) -> None:
    """This session becomes the participant's rater-page session (a fresh link, never shown: the
    session holds its hash), and the worker is asked for their tasks. Only for a participant rating:
    a withdrawn one gets no link (LinkBook refuses), and the request the bare 404."""
    token = page_services().links.issue(rater, rotate=True)
    if token is None:
        abort(404)
    session["link"] = token_hash(token)
    queue = page_services().queue
    request_prepare = page_services().request_prepare
    if request_prepare is not None and not queue.has(rater):
        request_prepare(study.study_id, rater)
        session["prepare_asked"] = time.time()  # the wait page asks again only if this one got lost
    # The questionnaire from the store at once: the participant answers it while the worker's round makes
    # their Label Studio tasks (it takes seconds when Label Studio is busy), instead of waiting for them.
    queue.provide_questionnaire(rater)


@crowd.get("/<study_id>/wait")
def wait(study_id: str):
    study, who = participant_or_404(study_id)
    if who.state != "rating":
        return continue_as(study, who)
    if page_services().links.rater_for_hash(session.get("link") or "") != who.rater_id:
        abort(404)
    if ready(who.rater_id):
        return redirect(url_for("rating.next_item"), code=303)
    request_prepare = page_services().request_prepare
    asked = session.get("prepare_asked")
    now = time.time()
    if request_prepare is not None and (not isinstance(asked, (int, float)) or now - asked > ASK_AGAIN):
        session["prepare_asked"] = now  # a job lost with a worker is asked for again, not every second
        if asked is not None:
            request_prepare(study.study_id, who.rater_id)
    return render_template("crowd_wait.html", study=study, resume_code=session.get("resume_code"))


def ready(rater: str) -> bool:
    """The rater page has something for this participant: a turn not answered yet, or (every turn
    answered) none of their conversations still waiting for its tasks (the finish page then decides)."""
    items = page_services().queue.items(rater)
    return bool(items) and (any(i.answer is None for i in items) or not unprepared(page_services().store, [rater]))


@crowd.get("/<study_id>/finish")
def finish_visit(study_id: str):
    study, who = participant_or_404(study_id)
    if who.state not in ("rating", "completed"):
        return continue_as(study, who)
    if not finish(page_services().store, study, who.rater_id):  # the code only for the whole work
        items = page_services().queue.items(who.rater_id)
        if not items or any(i.answer is None for i in items):
            return redirect(url_for("rating.next_item"), code=303)
        if unprepared(page_services().store, [who.rater_id]):  # their next conversation's tasks are on their way
            request_prepare = page_services().request_prepare
            if request_prepare is not None:
                request_prepare(study.study_id, who.rater_id)
                session["prepare_asked"] = time.time()
            return redirect(url_for("crowd.wait", study_id=study.study_id), code=303)
        return message("Not finished yet",
                       "Some of the replies assigned to you have no answer yet, so there is no completion "
                       "code yet. Please try again in a minute; if this stays, contact the study's team.", 409)
    return ending(study, "completion", "Thank you!",
                  "All your answers are saved. Please go back to the platform and enter this completion code:")


@crowd.get("/<study_id>/resume")
def resume_form(study_id: str):
    study, _ = study_or_404(study_id)
    return render_template("crowd_resume.html", study=study, problem=None, known=False)


@crowd.post("/<study_id>/resume")
def resume(study_id: str):
    study, _ = study_or_404(study_id)
    who = Participants(page_services().store, study).by_resume_code(request.form.get("code"))
    if who is None:
        if not page_services().link_guesses.fail(client_address()):
            abort(429)
        return render_template("crowd_resume.html", study=study, known=False,
                               problem="This code is not right. Please check it and try again."), 404
    session.clear()
    session.permanent = True
    hold(study, who)
    if who.state == "rating":
        open_rating(study, who.rater_id)  # this browser takes the link (a participant at the check has none)
    return continue_as(study, who)

