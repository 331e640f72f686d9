"""gunicorn settings for the ML backend (`sense7 backend start` passes the environment).

Values come from sense7's one Settings (sense7.settings.BackendServing: SENSE7_BACKEND_*), read when
gunicorn starts.

A /predict is CPU-bound Python, so processes (not threads) give parallelism. By default each worker is a
gevent worker (ml_backend/gevent_worker.py): one request at a time, no GIL shared between request threads,
and idle, half-open or slow connections hold nothing (the sync worker it replaces was held by three). Threads in a
worker (SENSE7_BACKEND_THREADS > 1: gthread) let concurrent requests share model calls
(ml_backend/batcher.py), but measured on 2 cores they cost throughput and tail latency (GIL hand-overs
between the request threads; docs/BENCHMARKS.md). Now that a model call takes well under a millisecond
(sense7.model.serving), a busy sync worker keeps /health and /setup waiting for at most that long.
Each worker imports sense7.ml_backend.wsgi, loads the model once and follows promotions in its own background
thread (no preload: hot swaps happen per process; HotModel restarts the thread in a forked worker anyway).
"""

from sense7.settings import Settings

_serving = Settings.from_env().serving

bind = _serving.bind
workers = _serving.workers
threads = _serving.threads
# One request at a time per worker, but idle and slow connections hold nothing (ml_backend/gevent_worker.py:
# gevent, every read bounded by SENSE7_BACKEND_READ_TIMEOUT); SENSE7_BACKEND_THREADS > 1: gthread.
worker_class = "sense7.ml_backend.gevent_worker.BoundedGeventWorker" if threads == 1 else "gthread"
worker_connections = 1000
timeout = 120  # Label Studio waits up to 100 s for /predict (ML_TIMEOUT_PREDICT)
graceful_timeout = 20
# No keep-alive by default: a kept-alive connection stays with the worker that accepted it, and under a
# burst of persistent clients (Label Studio's request sessions, a load test) one worker sometimes takes them
# all while the other idles: half the throughput (measured, docs/BENCHMARKS.md). Closing after each response
# lets the next request go to whichever worker is free. (The gevent worker closes by itself when the
# setting is 0: gunicorn bounds the wait for a request's headers only on its keep-alive path, hence >= 1.)
keepalive = max(_serving.keepalive, 1) if threads == 1 else _serving.keepalive
backlog = 512
pidfile = _serving.pidfile
proc_name = "sense7-ml-backend"
# No control socket: gunicorn's default ($XDG_RUNTIME_DIR or ~/.gunicorn/gunicorn.ctl) is one per user, so
# every stack on the machine (and the tests) would share it, `gunicornc` would answer for another stack's
# master, and the first master to exit would delete it. sense7 stops its processes through their pid files.
control_socket_disable = True
# Access logs name only method, path and status; off unless asked for (they cost ~10% at high rates).
accesslog = "-" if _serving.access_log else None
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms'
errorlog = "-"
loglevel = _serving.log_level
