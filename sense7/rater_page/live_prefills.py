"""Live pre-fills: each turn's prediction from the served version with this rater's posterior updated by
every answer they gave on this page so far (sense7.model.live_posterior), recorded before the page is sent.

Why: a rater's answers otherwise reach their pre-fills only through delivery, sync, a retrain and the next
queue copy; a participant of a 20-minute session would see the traits prior to the end. Here the page's
own submissions (in the store the moment they are saved) update the rater's posterior with the version's
population parameters fixed: no retrain, no Label Studio round trip; one text pass over the rater's rated
turns and one compiled predict.

Every live prediction is recorded (sense7.store.study_design: version "<served>+live", kind `live`, how many
of the rater's own answers it used) before the page that shows it is sent, hidden-arm turns included
(recorded, never shown). The first record of a task is the one shown again on a reload, so what is
recorded is what the rater saw. A rater without answers new to the served version, a repeat turn, a
version without live statistics, no version at all or none loaded by this process yet: the page shows the
queue's pre-fill as before. The version is loaded and followed by a background thread (`LivePrefills.start`),
never by a request.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pandas as pd
from sqlalchemy.exc import SQLAlchemyError

from sense7.data.conversations import task_key
from sense7.data.items import task_columns, trait_table
from sense7.model.live_posterior import LivePredictor, LiveUnsupported
from sense7.model.registry import ModelRegistry
from sense7.model.vector_cache import VectorCache, with_vector_cache
from sense7.store.database import Store
from sense7.store.rater_answers import is_repeat, queue_task_datas, rated_items
from sense7.store.rater_page_tables import QueueItem
from sense7.store.study_design import HIDDEN, LIVE_KIND, StudyRecords, live_version

log = logging.getLogger(__name__)


class LivePrefills:
    """The rater page's live pre-fills for one process: the registry's current version, loaded and followed off
    the request path.

    A request only reads the predictor held (`predictor`: no query, no lock); what is held is loaded by
    `refresh`, which the process's background thread (`start`: gunicorn's app factory starts it in each
    worker) runs at once and then every `check_interval` seconds: one small query of the pointer, and when it
    moved, the new version fetched from the store (or this host's cache by hash), unpacked, loaded and
    compiled, then swapped in as one reference. So a page never waits for the store's pointer or a version's
    blob: until the first load ends it shows the queue's pre-fill, and while a promoted version loads the
    previous one keeps answering. A version that cannot be loaded is logged and skipped until the pointer
    moves again (the one held keeps answering); one without live statistics serves no live pre-fills."""

    def __init__(self, registry: ModelRegistry, store: Store, taxonomy, check_interval: float = 5.0,
                 text_vector_budget: float | None = 0.5):
        self.registry = registry
        self.store = store
        # A version's text encoder reads the store's text vectors (sense7.model.vector_cache); a text not embedded
        # yet gets at most this long per page (then the lexical part answers for it).
        self.vectors = VectorCache.of_store(store)
        self.text_vector_budget = text_vector_budget
        self.records = StudyRecords(store)
        self.taxonomy = taxonomy
        self.check_interval = check_interval
        self._predictor: LivePredictor | None = None
        self._stamp = None  # the pointer stamp last acted on (loaded, or found without a live-capable version)
        self._refresh_lock = threading.Lock()  # between refreshes only: a request never takes it
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def predictor(self) -> LivePredictor | None:
        """The live predictor held (None: nothing loaded yet, no version, or one without live statistics).
        Reads one attribute: the store is never asked on a request."""
        return self._predictor

    def start(self) -> None:
        """Load the current version and follow the pointer in a background thread (daemon: it ends with the
        process). Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._follow, name="live-prefill-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the background thread (after a refresh under way finishes)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _follow(self) -> None:
        while not self._stopped.is_set():
            try:
                self.refresh()
            except Exception as exc:  # never let the thread die: the next round tries again
                log.warning("live pre-fill refresh failed (%s)", type(exc).__name__)
            self._stopped.wait(self.check_interval)

    def refresh(self) -> bool:
        """Read the store's pointer; when it moved, load the version it names and hold it. True when what is
        held changed. Run by the background thread (and by whoever must have the version now: a test, a
        benchmark), never by a request."""
        with self._refresh_lock:
            try:
                stamp = self.registry.pointer_stamp()
            except Exception as exc:  # the store is out of reach: the version held keeps answering
                log.warning("model pointer not read (%s)", type(exc).__name__)
                return False
            if stamp == self._stamp:
                return False
            try:
                predictor = self._load(self._predictor)
            except SQLAlchemyError as exc:  # the store went away mid-load: the next round tries again
                log.warning("model version not read from the store (%s); trying again", type(exc).__name__)
                return False
            except Exception as exc:  # a broken version must not break the page: the version held stays
                log.warning("the served version could not be loaded for live pre-fills (%s: %s); still "
                            "serving %s", type(exc).__name__, exc, self._predictor.version if self._predictor
                            else "no live pre-fills")
                self._stamp = stamp  # not tried again until the pointer moves
                return False
            self._stamp = stamp
            changed = predictor is not self._predictor
            self._predictor = predictor  # one reference: a request reads the old predictor or the new one
            return changed

    def _load(self, held: LivePredictor | None) -> LivePredictor | None:
        """The current version's live predictor (None: no version, or one without live statistics); `held`
        itself when it is that version's (the same version promoted again)."""
        version = self.registry.current()
        if version is None:
            return None
        if held is not None and held.version == version:
            return held
        try:
            bundle = with_vector_cache(self.registry.load(version), self.vectors, self.text_vector_budget)
            predictor = LivePredictor(bundle.compile())
        except LiveUnsupported as exc:
            log.info("version %s has no live pre-fills (%s)", version, exc)
            return None
        try:  # versions the store no longer holds (pruned, or trained on an erased rater) leave this host too
            self.registry.prune_cache()
        except Exception as exc:
            log.warning("model cache not pruned (%s)", type(exc).__name__)
        return predictor

    def traits(self, rater_id: str, items: list[QueueItem]) -> pd.DataFrame:
        """The rater's trait_<name> row: the questionnaire answered on this page, else the store's."""
        return self._raw_traits(rater_id, items)[0]()

    def _raw_traits(self, rater_id: str, items: list[QueueItem]):
        """(a function making the rater's trait table, what identifies it): the trait features are made only
        when the predictor's PosteriorCache does not hold this rater's start with these traits already."""
        answered = next((i.answer for i in items if i.kind == "profile" and i.answer), None)
        if answered and answered.get("traits"):
            raw_traits = dict(answered["traits"])

            def make():
                return trait_table(pd.DataFrame([raw_traits], index=pd.Index([rater_id], name="rater_id")),
                                   self.taxonomy)
        else:  # the store's: one indexed read (the questionnaire is usually answered on the page)
            raw = self.store.raters_frame([rater_id])
            raw_traits = raw.loc[rater_id].to_dict() if rater_id in raw.index else {}

            def make():
                return trait_table(raw, self.taxonomy)
        return make, ("raw", tuple(sorted((str(k), repr(v)) for k, v in raw_traits.items())))

    def prefill(self, rater_id: str, items: list[QueueItem], item: QueueItem) -> dict | None:
        """The live pre-fill of an unanswered rating turn ({"version", "values", "own_ratings"}), recorded
        first; None when the page should show what it showed before (hidden arm: recorded, None)."""
        if item.kind != "rating" or is_repeat(item) or item.conversation_id is None:
            return None
        predictor = self.predictor()
        if predictor is None:
            return None
        key = task_key(item.conversation_id, int(item.turn_index), rater_id)
        version = live_version(predictor.version)
        record = self.records.recorded(key, version)
        if record is None:
            record = self._record(predictor, rater_id, items, item, key, version)
        if record is None or record["arm"] == HIDDEN:
            return None
        return {"version": record["version"], "values": dict(record["levels"]),
                "own_ratings": record["own_ratings"], "kind": LIVE_KIND}

    def _record(self, predictor: LivePredictor, rater_id: str, items: list[QueueItem], item: QueueItem,
                key: str, version: str) -> dict | None:
        datas = queue_task_datas(rater_id, items)
        rated = [i for i in rated_items(datas, items) if i.task_id != item.task_id]
        if not rated or item.task_id not in datas:
            return None
        controls = predictor.compiled.controls
        wanted = [datas[i.task_id] for i in rated]
        target_data = datas[item.task_id]
        contexts = self.store.contexts_for([(target_data["conversation_id"], rater_id)])
        target = task_columns([target_data], contexts, self.taxonomy)
        # The rated turns' item columns are made only for turns whose text scores the predictor has not
        # cached yet (a page otherwise does O(answers) text work for turns it scored on earlier pages).
        rated_ids = {"conversation_id": [str(d["conversation_id"]) for d in wanted],
                     "turn_index": [d["turn_index"] for d in wanted], "rater_id": [rater_id] * len(wanted)}

        def rated_columns():
            return task_columns(wanted, self.store.contexts_for((d["conversation_id"], rater_id) for d in wanted),
                                self.taxonomy)

        ratings = np.array([[i.answer["values"].get(c, np.nan) for c in controls] for i in rated], dtype=float)
        make_traits, traits_key = self._raw_traits(rater_id, items)
        live = predictor.predict(target, rater_id, make_traits, rated_columns, ratings, traits_key, rated_ids)
        if live is None:
            return None
        levels, _ = live.predictions.best()
        generic = predictor.compiled.predict_generic(target)
        self.records.record_predictions([{
            "task_key": key, "version": version, "rater_id": rater_id,
            "conversation_id": str(item.conversation_id), "turn_index": int(item.turn_index),
            "arm": self.records.arm(key), "kind": LIVE_KIND, "own_ratings": int(live.own_ratings),
            "levels": {c: int(v) for c, v in zip(controls, levels[0])},
            "expected": {c: round(float(v), 4) for c, v in zip(controls, live.predictions.expected()[0])},
            "generic_levels": {c: int(v) for c, v in zip(controls, generic.best()[0][0])},
            "generic_expected": {c: round(float(v), 4) for c, v in zip(controls, generic.expected()[0])},
            # (the target's texts, read by the live prediction as by the generic one: embedded or lexical)
            "text_vectors": (generic.text_vectors() or [None])[0],
        }])
        return self.records.recorded(key, version)  # the first record wins (another worker may have made it)
