"""Staff see the same: /predict for a task of a rater with answers newer than the served version.

The rater page pre-fills each turn with the served version's posterior of its rater updated by every
answer they gave so far (sense7.rater_page.live). Label Studio's editor asks this backend; without this
module it would show the served version's (static) prediction until a retrain, so staff reviewing a task
and the rater who rated it would see different pre-fills. Here the same closed-form posterior
(sense7.model.live, population fixed) is applied to the same answers (the rater page's outbox), and the
answer says how many it used (`"kind": "live"`, `"own_ratings": n`, `"live_version": "v3+live"`); the
`model_version` stays the served version's, which Label Studio compares with /setup's.

Kept off the hot path: which raters have answers is one aggregate query over the outbox at most every
`check_interval` seconds (per process, by whichever request finds the copy stale, never waited on by
others); a rater's answers are read once per change of their watermark; the posterior of all their
answers is kept in the served version's PosteriorCache (sense7.model.live), the one the rater page uses,
keyed by the rater, their traits and the answers themselves. A request whose raters have no answers pays a
dict lookup per task. A rater whose answers the served version was trained on already gets exactly the static answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from sense7.data.items import trait_table
from sense7.model.live import LivePredictor, LiveUnsupported, traits_fingerprint
from sense7.store.database import Store
from sense7.store.rater_answers import answer_watermarks, queue_task_datas, rated_items, submissions_stamp
from sense7.store.rater_page_tables import RaterQueue
from sense7.store.study_design import live_version

log = logging.getLogger("sense7.ml_backend")


class LiveItem(NamedTuple):
    levels: list  # level per control (the predictor's order) under the study's pre-fill rule
    confidences: list
    own_ratings: int  # how many of the rater's own answers moved it
    version: str  # "<served>+live"


class RaterAnswers(NamedTuple):
    """One rater's answered turns as the model reads them (task data) and their answers' values."""
    task_keys: list[str]
    datas: list[dict]
    values: list[dict]  # control -> level, per answered turn
    traits: pd.DataFrame | None  # the questionnaire answered on the page (None: the store's traits)


class LiveServing:
    def __init__(self, store: Store, taxonomy, check_interval: float = 1.0):
        self.store = store
        self.taxonomy = taxonomy
        self.check_interval = check_interval
        self._lock = threading.Lock()  # one refresher at a time; nobody waits on it
        self._checked = -np.inf
        self._stamp = None
        self._watermarks: dict[str, tuple] = {}
        self._answers: dict[str, tuple[tuple, RaterAnswers]] = {}  # rater -> (watermark, answers)
        # id(compiled bundle) -> its live form, which holds the posterior cache shared with the rater page's code
        self._predictors: dict[int, LivePredictor | None] = {}

    def watermarks(self) -> dict[str, tuple]:
        """rater -> watermark of their rating answers; re-read at most every `check_interval` seconds."""
        now = time.monotonic()
        if now - self._checked >= self.check_interval and self._lock.acquire(blocking=False):
            try:
                self._checked = now
                stamp = submissions_stamp(self.store)
                if stamp != self._stamp:
                    self._watermarks, self._stamp = answer_watermarks(self.store), stamp
            except Exception as exc:  # keep the last copy: a store hiccup must not fail /predict
                log.error("rater answers not refreshed (%s)", type(exc).__name__)
            finally:
                self._lock.release()
        return self._watermarks

    def live_form(self, compiled) -> LivePredictor | None:
        key = id(compiled)
        if key not in self._predictors:
            try:
                predictor = LivePredictor(compiled)
            except LiveUnsupported as exc:
                log.info("version %s has no live predictions (%s)", compiled.version, exc)
                predictor = None
            if len(self._predictors) > 4:  # old versions (and their cached posteriors): let them go
                self._predictors.clear()
            self._predictors[key] = predictor
        return self._predictors[key]

    def rater_answers(self, rater_id: str, watermark: tuple) -> RaterAnswers:
        cached = self._answers.get(rater_id)
        if cached is not None and cached[0] == watermark:
            return cached[1]
        items = RaterQueue(self.store).items(rater_id)
        datas = queue_task_datas(rater_id, items)
        rated = rated_items(datas, items)
        profile = next((i.answer for i in items if i.kind == "profile" and i.answer), None)
        traits = None
        if profile and profile.get("traits"):  # as the rater page: the questionnaire answered there
            raw = pd.DataFrame([profile["traits"]], index=pd.Index([rater_id], name="rater_id"))
            traits = trait_table(raw, self.taxonomy)
        answers = RaterAnswers([datas[i.task_id]["task_key"] for i in rated], [datas[i.task_id] for i in rated],
                               [i.answer["values"] for i in rated], traits)
        self._answers[rater_id] = (watermark, answers)
        return answers

    def predict(self, datas: dict[int, dict], compiled, traits: pd.DataFrame,
                columns_of: Callable[[list[dict]], dict], prefill_rule: str,
                watermarks: dict[str, tuple] | None = None) -> dict[int, LiveItem]:
        """index -> LiveItem for the tasks (index -> task data) whose rater has answers new to the served
        version; the others are left to the static prediction. `columns_of` makes the model's item columns
        of task datas (the backend's, with the store's contexts); `watermarks`: this request's `watermarks()`."""
        watermarks = self.watermarks() if watermarks is None else watermarks
        if not watermarks:
            return {}
        by_rater = defaultdict(list)
        for i, data in datas.items():
            rater = str(data.get("rater_id"))
            if rater in watermarks and not data.get("repeat"):
                by_rater[rater].append(i)
        if not by_rater:
            return {}
        predictor = self.live_form(compiled)
        if predictor is None:
            return {}
        out = {}
        for rater, rows in by_rater.items():
            answers = self.rater_answers(rater, watermarks[rater])
            if not answers.task_keys:
                continue
            own = answers.traits if answers.traits is not None else traits
            # A turn's own answer never predicts it (as on the rater page): those turns get their own state.
            groups = defaultdict(list)
            for i in rows:
                key = str(datas[i].get("task_key") or "")
                groups[key if key in answers.task_keys else None].append(i)
            for excluded, group in groups.items():
                state = self._state(predictor, rater, answers, own, excluded, columns_of)
                if state.n_ratings == 0:
                    continue  # nothing the version did not train on: exactly the static prediction
                predictions = predictor.predict_with(state, columns_of([datas[i] for i in group]))
                levels, confidences = predictions.best(prefill_rule)
                for row, i in enumerate(group):
                    out[i] = LiveItem(levels[row].tolist(), confidences[row].tolist(), int(state.n_ratings),
                                      live_version(compiled.version))
        return out

    def _state(self, predictor: LivePredictor, rater: str, answers: RaterAnswers, traits, excluded: str | None,
               columns_of):
        """The rater's posterior without the answer to `excluded` (a task key, or None: all of them), from the
        predictor's PosteriorCache (the one the rater page uses; a new answer or version is a new key). The
        answered turns' item columns are made only for turns whose text scores are not cached yet."""
        keep = [k != excluded for k in answers.task_keys]
        rated = [d for d, ok in zip(answers.datas, keep) if ok]
        controls = predictor.compiled.controls
        ratings = np.array([[v.get(c, np.nan) for c in controls] for v, ok in zip(answers.values, keep) if ok],
                           dtype=float).reshape(len(rated), len(controls))
        rated_ids = {"conversation_id": [str(d["conversation_id"]) for d in rated],
                     "turn_index": [d["turn_index"] for d in rated], "rater_id": [str(d["rater_id"]) for d in rated]}
        traits_key = None
        if answers.traits is not None:  # the questionnaire answered on the page: its own (small) table
            traits_key = ("page", traits_fingerprint(answers.traits, rater))
        return predictor.posterior(rater, traits, lambda: columns_of(rated), ratings, traits_key, rated_ids)
