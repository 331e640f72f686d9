"""The model a serving process holds, swapped for a newly promoted version without a restart.

A request only reads the reference held (`get`: no query of the store, no load, no lock). What is held is
loaded by `refresh`: at the process's start (build_model), then by the process's background thread (`start`:
the backend's WSGI app factory starts it in each worker), which reads the registry's pointer every
`check_interval` seconds (one small query) and, when it moved, verifies, loads and compiles the new version
while the held one keeps answering, then swaps one reference. So no request carries a load (it used to be
the request that noticed the moved pointer). Under gunicorn's gevent worker the "thread" is a greenlet, so the
load itself runs on a real thread of gevent's pool (`_off_the_hub`): the worker keeps answering meanwhile. A
version that fails verification or loading is remembered and not retried until the pointer moves again; the
old model keeps serving, as it does while the store is out of reach. A job (pre-annotation, a bulk import)
calls `refresh` itself when it starts, to use the version served now.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from sense7.model.registry import ModelRegistry, RegistryError
from sense7.model.vector_cache import VectorCache, with_vector_cache

log = logging.getLogger("sense7.ml_backend")


@dataclass(frozen=True)
class LoadedModel:
    version: str
    bundle: Any
    predictor: Any  # bundle.compile(): what /predict calls (sense7.model.serving.CompiledBundle)
    loaded_at: float


class HotModel:
    def __init__(self, registry: ModelRegistry, check_interval: float = 1.0, vectors: VectorCache | None = None,
                 on_demand_seconds: float | None = None):
        self.registry = registry
        # The text vectors' cache a loaded version's text encoder reads (sense7.model.vector_cache), and how long
        # one call may embed texts it lacks (None: all of them, e.g. bulk pre-annotation).
        self.vectors = vectors
        self.on_demand_seconds = on_demand_seconds
        self.check_interval = check_interval
        self._loaded: LoadedModel | None = None
        self._stamp = None  # the pointer stamp last acted on (loaded, or refused: not retried until it moves)
        self._refresh_lock = threading.Lock()  # between refreshers (the thread, a job): a request never takes it
        self._start_lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._follow_pid: int | None = None  # the process `start` was called in (None: not following)
        self.last_error: str | None = None

    def get(self) -> LoadedModel | None:
        """The model to answer this request with (None when nothing was ever promoted or loadable). Reads one
        attribute: the store is never asked and nothing is loaded on a request."""
        if self._follow_pid is not None and self._follow_pid != os.getpid():
            # This process was forked from the one that started following (gunicorn with preload_app: the app
            # factory ran in the master). A thread does not survive a fork, so without this the worker would
            # serve the master's version for ever; it follows from its first request on. (One getpid per request.)
            self.start()
        return self._loaded

    def peek(self) -> LoadedModel | None:
        """The model held now (for /setup and /health: no I/O); the same as `get`."""
        return self.get()

    def start(self) -> None:
        """Follow the registry in a background thread of this process (daemon: it ends with the process):
        `refresh` now (an unchanged pointer costs one query) and then every `check_interval` seconds.
        Idempotent. Under the backend's gevent worker the thread is a greenlet (gunicorn patches threading
        before the worker builds its app), and a load is CPU (unpickling, compiling) that never yields: run
        in the greenlet it held the whole worker, every request arriving meanwhile waiting for it. So the
        load runs on a real OS thread there (`_off_the_hub`) and the worker's hub keeps answering (the two
        share the GIL, so requests slow down while it runs, but none waits for its end). Under gthread or
        sync workers the thread is a real one already."""
        with self._start_lock:
            pid = os.getpid()
            if self._follow_pid == pid and self._thread is not None and self._thread.is_alive():
                return
            if self._follow_pid is not None and self._follow_pid != pid:
                # Forked: a lock a thread of the parent held at the fork stays held in the child, and in a gevent
                # worker (patched after the fork) the master's native lock and event would block the whole
                # worker instead of one greenlet. New ones, made by this process's (patched) threading module.
                self._refresh_lock = threading.Lock()
                self._stopped = threading.Event()
            self._follow_pid = pid
            self._stopped.clear()
            self._thread = threading.Thread(target=self._follow, name="sense7-model-follow", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the background thread after the refresh under way (or its first one) finishes; `get` then
        keeps what is held."""
        with self._start_lock:
            self._follow_pid = None
            self._stopped.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _follow(self) -> None:
        while True:  # the first refresh always runs, even when `stop` came first
            try:
                self.refresh()
            except Exception as exc:  # never let the thread die: the next round tries again
                log.warning("model refresh failed (%s)", type(exc).__name__)
            if self._stopped.wait(self.check_interval):
                return

    def refresh(self) -> bool:
        """Read the registry's pointer; when it moved, load the version it names and hold it. True when a
        swap happened. Run by the background thread, at a process's start and by a job that must serve the
        current version now (and tests), never by a request. Waits for a refresh under way to finish."""
        with self._refresh_lock:
            held = self._loaded
            try:
                stamp = self.registry.pointer_stamp()
            except Exception as exc:  # the store is out of reach: the held model keeps serving
                log.warning("model pointer not read (%s); still serving %s", type(exc).__name__,
                            held.version if held else "nothing")
                return False
            if stamp == self._stamp:
                return False
            version = None
            try:
                version = self.registry.current()
                if version is None or (held is not None and held.version == version):
                    self._stamp = stamp
                    return False
                started = time.perf_counter()
                loaded = _off_the_hub(self._load, version)
            except SQLAlchemyError as exc:  # the store went away mid-load: the next round tries again
                log.warning("model not read from the store (%s); still serving %s", type(exc).__name__,
                            held.version if held else "nothing")
                return False
            except Exception as exc:  # RegistryError, or a bundle that cannot be compiled for serving
                # Remember the stamp: a broken version is not retried until the pointer moves again.
                self._stamp = stamp
                self.last_error = str(exc) if isinstance(exc, RegistryError) else \
                    f"model {version} cannot be served ({type(exc).__name__})"
                log.error("model %s not loaded, still serving %s: %s", version,
                          held.version if held else "nothing", self.last_error)
                return False
            self._loaded = loaded  # one reference: a request reads the old model or the new one
            self._stamp = stamp
            self.last_error = None
            try:  # versions the store no longer holds (pruned, or trained on an erased rater) leave this host too
                self.registry.prune_cache()
            except Exception as exc:
                log.warning("model cache not pruned (%s)", type(exc).__name__)
            log.info("serving model %s (loaded in %.0f ms, was %s)", version,
                     (time.perf_counter() - started) * 1000, held.version if held else "nothing")
            return True

    def _load(self, version: str) -> LoadedModel:
        bundle = self.registry.load(version)
        if self.vectors is not None:  # (before compiling: serving reads the encoder when it compiles)
            with_vector_cache(bundle, self.vectors, self.on_demand_seconds)
        predictor = bundle.compile()  # once per version and process, before any request sees it
        return LoadedModel(version, bundle, predictor, time.time())


def _off_the_hub(function, *args):
    """`function(*args)` on a real OS thread of gevent's pool when gevent has patched this process's threading
    (a gevent worker: the calling greenlet waits, the hub and every other greenlet keep running); called
    directly otherwise. gevent is never imported here: a process that did not import it has nothing patched."""
    gevent = sys.modules.get("gevent")
    if gevent is None:
        return function(*args)
    from gevent import monkey

    if not monkey.is_module_patched("threading"):
        return function(*args)
    return gevent.get_hub().threadpool.apply(function, args)
