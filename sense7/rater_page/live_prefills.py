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
version without live statistics or no version at all: the page shows the queue's pre-fill as before.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pandas as pd

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
    """The rater page's live pre-fills for one process: the registry's current version, re-checked at most
    every `check_interval` seconds (a promotion is picked up without a restart; see `predictor`)."""

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
        self._lock = threading.Lock()
        self._stamp = None
        self._predictor: LivePredictor | None = None
        self._loading = None  # the pointer stamp being loaded in the background, if any
        self._checked = -np.inf

    def predictor(self) -> LivePredictor | None:
        """The current version's live predictor (None: no version, or one without live statistics).

        The first version a process meets is loaded by the request that needs it; a later promotion is
        loaded in the background while the previous version keeps answering (a page never waits for it)."""
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return self._predictor
        with self._lock:
            if now - self._checked < self.check_interval:
                return self._predictor
            self._checked = now
            try:
                stamp = self.registry.pointer_stamp()
            except Exception as exc:  # the store is out of reach: the version held keeps answering
                log.warning("model pointer not read (%s)", type(exc).__name__)
                return self._predictor
            if stamp == self._stamp or stamp == self._loading:
                return self._predictor
            if self._predictor is None:
                self._predictor, self._stamp = self._load(), stamp
            else:
                self._loading = stamp
                threading.Thread(target=self._swap, args=(stamp,), name="live-prefill-load", daemon=True).start()
        return self._predictor

    def _swap(self, stamp) -> None:
        predictor = self._load()
        with self._lock:
            self._predictor, self._stamp, self._loading = predictor, stamp, None

    def _load(self) -> LivePredictor | None:
        version = None
        try:
            version = self.registry.current()
            if version is None:
                return None
            bundle = with_vector_cache(self.registry.load(version), self.vectors, self.text_vector_budget)
            predictor = LivePredictor(bundle.compile())
        except LiveUnsupported as exc:
            log.info("version %s has no live pre-fills (%s)", version, exc)
            return None
        except Exception as exc:  # a broken version must not break the page: the queue's pre-fill stays
            log.warning("version %s could not be loaded for live pre-fills (%s)", version, type(exc).__name__)
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
