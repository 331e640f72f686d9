"""The rater page: a rater opens their private link and rates their own conversations, one assistant turn
at a time, without a Label Studio account.

Who is who: the link (`/r/<secret>`) is the only credential. Opening it stores the link's hash in a signed,
HttpOnly session cookie; every other route re-checks that hash against the store (a revoked link stops
working at once) and answers only from that rater's own queue. Anything else (another rater's task id, a
guessed id, no or a tampered cookie, a revoked or unknown link) gets the same bare 404: the page never says
whether something exists. Every form carries a CSRF token (Flask-WTF); failed link openings are rate-limited
per client address (`limits`, counted in Redis; the address comes from X-Forwarded-For only through the
proxies SENSE7_TRUSTED_PROXIES names), and a valid link is never refused because of others' failures. Every
form value is read by one strict parser (`form_number`: ASCII digits in range, else the form is refused
with 422); bodies over 64 kB get 413, chunked ones too, and a body that stops arriving gets 408 (every read is
bounded by the worker: sense7.rater_page.bounded_worker). URLs carry task ids, never conversation text, and
nothing is logged per request (gunicorn's access log is off: link secrets are in paths).

Submissions are stored in the outbox first ("saved" means durable in sense7's store) and delivered to
Label Studio by the worker (sense7.tasks.delivery), then reach the store's ratings through the sync.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass

from flask import Flask, abort, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect
from limits import parse as parse_limit
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from sense7.crowd.lifecycle import advance as advance_crowd
from sense7.crowd.lifecycle import withdraw as settle_crowd_withdrawal
from sense7.crowd.participants import rater_page_admits
from sense7.labelstudio.protocol import profile_result, rating_result
from sense7.privacy.participation import (PARTICIPANT, ConversationChoices, WithdrawalError, Withdrawals,
                                          awaiting_choice, own_conversations)
from sense7.rater_page.forms import form_number
from sense7.rater_page.live import LivePrefills
from sense7.settings import Settings, local_secret
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, LinkBook, Outbox, QueueItem, RaterQueue, token_hash
from sense7.taxonomy import Taxonomy, study_taxonomy

log = logging.getLogger(__name__)

MAX_LEAD_TIME = 3600.0  # (s) longer than this is a tab left open, recorded as this
MAX_BODY = 64 * 1024  # bytes: a rating form with a long comment is ~6 kB


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


def form_answer(form, taxonomy: Taxonomy) -> tuple[dict, list[str]]:
    """The posted rating form -> ({"values", "expectation", "comment"}, problems)."""
    values, problems = {}, []
    for control in taxonomy.controls:
        level = form_number(form.get(control), 1, taxonomy.levels)
        if level is None:
            problems.append(control)
        else:
            values[control] = level
    expectation = form.get(taxonomy.expectation_key) or None
    if expectation not in taxonomy.expectation_values:
        problems.append(taxonomy.expectation_key)
        expectation = None
    comment = (form.get(taxonomy.comment_key) or "").strip()[:5000] or None
    return {"values": values, "expectation": expectation, "comment": comment}, problems


def profile_answer(form, taxonomy: Taxonomy) -> tuple[dict, list[str]]:
    traits, problems = {}, []
    for fld in taxonomy.profile_fields:
        raw = form.get(fld.key, "")
        if fld.type == "int":  # the form's own numbers go through the one strict parser first
            raw = form_number(raw, fld.min, fld.max)
            if raw is None:
                problems.append(fld.key)
                continue
        try:
            traits[fld.key] = fld.validate(raw)
        except ValueError:
            problems.append(fld.key)
    return {"traits": traits}, problems


def create_app(settings: Settings, refresh_queue=None, request_delivery=None, taxonomy: Taxonomy | None = None,
               store: Store | None = None, limiter_storage: str = "memory://", request_prepare=None) -> Flask:
    """The rater page for these settings.

    refresh_queue(rater_id) -> bool: copies the rater's tasks from Label Studio into the store (False when
    Label Studio cannot be reached: the copy already there is used). request_delivery(): asks the worker to
    deliver the outbox (a submission is durable before it is called; failures are only logged).
    limiter_storage: where failed link openings are counted (Redis, so that every worker counts them).
    request_prepare(study, rater): asks the worker for a crowd participant's tasks (sense7.rater_page.crowd)."""
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=local_secret(settings.home, "rater_page_secret"),
        SESSION_COOKIE_NAME="sense7_rater",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.rater_page.public_url.startswith("https://"),
        PERMANENT_SESSION_LIFETIME=30 * 86400,
        WTF_CSRF_TIME_LIMIT=None,  # tied to the session: a page left open overnight still submits
        MAX_CONTENT_LENGTH=MAX_BODY,
    )
    tax = taxonomy or study_taxonomy(settings)
    store = store or Store(settings.store_url)
    links, queue, outbox = LinkBook(store), RaterQueue(store), Outbox(store)
    instructed_answers = InstructedAnswers(store)
    choices = ConversationChoices(store)
    live_prefills = LivePrefills(settings.model_dir, store, tax)  # this rater's answers so far, at once
    page = settings.rater_page
    guesses = LinkGuesses(limiter_storage, page.link_attempts)

    @app.before_request
    def whole_body():
        """The body is read here, whole, before anything parses it (the CSRF check reads the form): 413 over
        the limit, chunked ones too (werkzeug would cut a chunked body at 64 kB without a word and the form
        would be stored truncated), and 408 when it stops arriving before its Content-Length (the worker
        bounds each read: sense7.rater_page.bounded_worker) or the client goes away."""
        environ = request.environ
        declared = request.content_length
        if not declared and "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            return None
        if declared and declared > MAX_BODY:
            abort(413)
        try:
            raw = environ["wsgi.input"].read(declared or MAX_BODY + 1)
        except TimeoutError:
            abort(408)
        if len(raw) > MAX_BODY:
            abort(413)
        if declared and len(raw) < declared:
            abort(408)
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(raw), str(len(raw))
        return None

    CSRFProtect(app)

    @app.after_request
    def headers(response):
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'")
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.errorhandler(404)
    @app.errorhandler(405)
    def not_found(_error):
        return render_template("not_found.html"), 404

    @app.errorhandler(CSRFError)
    def csrf_failed(_error):
        return render_template("message.html", title="This page has expired",
                               text="Please open your link again."), 400

    @app.errorhandler(413)
    def too_large(_error):
        return render_template("message.html", title="Too long",
                               text="Please shorten your comment and try again."), 413

    @app.errorhandler(408)
    def body_stopped(_error):
        return render_template("message.html", title="Not received",
                               text="Your answer did not arrive whole. Please send it again."), 408

    @app.errorhandler(429)
    def too_many(_error):
        return render_template("message.html", title="Too many attempts",
                               text="Please wait a minute and try again."), 429

    def current_rater() -> str:
        """The rater of this session's link, or a bare 404 (no session, tampered, revoked, unknown; and a crowd
        participant who has not passed the check or has left: their link is not issued before the check nor
        kept after, and a link that still exists answers nothing either)."""
        wanted = session.get("link")
        rater = links.rater_for_hash(wanted) if isinstance(wanted, str) else None
        if rater is None or not rater_page_admits(store, rater):
            abort(404)
        return rater

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/r/<token>")
    def open_link(token: str):
        rater = links.rater_for(token)
        if rater is None:  # only failures count, and only against the address that failed
            address = page.trusted_proxies.client(request.remote_addr, request.headers.get("X-Forwarded-For"))
            abort(404 if guesses.fail(address) else 429)
        session.clear()
        session.permanent = True
        session["link"] = token_hash(token)
        # The queue copy is made by `raters invite` and the worker; only a rater without one waits for
        # Label Studio here (thousands of raters opening links must not each query Label Studio).
        if not queue.has(rater) and not (refresh_queue and refresh_queue(rater)):
            return render_template("message.html", title="Not available right now",
                                   text="Your conversations cannot be loaded at the moment. "
                                        "Please try again in a few minutes."), 503
        return redirect(url_for("next_item"), code=303)

    @app.get("/")
    def next_item():
        rater = current_rater()
        # Donated conversations (an assistant's data export) are shown to their participant before any rating:
        # each can be left out of the study or of a release (sense7.privacy.participation).
        if awaiting_choice(store, rater):
            return redirect(url_for("your_conversations"), code=303)
        items = queue.items(rater)
        for item in items:
            if item.answer is None:
                if item.kind == "profile":
                    return redirect(url_for("profile"), code=303)
                return redirect(url_for("task", task_id=item.task_id), code=303)
        return redirect(url_for("done"), code=303)

    def profile_item(rater: str) -> QueueItem:
        item = next((i for i in queue.items(rater) if i.kind == "profile"), None)
        if item is None:
            abort(404)
        return item

    @app.get("/profile")
    def profile():
        rater = current_rater()
        item = profile_item(rater)
        return render_template("profile.html", tax=tax, item=item, answer=(item.answer or {}).get("traits") or {},
                               revision=outbox.revision(rater, item.task_id) + 1, rendered_at=time.time(),
                               problems=[])

    @app.post("/profile")
    def save_profile():
        rater = current_rater()
        item = profile_item(rater)
        answer, problems = profile_answer(request.form, tax)
        if problems:
            revision, rendered_at = echoed_form(rater, item)
            return render_template("profile.html", tax=tax, item=item, answer=answer["traits"],
                                   revision=revision, rendered_at=rendered_at, problems=problems), 422
        _store(rater, item, answer, profile_result(answer["traits"], tax))
        return redirect(url_for("next_item"), code=303)

    def own_turn(task_id: int) -> tuple[str, list[QueueItem], QueueItem]:
        """(rater, their queue, the turn): a bare 404 unless the task is a turn of this link's rater."""
        rater = current_rater()
        items = queue.items(rater)
        item = next((i for i in items if i.task_id == task_id and i.kind == "rating"), None)
        if item is None:
            abort(404)
        return rater, items, item

    @app.get("/task/<int:task_id>")
    def task(task_id: int):
        rater, items, item = own_turn(task_id)
        return _render_task(rater, items, item, item.answer, [], outbox.revision(rater, task_id) + 1, time.time())

    @app.post("/task/<int:task_id>")
    def save_task(task_id: int):
        rater, items, item = own_turn(task_id)
        answer, problems = form_answer(request.form, tax)
        check = tax.instructed_item((item.data or {}).get("instructed"))
        checked = form_number(request.form.get(check.key), 1, tax.levels) if check else None
        if check and checked is None:
            problems.append(check.key)
        if problems:
            return _render_task(rater, items, item, answer, problems, *echoed_form(rater, item)), 422
        if check:  # an attention check: kept in the store only, never in Label Studio
            instructed_answers.record(rater, item.task_id, check.key, checked, check.expected)
        _store(rater, item, answer, rating_result(answer["values"], tax, answer["expectation"], answer["comment"]))
        _next_conversation(rater)
        return redirect(url_for("next_item"), code=303)

    def _next_conversation(rater: str) -> None:
        """A crowd participant who just finished a conversation gets their next one (chosen now, with this
        answer: sense7.crowd.lifecycle.advance) and the worker is asked for its tasks, which are made while
        they rate the one held ahead. The answer is already kept: a failure here is only logged (the finish
        page and the "preparing" page take the next one and ask again)."""
        try:
            moved = advance_crowd(store, rater)
            if moved and moved[1] and request_prepare is not None:
                request_prepare(moved[0], rater)
        except Exception as exc:
            log.warning("next crowd conversation not taken yet (%s); the finish page takes it", type(exc).__name__)

    def echoed_form(rater: str, item: QueueItem) -> tuple[int, float]:
        """(revision, rendered_at) of a refused form shown again: the posted ones when well-formed."""
        revision = form_number(request.form.get("revision"), 1, 10**9)
        rendered_at = form_number(request.form.get("rendered_at"), 0, time.time(), decimals=True)
        return (revision or outbox.revision(rater, item.task_id) + 1,
                time.time() if rendered_at is None else rendered_at)

    def _render_task(rater, items, item, answer, problems, revision, rendered_at):
        ratings = [i for i in items if i.kind == "rating"]
        position = ratings.index(item)
        prefill = None
        # The study's pre-fill (sense7.store.study_design): only shown-arm turns have a prediction in the queue.
        if answer is None and item.prediction and item.prediction.get("values"):
            prefill = item.prediction
        if answer is None:
            prefill = _live_prefill(rater, items, item) or prefill
        check = tax.instructed_item((item.data or {}).get("instructed"))
        check_answer = form_number(request.form.get(check.key), 1, tax.levels) \
            if check and request.method == "POST" else None
        return render_template("task.html", tax=tax, item=item, answer=answer or prefill or {},
                               instructed=check, instructed_answer=check_answer,
                               prefilled=prefill is not None, problems=problems, revision=revision,
                               rendered_at=rendered_at, progress=progress_of(items, item),
                               previous=ratings[position - 1].task_id if position else None,
                               following=ratings[position + 1].task_id if position + 1 < len(ratings) else None)

    def _live_prefill(rater: str, items: list[QueueItem], item: QueueItem) -> dict | None:
        """The live pre-fill (recorded before this page is sent), or None: the queue's pre-fill stays."""
        try:
            return live_prefills.prefill(rater, items, item)
        except Exception as exc:  # the page must render: the queue's pre-fill is always a valid answer
            log.warning("live pre-fill failed (%s); showing the queue's", type(exc).__name__)
            return None

    def _store(rater: str, item: QueueItem, answer: dict, result: list[dict]) -> None:
        """Durably keep the submission as the next revision unless it equals the latest one (a double click,
        a resent form, eight racing posts: stored once; Outbox.add_next compares and sets), then ask for
        delivery. The page's time is a hidden field: one out of form is no lead time, never a NaN."""
        started = form_number(request.form.get("rendered_at"), 0, time.time(), decimals=True)
        lead_time = None if started is None else min(time.time() - started, MAX_LEAD_TIME)
        if outbox.add_next(rater, item.kind, item.task_id, result, answer, lead_time) is None:
            return
        if request_delivery:
            try:
                request_delivery()
            except Exception as exc:  # the worker's periodic delivery will pick it up
                log.warning("could not queue a delivery (%s); the periodic one will deliver it",
                            type(exc).__name__)

    @app.get("/conversations")
    def your_conversations():
        rater = current_rater()
        return render_template("conversations.html", conversations=own_conversations(store, rater), problems=[])

    @app.post("/conversations/choice")
    def choose_conversation():
        """One conversation's choice; a conversation that is not this rater's: the bare 404."""
        rater = current_rater()
        wanted = request.form.get("conversation")
        if wanted not in {c["conversation_id"] for c in own_conversations(store, rater)}:
            abort(404)
        study, release = request.form.get("study"), request.form.get("release")
        if study not in ("in", "out") or release not in ("in", "out"):
            return render_template("conversations.html", conversations=own_conversations(store, rater),
                                   problems=["study" if study not in ("in", "out") else "release"]), 422
        choices.choose(rater, wanted, in_study=study == "in", in_release=release == "in")
        return redirect(url_for("your_conversations"), code=303)

    @app.post("/conversations/confirm")
    def confirm_conversations():
        """Seen, and nothing (more) to leave out: the rest stay in the study and in a release."""
        rater = current_rater()
        choices.confirm(rater, [c["conversation_id"] for c in own_conversations(store, rater)])
        return redirect(url_for("next_item"), code=303)

    @app.get("/withdraw")
    def withdraw():
        current_rater()
        return render_template("withdraw.html")

    @app.post("/withdraw")
    def withdraw_now():
        """The link is revoked in the same transaction that records the withdrawal: the next request with
        this cookie or the link is a bare 404. Staff confirm the erasure (`sense7 raters erase --confirm`)."""
        rater = current_rater()
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

    @app.get("/done")
    def done():
        rater = current_rater()
        crowd = session.get("crowd")
        if isinstance(crowd, dict) and isinstance(crowd.get("study"), str):  # the study's finish page
            return redirect(url_for("crowd.finish_visit", study_id=crowd["study"]), code=303)
        items = queue.items(rater)
        open_items = [i for i in items if i.answer is None]
        return render_template("done.html", remaining=len(open_items), code=page.completion_code,
                               url=page.completion_url, total=sum(i.kind == "rating" for i in items))

    from sense7.rater_page.crowd import crowd_blueprint

    app.register_blueprint(crowd_blueprint(
        settings, store, LinkGuesses(limiter_storage, page.link_attempts, "sense7-crowd-entries"), guesses,
        request_prepare))
    return app


class LinkGuesses:
    """Failed link openings per client address in a moving window (Redis, so that every worker counts
    them). Only failures are counted and only failures are refused: a rater's valid link always opens."""

    NAMESPACE = "sense7-link-guesses"

    def __init__(self, storage_uri: str, rate: str, namespace: str = NAMESPACE):
        self.limit, self.namespace = parse_limit(rate), namespace
        self.window = MovingWindowRateLimiter(storage_from_string(storage_uri))

    def fail(self, address: str) -> bool:
        """Count one failed opening from `address`; False when it is over the limit (answer 429)."""
        try:
            return self.window.hit(self.limit, self.namespace, address)
        except Exception as exc:  # Redis down: a 256-bit secret is not guessed in the meantime
            log.warning("link-guess counter unavailable (%s)", type(exc).__name__)
            return True
