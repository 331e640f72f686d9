"""Rater traits and per-conversation contexts for serving, from sense7's store, cached in memory.

Neither is in Label Studio task data (DESIGN.md), so /predict looks them up here. The traits table is
small (one row per rater) and is re-read whole every `refresh_seconds`; contexts are fetched per
(conversation, rater) pair on first use and re-fetched when older than `refresh_seconds`. If the store is
unreachable the last good copy keeps serving (logged once per failure, never with values).
"""

from __future__ import annotations

import logging
import threading
import time

import pandas as pd

from sense7.data.items import trait_table

log = logging.getLogger("sense7.ml_backend")


class RaterInfoCache:
    def __init__(self, store, taxonomy, refresh_seconds: float = 30.0):
        self.store = store
        self.taxonomy = taxonomy  # the study's: its profile fields score the traits
        self.refresh_seconds = refresh_seconds
        self._raters = pd.DataFrame(index=pd.Index([], name="rater_id"))
        self._traits = pd.DataFrame(index=self._raters.index)
        self._raters_at = -float("inf")
        self._contexts: dict[tuple[str, str], tuple[float, dict]] = {}
        self._lock = threading.Lock()

    def _refresh_if_stale(self) -> None:
        now = time.monotonic()
        if now - self._raters_at >= self.refresh_seconds and self._lock.acquire(blocking=False):
            try:
                raters = self.store.raters_frame()
                # The numeric trait features of every rater, computed once per refresh by the same
                # function training uses (sense7.data.items.trait_table); per request only a reindex.
                self._raters, self._traits = raters, trait_table(raters, self.taxonomy)
            except Exception as exc:  # keep serving the last good copy
                log.error("rater traits not refreshed (%s); using the copy from %.0f s ago",
                          type(exc).__name__, now - self._raters_at)
            self._raters_at = now  # also after a failure: do not hammer a store that is down
            self._lock.release()

    def raters(self, rater_ids) -> pd.DataFrame:
        """Raw trait rows of these raters (those the store knows; unknown raters are simply absent)."""
        self._refresh_if_stale()
        frame = self._raters
        return frame.loc[frame.index.intersection(pd.Index(list(dict.fromkeys(rater_ids))))]

    def trait_table(self) -> pd.DataFrame:
        """`trait_<name>` feature columns of every known rater (index rater_id)."""
        self._refresh_if_stale()
        return self._traits

    def contexts(self, pairs) -> dict[tuple[str, str], dict]:
        now = time.monotonic()
        pairs = set(pairs)
        cached = {p: self._contexts.get(p) for p in pairs}
        missing = [p for p, hit in cached.items() if hit is None or now - hit[0] >= self.refresh_seconds]
        if missing:
            try:
                fetched = self.store.contexts_for(missing)
            except Exception as exc:
                log.error("contexts not fetched (%s); using cached ones", type(exc).__name__)
                fetched = None
            if fetched is not None:
                for p in missing:  # cache absences too: a pair without a context is asked once per period
                    self._contexts[p] = cached[p] = (now, fetched.get(p) or {})
        return {p: hit[1] for p, hit in cached.items() if hit is not None and hit[1]}
