"""The ML-backend HTTP protocol of Label Studio 1.23, served by Flask 3 (app factory).

Routes: GET /health, POST /setup, POST /predict, POST /webhook, GET /versions (see ml_backend/README.md
for the exact bodies). We serve the protocol ourselves because PyPI's label-studio-ml 1.0.9 pins Flask
1.1.2 and ignores START_TRAINING, and 2.x is not on PyPI.

Security: HTTP basic auth on every route (on by default: generated credentials that `sense7 backend
connect` hands to Label Studio, which sends them with auth_method=BASIC_AUTH). A webhook carries no
authority: annotation events (with the shared secret in X-Sense7-Secret) only wake a job that re-reads the
annotation from Label Studio, so a forged one causes at most a re-read. START_TRAINING, which Label
Studio's ML API sends with basic auth and no custom header, is accepted only with basic auth passed: the
secret header, which every Label Studio member can read, cannot start training. Malformed events get 400,
bodies above `max_content_length` 413 (chunked ones too).
Logs carry routes, counts, versions and ids, never bodies, traits, tokens or passwords.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import logging
import os
import time
from typing import Any, Callable

import orjson
from flask import Flask, jsonify, request
from flask.json.provider import JSONProvider
from sense7.ml_backend.fast_path import PredictFastPath
from sense7.ml_backend.labels import LabelConfigError
from sense7.ml_backend.model import ModelUnavailable, Sense7Model, build_model
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge, RequestTimeout

from sense7.labelstudio.protocol import SECRET_HEADER, MalformedEvent
from sense7.settings import Settings

log = logging.getLogger("sense7.ml_backend")


DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # "Retrieve predictions" on a whole project sends every task at once
# Sent by Label Studio's ML API (basic auth, no custom headers) rather than by a registered webhook.
ML_API_ACTIONS = frozenset({"START_TRAINING"})


class OrjsonProvider(JSONProvider):
    """Flask's JSON through orjson: a 10-task /predict body decodes in 15 us instead of 36 and its answer
    encodes in 4 us instead of 60 (docs/BENCHMARKS.md). Invalid JSON still raises a ValueError."""

    def __init__(self, app: Flask):
        super().__init__(app)
        self.response_class = app.response_class

    def dumps(self, obj, **kwargs) -> str:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()

    def loads(self, s, **kwargs):
        return orjson.loads(s)

    def response(self, *args, **kwargs):
        # jsonify's body as orjson's bytes (Flask's default decodes them to text and encodes them again)
        obj = args[0] if len(args) == 1 and not kwargs else (list(args) if args else kwargs)
        return self.response_class(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), mimetype="application/json")


def _same(given: str | None, expected: str) -> bool:
    return hmac.compare_digest((given or "").encode("utf-8"), expected.encode("utf-8"))


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


class BasicAuth:
    """The backend's HTTP basic-auth check, made on every request, in constant time.

    The header Label Studio sends (`Basic base64(user:password)`) is recognised by comparing its SHA-256
    with one computed once (a digest of the given header, so neither its length nor its content changes
    the comparison's time); any other spelling (a lower-case scheme, other base64 padding) is parsed and
    its user and password compared, as before. Nothing is remembered between requests."""

    def __init__(self, user: str, password: str):
        self.user, self.password = user, password
        canonical = "Basic " + base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
        # A user name with ":" cannot be sent in basic auth (RFC 7617): no shortcut that a parser would refuse.
        self.canonical_digest = _sha256(canonical) if ":" not in user else None

    def accepts(self, environ: dict, parsed: Callable[[], Any]) -> bool:
        """Whether the request's Authorization header carries the credentials. `parsed()` gives werkzeug's
        parsed header (only called for a header that is not the canonical one)."""
        header = environ.get("HTTP_AUTHORIZATION")
        if header is not None and self.canonical_digest is not None and \
                hmac.compare_digest(_sha256(header), self.canonical_digest):
            return True
        auth = parsed()
        return auth is not None and auth.type == "basic" and \
            _same(auth.username, self.user) & _same(auth.password, self.password)


def _error(status: int, message: str):
    response = jsonify({"error": message})
    response.status_code = status
    return response


def create_app(settings: Settings | None = None, *, model: Sense7Model | None = None,
               on_event: Callable[[str, dict], Any] | None = None,
               max_content_length: int = DEFAULT_MAX_BYTES, fast_path: bool = True) -> Flask:
    """The WSGI app. `on_event(action, payload)` receives START_TRAINING and annotation webhooks; it must
    return quickly (Label Studio gives webhooks 1 s): enqueue work, do not do it. `fast_path=False` serves
    every /predict through Flask (the reference the fast path's tests compare with)."""
    settings = settings or Settings.from_env()
    if model is None:
        model = build_model(settings, on_event=on_event, serving=True)
    elif on_event is not None:
        model.on_event = on_event
    user, password = settings.backend_user, settings.backend_password
    basic_auth = BasicAuth(user, password) if user and password else None
    secret = settings.webhook_secret

    app = Flask("sense7.ml_backend")
    app.config["MAX_CONTENT_LENGTH"] = max_content_length
    app.json = OrjsonProvider(app)
    app.extensions["sense7_model"] = model

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        reasons = {413: f"request body larger than {max_content_length} bytes",
                   408: "the request body stopped arriving before its Content-Length"}
        return _error(exc.code or 500, reasons.get(exc.code, exc.description or exc.name))

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.error("unexpected %s on %s %s", type(exc).__name__, request.method, request.path)
        log.debug("unexpected error", exc_info=True)  # messages may quote request data: DEBUG only
        return _error(500, f"internal error: {type(exc).__name__}")

    @app.before_request
    def _check_basic_auth():
        if basic_auth is None or basic_auth.accepts(request.environ, lambda: request.authorization):
            return None
        response = _error(401, "HTTP basic auth required (the ML backend's user and password in Label Studio)")
        response.headers["WWW-Authenticate"] = 'Basic realm="sense7 ML backend"'
        return response

    def _body() -> bytes:
        try:
            if request.content_length is None and request.environ.get("wsgi.input_terminated"):
                # A chunked body: werkzeug would cut it at the limit without a word (and the JSON would then
                # look malformed); read one byte past the limit to tell "too large" apart.
                raw = request.environ["wsgi.input"].read(max_content_length + 1)
                if len(raw) > max_content_length:
                    raise RequestEntityTooLarge()
                return raw
            return _declared_body()
        except (TimeoutError, ClientDisconnected):  # the body stopped coming (gevent_worker.py bounds each
            raise RequestTimeout() from None         # read; werkzeug reports the timeout as a disconnect)

    def _declared_body() -> bytes:
        """A body of known length, read straight from the server's input (werkzeug's wrapped stream cost more
        than the read): 413 when it is declared over the limit, 408 when it ends before its length."""
        length = request.content_length
        if length is None:
            return request.get_data(cache=True)
        if length > max_content_length:
            raise RequestEntityTooLarge()
        raw = request.environ["wsgi.input"].read(length) if length else b""
        if len(raw) < length:
            raise ClientDisconnected()
        return raw

    def _json_object(what: str) -> dict:
        try:
            body = orjson.loads(_body())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            raise _BadRequest(f"{what}: the body must be a JSON object (Content-Type: application/json)")
        return body

    @app.errorhandler(_BadRequest)
    def _bad_request(exc: _BadRequest):
        return _error(400, str(exc))

    @app.get("/health")
    def health():
        # No I/O (Label Studio gives /health 1 s): the version held, kept current by the process's background thread.
        return jsonify({"status": "UP", "model_class": type(model).__name__, "model_version": model.model_version,
                        "worker": os.getpid()})

    @app.post("/setup")
    def setup():
        body = _json_object("/setup")
        return jsonify({"model_version": model.setup(body.get("project"), body.get("schema"))})

    @app.post("/predict")
    def predict():
        status, answer = predict_answer(model, _body())
        return app.response_class(answer, status=status, mimetype="application/json")

    @app.post("/webhook")
    def webhook():
        body = _json_object("/webhook")
        action = body.get("action")
        if not isinstance(action, str) or not action:
            raise _BadRequest("/webhook: 'action' (a string such as ANNOTATION_CREATED) is missing")
        if action in ML_API_ACTIONS:
            if basic_auth is None:  # (basic auth passed already when it is configured: see _check_basic_auth)
                return _error(403, f"/webhook: {action} needs the backend's basic auth")
        elif not _same(request.headers.get(SECRET_HEADER), secret):
            return _error(403, f"/webhook: missing or wrong {SECRET_HEADER} header")
        try:
            model.fit(action, body)
        except MalformedEvent as exc:
            return _error(400, f"/webhook: {exc}")
        except Exception as exc:
            log.error("webhook %s: event handler failed (%s)", action, type(exc).__name__)
            log.debug("event handler failure", exc_info=True)
            return _error(503, f"/webhook: event not accepted ({type(exc).__name__})")
        return jsonify({"status": "accepted", "action": action}), 202

    @app.get("/versions")
    def versions():
        return jsonify({"versions": model.versions(), "current": model.model_version})

    if fast_path and basic_auth is not None:
        # POST /predict with Label Studio's own spelling of the credentials skips Flask (ml_backend/fast_path.py);
        # every other request, refused ones included, still goes through the app above.
        app.wsgi_app = PredictFastPath(app.wsgi_app, functools.partial(predict_answer, model),
                                       basic_auth.canonical_digest, max_content_length)
    return app


class _BadRequest(Exception):
    """A malformed request body; the message is the reason returned with the 400."""


def predict_answer(model: Sense7Model, body: bytes) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of a /predict whose request body is `body`: the one implementation behind
    both the Flask view and the fast path (ml_backend/fast_path.py), so they cannot answer differently.
    400 for a body that is not a JSON object with a list of tasks or a bad label config, 503 without a model."""
    started = time.perf_counter()
    try:
        request_body = orjson.loads(body)
    except orjson.JSONDecodeError:
        request_body = None
    if not isinstance(request_body, dict):
        return _error_body(400, "/predict: the body must be a JSON object (Content-Type: application/json)")
    tasks = request_body.get("tasks")
    if not isinstance(tasks, list):
        return _error_body(400, "/predict: 'tasks' must be a list of Label Studio tasks")
    params = request_body.get("params")
    context = params.get("context") if isinstance(params, dict) else None
    try:
        results = model.predict(tasks, context=context, label_config=request_body.get("label_config"),
                                project=request_body.get("project"))
    except LabelConfigError as exc:
        return _error_body(400, f"/predict: label_config: {exc}")
    except ModelUnavailable as exc:
        return _error_body(503, f"no model to serve: {exc}")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("predict: %d tasks (%d errors) in %.1f ms", len(tasks), sum("error" in r for r in results),
                  (time.perf_counter() - started) * 1000)
    return 200, orjson.dumps({"results": results}, option=orjson.OPT_SERIALIZE_NUMPY)


def _error_body(status: int, message: str) -> tuple[int, bytes]:
    return status, orjson.dumps({"error": message})
