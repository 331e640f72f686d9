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
from gunicorn.workers.ggevent import GeventWorker

from sense7.settings import Settings


class BoundedGeventWorker(GeventWorker):
    def init_process(self):
        serving = Settings.from_env().serving
        self.read_timeout = max(float(serving.read_timeout), 0.1)
        self.close_after_response = serving.keepalive <= 0
        # gunicorn bounds the header read only on its keep-alive path (gunicorn_conf.py sets keepalive >= 1
        # for this worker): the first request gets the read timeout, later ones the keep-alive.
        self.header_timeout = self.read_timeout if self.close_after_response else float(serving.keepalive)
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
