"""gunicorn settings for the rater page (`sense7 rater-page start` passes the environment).

Threads (gthread): a page is mostly waiting on the store, so a few processes with several threads each
serve many raters at once; the worker class reads each request's head in its poller loop and bounds every
read and write (sense7/rater_page/bounded_worker.py), so slow or idle connections hold no thread. No access
log: a link's secret is in its path (/r/<secret>).
"""

from sense7.settings import Settings

_page = Settings.from_env().rater_page

bind = f"{_page.host}:{_page.port}"
workers = _page.workers
threads = _page.threads
worker_class = "sense7.rater_page.bounded_worker.BoundedThreadWorker"
timeout = 60
graceful_timeout = 20
keepalive = 5  # s a kept-alive connection may wait for its next request's first byte
backlog = 1024
proc_name = "sense7-rater-page"
# No control socket: gunicorn's default ($XDG_RUNTIME_DIR or ~/.gunicorn/gunicorn.ctl) is one per user, so
# every stack on the machine (and the tests) would share it, `gunicornc` would answer for another stack's
# master, and the first master to exit would delete it. sense7 stops its processes through their pid files.
control_socket_disable = True
accesslog = None
errorlog = "-"
loglevel = "info"
