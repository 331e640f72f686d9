"""POST /predict as Label Studio sends it, answered without Flask (issue 23, "The backend got slower").

Label Studio calls /predict far more often than any other route, always the same way: basic auth in one
spelling, a JSON body of declared length. For that request Flask and werkzeug (request and response
objects, routing, the before-request hook, header parsing) cost about a quarter of the work of a batch-1
request (docs/BENCHMARKS.md). This WSGI middleware, in front of the Flask app (`app.wsgi_app`), answers it
directly; the answer itself is `sense7.ml_backend.app.predict_answer`, the function the Flask view calls, so
both paths give the same bytes.

It only ever takes a request it is sure of, and hands every other one, untouched and unread, to Flask:
- another route or method;
- any Authorization header whose SHA-256 is not that of the exact header Label Studio sends (no header, a
  near miss, another spelling of the right credentials): Flask's check answers 401 or accepts it, as before;
- no Content-Length (a chunked body), a malformed one, or one over the limit: Flask answers 413/400.
Only a body read here can fail here: shorter than its Content-Length (the client closed) or stopped
arriving (the worker's read timeout, ml_backend/gevent_worker.py) is 408, as in the Flask path.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Callable

import orjson

log = logging.getLogger("sense7.ml_backend")

_STATUS = {200: "200 OK", 400: "400 BAD REQUEST", 408: "408 REQUEST TIMEOUT", 500: "500 INTERNAL SERVER ERROR",
           503: "503 SERVICE UNAVAILABLE"}


class PredictFastPath:
    """WSGI middleware: `answer(body) -> (status, JSON bytes)` for POST /predict with the exact credentials
    (`credentials_digest`: SHA-256 of the canonical Authorization header), everything else to `app`."""

    def __init__(self, app: Callable, answer: Callable[[bytes], tuple[int, bytes]], credentials_digest: bytes,
                 max_content_length: int):
        self.app, self.answer = app, answer
        self.credentials_digest, self.max_content_length = credentials_digest, max_content_length

    def __call__(self, environ: dict, start_response: Callable):
        length = self._length(environ)
        if length is None:
            return self.app(environ, start_response)
        try:
            body = environ["wsgi.input"].read(length) if length else b""
        except TimeoutError:  # the worker's bounded read (socket.timeout is a TimeoutError)
            body = None
        if body is None or len(body) < length:
            return self._send(start_response, 408, orjson.dumps(
                {"error": "the request body stopped arriving before its Content-Length"}))
        try:
            status, answer = self.answer(body)
        except Exception as exc:  # as the Flask app's handler of unexpected errors: type only, no request data
            log.error("unexpected %s on POST /predict", type(exc).__name__)
            log.debug("unexpected error", exc_info=True)
            status, answer = 500, orjson.dumps({"error": f"internal error: {type(exc).__name__}"})
        return self._send(start_response, status, answer)

    def _length(self, environ: dict) -> int | None:
        """The declared body length when this request is one for the fast path, else None."""
        if environ.get("PATH_INFO") != "/predict" or environ.get("REQUEST_METHOD") != "POST":
            return None
        header = environ.get("HTTP_AUTHORIZATION")
        if header is None or self.credentials_digest is None or not hmac.compare_digest(
                hashlib.sha256(header.encode("utf-8", "replace")).digest(), self.credentials_digest):
            return None
        declared = environ.get("CONTENT_LENGTH")
        if not declared or not declared.isascii() or not declared.isdigit():
            return None
        length = int(declared)
        return length if length <= self.max_content_length else None

    @staticmethod
    def _send(start_response: Callable, status: int, body: bytes) -> list[bytes]:
        start_response(_STATUS[status], [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
