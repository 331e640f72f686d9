"""The rater page's gunicorn worker: gthread threads, with every read bounded (sense7/rater_page/gunicorn_conf.py).

gunicorn's gthread worker hands a new connection to a thread as soon as its first bytes arrive, and the thread
then waits in the header parser for as long as the client likes: 16 connections sending part of a header line
held every thread of the page (2 workers x 8), and /healthz took over 5 s (issue 37). Here
- a request's head (request line and headers, up to the blank line) is read by the worker's poller loop,
  without blocking, into a buffer per connection: idle or slow connections hold a socket and a few bytes,
  never a thread. A head must be whole within SENSE7_RATER_PAGE_READ_TIMEOUT seconds of its first wait (of
  the accept, or of the first byte after a kept-alive response), else the connection is closed without an
  answer; a head over HEAD_LIMIT bytes is answered 431 and closed;
- only a whole head goes to a thread, its bytes pushed back into gunicorn's parser (its unreader), so the
  parser never waits for the head;
- in the thread each later read (the body) and each write waits at most the same timeout: a body shorter
  than its Content-Length is answered 408 by the app (sense7.rater_page.app) and the connection closed
  (`closing_when_asked`: gunicorn would otherwise keep it alive);
- between kept-alive requests gunicorn's keep-alive (gunicorn_conf.py) bounds the wait for the first byte,
  then the head is read as above. Bytes read ahead of a response (a pipelined request) start the next
  head's read here too.
No gevent: the page's store (SQLite, psycopg2) and Redis calls stay plain blocking calls in plain threads.
Plain HTTP/1 only: the page is served behind a TLS proxy, never with gunicorn's own TLS.
"""

from __future__ import annotations

import errno
import selectors
import time
from functools import partial

from gunicorn import http
from gunicorn.workers.gthread import TConn, ThreadWorker

from sense7.settings import Settings

HEAD_END = b"\r\n\r\n"
HEAD_LIMIT = 64 * 1024  # bytes of a request head (the page's cookies are a few hundred bytes)
RECV_SIZE = 16 * 1024
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")


def closing_when_asked(app):
    """The app wrapped so that a response carrying `Connection: close` (the 408 and 413 answers: the request's
    body was not read whole, so the connection's next bytes would be read as a request) ends its connection.
    gunicorn drops an app's hop-by-hop headers and keeps the connection alive; `start_response` is its
    Response's bound method, whose force_close() makes it send `Connection: close` and close."""
    def app_closing_when_asked(environ, start_response):
        def start(status, headers, exc_info=None):
            response = getattr(start_response, "__self__", None)
            if response is not None and any(name.lower() == "connection" and value.lower() == "close"
                                            for name, value in headers):
                response.force_close()
            return start_response(status, headers, exc_info)
        return app(environ, start)
    return app_closing_when_asked


class BoundedConn(TConn):
    """A gthread connection with the bytes of the head being read and the moment it must be whole."""

    def __init__(self, cfg, sock, client, server, read_timeout: float):
        super().__init__(cfg, sock, client, server)  # leaves the socket non-blocking, for the poller
        self.read_timeout = read_timeout
        self.head = bytearray()
        self.deadline = 0.0

    def init(self):
        """In the thread, before a request is served (gunicorn first makes the socket blocking): each body
        read and each write of this request waits at most the read timeout."""
        super().init()
        self.sock.settimeout(self.read_timeout)


class BoundedThreadWorker(ThreadWorker):

    def init_process(self):
        if self.cfg.is_ssl:
            raise RuntimeError("the rater page's worker reads request heads as plain HTTP/1: serve TLS in a proxy")
        self.read_timeout = Settings.from_env().rater_page.read_timeout
        # Connections whose head is being read, oldest deadline first (every deadline is its start plus the
        # same timeout, so insertion order is deadline order); the values are unused.
        self.reading_heads: dict[BoundedConn, None] = {}
        super().init_process()  # runs the worker's loop

    def load_wsgi(self):
        super().load_wsgi()
        self.wsgi = closing_when_asked(self.wsgi)

    # -- where connections come in -------------------------------------------------------------------------

    def accept(self, listener):
        try:
            client_sock, client_addr = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self.read_head(BoundedConn(self.cfg, client_sock, client_addr, listener.getsockname(), self.read_timeout))

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request is starting: read its head here, not in a thread."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self.read_head(conn)

    def finish_request(self, conn, fs):
        """A request was served. If its connection stays open and the client already sent bytes of the next
        request (read ahead into gunicorn's parser), that head is read here too; gunicorn would hand the
        connection straight back to a thread, to wait there for the rest of the head."""
        if (self.alive and not fs.cancelled() and fs.exception() is None and fs.result() is True
                and conn.parser is not None):
            ahead = conn.parser.unreader.take_buffered()
            if ahead:
                conn.sock.setblocking(False)
                self.read_head(conn, ahead)
                return
        super().finish_request(conn, fs)

    # -- reading a head in the poller loop ----------------------------------------------------------------

    def read_head(self, conn: BoundedConn, already: bytes = b"") -> None:
        conn.head = bytearray(already)
        if HEAD_END in conn.head:
            self.hand_over(conn)
            return
        conn.deadline = time.monotonic() + self.read_timeout
        self.reading_heads[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_head_readable, conn))

    def on_head_readable(self, conn: BoundedConn, _client) -> None:
        try:
            data = conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # reset by the client: as if it had closed
        if not data:
            self.stop_reading(conn)
            self.close_conn(conn)
            return
        searched_from = max(len(conn.head) - len(HEAD_END) + 1, 0)
        conn.head += data
        if conn.head.find(HEAD_END, searched_from) >= 0:
            self.stop_reading(conn)
            self.hand_over(conn)
        elif len(conn.head) > HEAD_LIMIT:
            self.stop_reading(conn)
            try:
                conn.sock.send(TOO_LARGE)  # best effort: the socket is non-blocking, the answer tiny
            except OSError:
                pass
            self.close_conn(conn)

    def hand_over(self, conn: BoundedConn) -> None:
        """The whole head is here: to a thread, with the bytes read so far back in gunicorn's parser."""
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.parser.unreader.unread(bytes(conn.head))
        conn.head = bytearray()
        conn.data_ready = True  # gunicorn's thread would otherwise first wait for the socket to be readable
        self.enqueue_req(conn)

    def stop_reading(self, conn: BoundedConn) -> None:
        self.reading_heads.pop(conn, None)
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass  # not registered, or already closed

    def close_conn(self, conn: BoundedConn) -> None:
        self.nr_conns -= 1
        conn.close()

    def murder_keepalived(self, force=False):
        """gunicorn's loop calls this about once a second (and with force=True when the worker stops): kept-
        alive connections past their keep-alive, and connections whose head is not whole by its deadline,
        are closed without an answer."""
        super().murder_keepalived(force)
        now = time.monotonic()
        while self.reading_heads:
            conn = next(iter(self.reading_heads))
            if conn.deadline > now and not force:
                break
            self.stop_reading(conn)
            self.close_conn(conn)
