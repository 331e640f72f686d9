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

`create_app` only assembles: the app's services (`sense7.rater_page.services.PageServices`, in
`app.extensions`), what applies to every route (body limit, CSRF, headers, error pages) and the blueprints,
one per concern: links and rating (`rating`), participation (`participation`: profile, conversations,
withdrawal) and crowd studies (`crowd`).
"""

from __future__ import annotations

import io
import time

from flask import Flask, abort, g, render_template, request
from flask_wtf.csrf import CSRFError, CSRFProtect

from sense7.store.database import Store
from sense7.rater_page.crowd_pages import crowd
from sense7.rater_page.participation import participation
from sense7.rater_page.rating import rating
from sense7.rater_page.services import EXTENSION, PageServices
from sense7.settings import RATER_PAGE_SECRET, Settings
from sense7.taxonomy import Taxonomy, study_taxonomy

MAX_BODY = 64 * 1024  # bytes: a rating form with a long comment is ~6 kB


def create_app(settings: Settings, refresh_queue=None, request_delivery=None, taxonomy: Taxonomy | None = None,
               store: Store | None = None, limiter_storage: str = "memory://", request_prepare=None) -> Flask:
    """The rater page for these settings.

    refresh_queue(rater_id) -> bool: copies the rater's tasks from Label Studio into the store (False when
    Label Studio cannot be reached: the copy already there is used). request_delivery(): asks the worker to
    deliver the outbox (a submission is durable before it is called; failures are only logged).
    limiter_storage: where failed link openings are counted (Redis, so that every worker counts them).
    request_prepare(study, rater): asks the worker for a crowd participant's tasks (sense7.rater_page.crowd_pages)."""
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=settings.secret("rater_page_secret", RATER_PAGE_SECRET),  # one key for every instance
        SESSION_COOKIE_NAME="sense7_rater",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.rater_page.public_url.startswith("https://"),
        PERMANENT_SESSION_LIFETIME=30 * 86400,
        WTF_CSRF_TIME_LIMIT=None,  # tied to the session: a page left open overnight still submits
        MAX_CONTENT_LENGTH=MAX_BODY,
    )
    app.extensions[EXTENSION] = PageServices.for_settings(
        settings, taxonomy or study_taxonomy(settings), store or Store(settings.store_url), limiter_storage,
        refresh_queue=refresh_queue, request_delivery=request_delivery, request_prepare=request_prepare)
    app.before_request(start_timing)
    app.before_request(whole_body)  # before the CSRF check, which reads the form
    CSRFProtect(app)
    app.after_request(security_headers)
    app.after_request(server_timing)
    app.register_error_handler(404, not_found)
    app.register_error_handler(405, not_found)
    app.register_error_handler(CSRFError, csrf_failed)
    app.register_error_handler(408, body_stopped)
    app.register_error_handler(413, too_large)
    app.register_error_handler(429, too_many)
    app.add_url_rule("/healthz", view_func=healthz, methods=["GET"])
    for blueprint in (rating, participation, crowd):
        app.register_blueprint(blueprint)
    return app


def start_timing():
    g.request_started = time.perf_counter()


def server_timing(response):
    """`Server-Timing: app;dur=<ms>`: the time this request spent in the app (views, queries, rendering), so
    that a client, the proxy's log or a benchmark can tell the page's own time from queueing and the network
    (docs/guides/deployment.md, what to monitor). A duration only: it says no more than the client can time."""
    started = g.get("request_started")
    if started is not None:
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
    return response


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


def security_headers(response):
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'")
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    return response


def not_found(_error):
    return render_template("not_found.html"), 404


def csrf_failed(_error):
    return render_template("message.html", title="This page has expired", text="Please open your link again."), 400


# A body that stopped, or one left unread because it was too long, leaves the connection out of step (the
# next bytes would be read as a request): both answers end the connection and say so.
CLOSES = {"Connection": "close"}


def body_stopped(_error):
    return render_template("message.html", title="Not received",
                           text="Your answer did not arrive whole. Please send it again."), 408, CLOSES


def too_large(_error):
    return (render_template("message.html", title="Too long", text="Please shorten your comment and try again."),
            413, CLOSES)


def too_many(_error):
    return render_template("message.html", title="Too many attempts", text="Please wait a minute and try again."), 429


def healthz():
    return {"status": "ok"}
