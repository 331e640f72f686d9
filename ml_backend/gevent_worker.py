"""The ML backend's gunicorn worker: gevent, with every read bounded (ml_backend/gunicorn_conf.py).

gunicorn's sync worker serves one connection at a time and waits for a request as long as the client
likes: three half-open connections (no credentials needed) held both workers, and a body shorter than its
Content-Length held one for 120 s until the arbiter killed it (500 WORKER TIMEOUT). Here each connection is
a greenlet, so idle ones hold nothing but a socket, and
- a request's headers must arrive within SENSE7_BACKEND_READ_TIMEOUT seconds (or the keep-alive, between
  requests), else the connection is closed without an answer;
- each later read (the body) and write waits at most SENSE7_BACKEND_READ_TIMEOUT: a body that stops coming
  is answered 408 by the app (sense7.ml_backend.app);
- with SENSE7_BACKEND_KEEPALIVE=0 (the default) every response closes its connection, so that the next
  request goes to whichever worker is free (a kept-alive connection stays with one worker: docs/BENCHMARKS.md).
A /predict is CPU-bound Python, so a worker still runs one request at a time; processes give parallelism.
"""

from __future__ import annotations

import gevent
from gunicorn.http import wsgi
from gunicorn.workers.ggevent import GeventWorker

from sense7.settings import Settings


class OneSendResponse(wsgi.Response):
    """gunicorn sends a response's headers and its body in two send() calls. On loopback each send runs the
    whole network stack and wakes the client, and the pair cost 17% of a batch-1 /predict's worker time
    (cProfile of a worker, docs/BENCHMARKS.md). Here the headers wait for the body's first bytes and leave
    in the same send; a response without a body sends them at close, as gunicorn does."""

    _head: bytes | None = None

    def send_headers(self):
        if self.headers_sent:
            return
        lines = self.default_headers()
        lines.extend("%s: %s\r\n" % (k, v) for k, v in self.headers)
        self._head = ("%s\r\n" % "".join(lines)).encode("latin-1")
        self.headers_sent = True

    def _emit_body(self, data):
        head, self._head = self._head, None
        if head is not None and not self.chunked:
            self.sock.sendall(head + data)
            return
        if head is not None:
            self.sock.sendall(head)
        super()._emit_body(data)

    def close(self):
        self.send_headers()
        head, self._head = self._head, None
        if head is not None:
            self.sock.sendall(head)
        super().close()


# gunicorn builds every HTTP/1 response from this module-level name (gunicorn.http.wsgi.create); older
# gunicorns without the `_emit_body` hook keep their own two sends.
USE_ONE_SEND = hasattr(wsgi.Response, "_emit_body")


class BoundedGeventWorker(GeventWorker):
    def init_process(self):
        serving = Settings.from_env().serving
        self.read_timeout = max(float(serving.read_timeout), 0.1)
        self.close_after_response = serving.keepalive <= 0
        # gunicorn bounds the header read only on its keep-alive path (gunicorn_conf.py sets keepalive >= 1
        # for this worker): the first request gets the read timeout, later ones the keep-alive.
        self.header_timeout = self.read_timeout if self.close_after_response else float(serving.keepalive)
        if USE_ONE_SEND:
            wsgi.Response = OneSendResponse  # this process is a backend worker: every response it sends
        super().init_process()

    def timeout_ctx(self):
        # The whole header read, however slowly it drips in. False: on expiry the connection just closes
        # (a socket timeout here would be logged as a socket error with a traceback).
        return gevent.Timeout(self.header_timeout, False)

    def handle_request(self, listener_name, req, sock, addr):
        if self.close_after_response:
            req.must_close = True
        sock.settimeout(self.read_timeout)  # each read of the body (the app answers 408) and each write
        try:
            super().handle_request(listener_name, req, sock, addr)
        finally:
            try:
                sock.setblocking(True)  # between kept-alive requests only the keep-alive bounds the wait
            except OSError:
                pass  # already closed
