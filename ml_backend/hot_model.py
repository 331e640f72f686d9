"""The model a serving process holds, swapped for a newly promoted version without a restart.

Each process loads the registry's current version once at start. Requests call `get()`; at most once per
`check_interval` seconds one of them reads the registry's pointer (one small query of the store; every other
request reads nothing). When it changed, that request thread
loads the new version *outside* any lock the other threads wait on (they keep answering with the old
model) and then swaps one reference. A version that fails verification or loading is remembered and not
retried until the pointer changes again; the old model keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

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
        self._stamp = None
        self._next_check = 0.0
        self._load_lock = threading.Lock()  # only one thread loads; nobody waits on it
        self.last_error: str | None = None

    def get(self) -> LoadedModel | None:
        """The model to answer this request with (None when nothing was ever promoted or loadable)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.check_interval
            try:
                stamp = self.registry.pointer_stamp()
            except Exception as exc:  # the store is out of reach: the held model keeps serving
                log.warning("model pointer not read (%s); still serving %s", type(exc).__name__,
                            self._loaded.version if self._loaded else "nothing")
                return self._loaded
            if stamp != self._stamp:
                self.reload(stamp)
        return self._loaded

    def peek(self) -> LoadedModel | None:
        """The model held now, without looking at the registry (for /setup and /health: no I/O)."""
        return self._loaded

    def stale(self) -> bool:
        """Whether the pointer moved since the last load attempt (one query of the store)."""
        return self.registry.pointer_stamp() != self._stamp

    def reload(self, stamp=None) -> bool:
        """Load the pointer's version if it differs from the held one. Returns True if a swap happened."""
        if not self._load_lock.acquire(blocking=False):
            return False  # another thread is loading; keep serving the held model meanwhile
        try:
            try:
                stamp = stamp if stamp is not None else self.registry.pointer_stamp()
                version = self.registry.current()
            except Exception as exc:  # the store is out of reach: the held model keeps serving
                log.warning("model pointer not read (%s)", type(exc).__name__)
                return False
            held = self._loaded
            if version is None or (held is not None and held.version == version):
                self._stamp = stamp
                return False
            started = time.perf_counter()
            try:
                bundle = self.registry.load(version)
                if self.vectors is not None:  # (before compiling: serving reads the encoder when it compiles)
                    with_vector_cache(bundle, self.vectors, self.on_demand_seconds)
                predictor = bundle.compile()  # once per version and process, before any request sees it
            except Exception as exc:  # RegistryError, or a bundle that cannot be compiled for serving
                # Remember the stamp: a broken version is not retried on every request.
                self._stamp = stamp
                self.last_error = str(exc) if isinstance(exc, RegistryError) else \
                    f"model {version} cannot be served ({type(exc).__name__})"
                log.error("model %s not loaded, still serving %s: %s", version,
                          held.version if held else "nothing", self.last_error)
                return False
            self._loaded = LoadedModel(version, bundle, predictor, time.time())
            self._stamp = stamp
            self.last_error = None
            try:  # versions the store no longer holds (pruned, or trained on an erased rater) leave this host too
                self.registry.prune_cache()
            except Exception as exc:
                log.warning("model cache not pruned (%s)", type(exc).__name__)
            log.info("serving model %s (loaded in %.0f ms, was %s)", version,
                     (time.perf_counter() - started) * 1000, held.version if held else "nothing")
            return True
        finally:
            self._load_lock.release()

    def reload_in_background(self) -> None:
        """Look at the pointer and load a promoted version without waiting for either (used by /setup, which must
        answer in milliseconds and so reads nothing itself); at most once per `check_interval` like `get`."""
        now = time.monotonic()
        if now >= self._next_check and not self._load_lock.locked():
            self._next_check = now + self.check_interval
            threading.Thread(target=self.reload, name="sense7-model-reload", daemon=True).start()
