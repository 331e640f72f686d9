"""The served rater model, with label-studio-ml 2.x's model interface.

`predict(tasks, context=None, **kwargs)` and `fit(event, data, **kwargs)` have the signatures of
`label_studio_ml.model.LabelStudioMLBase` 2.x, so this class could move onto that base class unchanged
once 2.x is installable; sense7.ml_backend.app serves it over HTTP meanwhile (see ml_backend/README.md).

Which model answers for a task is decided by the task's `data.rater_id`: a rater the served bundle was
trained on gets the personalized prediction, a rater with traits only the traits-conditioned one, an
unknown rater the generic one. The bundle's compiled predictor (`sense7.model.serving`, built once per
version by HotModel) reports the kind per item; its predictions equal `ModelBundle.predict_items`.

Model versions: every prediction carries exactly the version `/setup` reports (the registry's version
name, e.g. "v3"), whatever its kind. Label Studio re-requests a task whose predictions lack the version
`/setup` returned, and shows only predictions of the project's selected version, so per-kind versions
("v3-personalized") would make it re-predict traits/generic tasks forever and hide them in the editor.
The kind is returned next to each result (`"kind"`, which Label Studio ignores) and is derivable from
the version and the rater (`known_raters` of that version).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

from sense7.ml_backend.batcher import MicroBatcher
from sense7.ml_backend.hot_model import HotModel, LoadedModel
from sense7.ml_backend.labels import RatingControl, rating_controls
from sense7.ml_backend.editor_prefills import LiveItem, LiveServing
from sense7.ml_backend.rater_info import RaterInfoCache

from sense7.data.items import task_columns
from sense7.labelstudio.protocol import task_problem
from sense7.store.study_design import HIDDEN, LIVE_KIND, arm_of
from sense7.taxonomy import Taxonomy

log = logging.getLogger("sense7.ml_backend")

NO_MODEL_VERSION = "untrained"
class ModelUnavailable(RuntimeError):
    """No model version was ever promoted (or none could be loaded)."""


class ServedItem(NamedTuple):
    kind: str  # personalized, traits or generic
    levels: list  # level per control (the predictor's `controls` order) under the study's pre-fill rule
    confidences: list  # probability of that level
    # A model with a cached text encoder: "embedded" or "lexical" (sense7.model.vector_cache); None: no encoder.
    text_vectors: str | None = None


class Sense7Model:
    """Answers Label Studio's /setup, /predict and /webhook calls for one serving process."""

    def __init__(self, hot_model: HotModel, rater_info: RaterInfoCache, taxonomy: Taxonomy,
                 on_event: Callable[[str, dict], Any] | None = None, prefill_rule: str = "mode",
                 live: LiveServing | None = None):
        self.hot_model = hot_model
        # Which level of each predicted distribution is pre-filled and recorded (sense7.model.decision).
        # build_model passes the study's SENSE7_PREFILL_RULE; built directly, the most likely level.
        self.prefill_rule = prefill_rule
        self.rater_info = rater_info
        self.on_event = on_event or log_event
        self._schemas: dict[str, str] = {}  # project uid -> label config from the last /setup
        self._plans: dict = {}  # (label config controls, predictor) -> which predicted control fills which Rating
        # Which context fields to read from the store: the study's taxonomy (settings.taxonomy_path, read
        # once per process by build_model: re-reading the taxonomy file cost ~0.1 ms a request).
        self.taxonomy = taxonomy
        # Concurrent requests of this process share model calls (see ml_backend/batcher.py).
        self.batcher = MicroBatcher(self._predict_data)
        # Tasks of raters with answers on the rater page newer than the served version (ml_backend/editor_prefills.py).
        self.live = live

    # ------------------------------------------------------------------ /setup, /versions
    @property
    def model_version(self) -> str:
        loaded = self.hot_model.peek()
        return loaded.version if loaded else NO_MODEL_VERSION

    def setup(self, project: str | None, schema: str | None) -> str:
        """Remember the project's config; never loads a model inline (Label Studio waits 3 s at most): the
        version held, which the process's background thread keeps current (HotModel.start)."""
        if project and schema:
            self._schemas[str(project).split(".")[0]] = schema
        return self.model_version

    def versions(self) -> list[str]:
        return [v.name for v in self.hot_model.registry.list_versions()]

    # ------------------------------------------------------------------ /predict
    def predict(self, tasks: list, context: dict | None = None, **kwargs) -> list[dict]:
        """Exactly one result per task, in order. kwargs: `label_config` (or `project` seen in /setup)."""
        loaded = self.hot_model.get()
        if loaded is None:
            raise ModelUnavailable(self.hot_model.last_error or "no model version has been promoted yet")
        label_config = kwargs.get("label_config") or self._schemas.get(str(kwargs.get("project") or "").split(".")[0])
        controls = rating_controls(label_config)  # LabelConfigError -> HTTP 400 for the whole request
        plan = self._plan(controls, loaded)
        results: list[dict | None] = [None] * len(tasks)
        good = []
        for i, task in enumerate(tasks):
            problem = task_problem(task)
            if problem:
                results[i] = self._error_result(task, problem, loaded.version)
            elif arm_of(task.get("data")) == HIDDEN:
                # The study hides this task's prediction (sense7.store.study_design): it was recorded at import;
                # an empty result of the served version shows nothing and stops Label Studio asking again.
                results[i] = self._hidden_result(loaded.version)
            else:
                good.append(i)
        watermarks = self.live.watermarks() if good and self.live is not None else None
        if watermarks:  # some rater answered on the rater page (none anywhere: one dict check)
            good = self._live_results(tasks, good, results, plan, loaded, watermarks)
        if good:
            try:
                predicted = self.batcher.run([tasks[i]["data"] for i in good], key=loaded.version, context=loaded)
            except Exception as exc:
                # One odd task must not cost the batch: fall back to one task at a time to isolate it.
                # The exception type only: messages of data errors may quote task or trait values.
                log.error("batch of %d tasks failed (%s); predicting them one by one", len(good),
                          type(exc).__name__)
                log.debug("batch failure", exc_info=True)
                predicted = []
                for i in good:
                    try:
                        predicted.extend(self._predict_data([tasks[i]["data"]], loaded))
                    except Exception as exc:
                        predicted.append(exc)
            for i, item in zip(good, predicted):
                if isinstance(item, Exception):
                    results[i] = self._error_result(tasks[i], f"prediction failed: {type(item).__name__}",
                                                    loaded.version)
                else:
                    results[i] = self._result(item, plan, loaded.version)
        return results

    def _live_results(self, tasks: list, good: list[int], results: list, plan: list, loaded: LoadedModel,
                      watermarks: dict) -> list[int]:
        """Fill `results` for the tasks whose rater has newer answers; return the indices left to predict."""
        try:
            live = self.live.predict({i: tasks[i]["data"] for i in good}, loaded.predictor,
                                     self.rater_info.trait_table(), self._columns, self.prefill_rule, watermarks)
        except Exception as exc:  # the static prediction is always a valid answer
            log.error("live predictions failed (%s); serving the static ones", type(exc).__name__)
            log.debug("live failure", exc_info=True)
            return good
        for i, item in live.items():
            results[i] = self._live_result(item, plan, loaded.version)
        return [i for i in good if i not in live] if live else good

    @classmethod
    def _live_result(cls, item: LiveItem, plan: list, version: str) -> dict:
        """A live answer: `model_version` stays the served one (Label Studio compares it with /setup's);
        which answers it used: `own_ratings` and `live_version`."""
        result = cls._result(ServedItem(LIVE_KIND, item.levels, item.confidences), plan, version)
        result.update(own_ratings=item.own_ratings, live_version=item.version)
        return result

    def _columns(self, task_datas: list[dict]) -> dict:
        """The predictor's plain item columns (sense7.data.items.task_columns), with contexts from
        the store's cache: traits and contexts never come from the task."""
        contexts = self.rater_info.contexts((str(d["conversation_id"]), str(d["rater_id"])) for d in task_datas)
        return task_columns(task_datas, contexts, self.taxonomy)

    def _predict_data(self, task_datas: list[dict], loaded: LoadedModel) -> list[ServedItem]:
        """One ServedItem per task data (the predictor takes plain columns, not a DataFrame)."""
        predictor = loaded.predictor
        raters = predictor.rater_table(self.rater_info.trait_table())
        predictions = predictor.predict(self._columns(task_datas), raters)
        levels, confidences = predictions.best(self.prefill_rule)
        if len(predictions.kinds) != len(task_datas):
            raise RuntimeError(f"predictor returned {len(predictions.kinds)} predictions for {len(task_datas)} items")
        text_vectors = predictions.text_vectors() or [None] * len(task_datas)
        return list(map(ServedItem, predictions.kinds, levels.tolist(), confidences.tolist(), text_vectors))

    def _plan(self, controls: tuple[RatingControl, ...], loaded: LoadedModel) -> list:
        """(predicted control index, Rating control) for each Rating of the config the model predicts."""
        key = (controls, loaded.version, id(loaded.predictor))
        plan = self._plans.get(key)
        if plan is None:
            predicted = list(loaded.predictor.controls)
            # A Rating the model was not trained for gets nothing pre-filled.
            plan = [(predicted.index(c.from_name), c) for c in controls if c.from_name in predicted]
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    @staticmethod
    def _result(item: ServedItem, plan: list, version: str) -> dict:
        # A batch-10 /predict builds 80 of these rating dicts: attribute look-ups hoisted (cProfile: 10% of it).
        levels, confidences = item.levels, item.confidences
        result, scored = [], []
        for j, control in plan:
            max_rating = control.max_rating
            level = int(levels[j])
            result.append({"from_name": control.from_name, "to_name": control.to_name, "type": "rating",
                           "value": {"rating": 1 if level < 1 else max_rating if level > max_rating else level}})
            confidence = confidences[j]
            if confidence is not None and confidence == confidence:  # (NaN != NaN)
                scored.append(confidence)
        score = sum(scored) / len(scored) if scored else 0.0
        answer = {"result": result, "score": round(score, 4), "model_version": version, "kind": item.kind}
        if item.text_vectors is not None:  # (an extra field, ignored by Label Studio, like "kind")
            answer["text_vectors"] = item.text_vectors
        return answer

    @staticmethod
    def _hidden_result(version: str) -> dict:
        """A hidden-arm task's answer: nothing to show, of the served version (Label Studio stops asking)."""
        return {"result": [], "score": 0.0, "model_version": version, "kind": "hidden"}

    @staticmethod
    def _error_result(task: Any, problem: str, version: str) -> dict:
        task_id = task.get("id") if isinstance(task, dict) else None
        label = f"task {task_id}" if task_id is not None else "task"
        return {"result": [], "score": 0.0, "model_version": version, "error": f"{label}: {problem}"}

    # ------------------------------------------------------------------ recorded predictions
    def prediction_records(self, tasks: list[dict]) -> list[dict | None]:
        """What the study records before a rater sees each task (sense7.store.study_design), whatever its arm: the
        served version, the kind of model that answered, the level the study's pre-fill rule picks (what a
        shown task pre-fills) and the expected rating per control, and the generic model's for the same task. None for a task that cannot be predicted."""
        return self.predict_and_record(tasks)[1]

    def predict_and_record(self, tasks: list[dict], label_config: str | None = None) -> tuple[list, list]:
        """(Label Studio answers as `predict` gives them, or [] without a label config; the records of
        `prediction_records`) from one pass of the model: bulk import and pre-annotation need both."""
        loaded = self.hot_model.get()
        if loaded is None:
            raise ModelUnavailable(self.hot_model.last_error or "no model version has been promoted yet")
        plan = self._plan(rating_controls(label_config), loaded) if label_config else None
        answers: list = [None] * len(tasks) if plan is not None else []
        records: list[dict | None] = [None] * len(tasks)
        good = []
        for i, task in enumerate(tasks):
            problem = task_problem(task)
            if problem is None:
                good.append(i)
            elif plan is not None:
                answers[i] = self._error_result(task, problem, loaded.version)
        if not good:
            return answers, records
        predictor = loaded.predictor
        datas = [tasks[i]["data"] for i in good]
        columns = self._columns(datas)
        served = predictor.predict(columns, predictor.rater_table(self.rater_info.trait_table()))
        generic = predictor.predict_generic(columns)
        controls = list(predictor.controls)
        (s_level, s_conf), g_level = served.best(self.prefill_rule), generic.best(self.prefill_rule)[0]
        s_exp, g_exp = served.expected(), generic.expected()
        text_vectors = served.text_vectors() or [None] * len(datas)
        for row, (i, data) in enumerate(zip(good, datas)):
            records[i] = {
                "task_key": str(data.get("task_key") or ""), "version": loaded.version,
                "rater_id": str(data["rater_id"]), "conversation_id": str(data["conversation_id"]),
                "turn_index": int(data["turn_index"]), "arm": arm_of(data), "kind": served.kinds[row],
                "levels": {c: int(v) for c, v in zip(controls, s_level[row])},
                "expected": {c: round(float(v), 4) for c, v in zip(controls, s_exp[row])},
                "generic_levels": {c: int(v) for c, v in zip(controls, g_level[row])},
                "generic_expected": {c: round(float(v), 4) for c, v in zip(controls, g_exp[row])},
                "text_vectors": text_vectors[row],
            }
            if plan is not None:
                answers[i] = (self._hidden_result(loaded.version) if arm_of(data) == HIDDEN else
                              self._result(ServedItem(served.kinds[row], s_level[row].tolist(), s_conf[row].tolist(),
                                                      text_vectors[row]), plan, loaded.version))
        return answers, records

    # ------------------------------------------------------------------ bulk import
    def import_predictor(self, label_config: str) -> "ImportPredictor | None":
        """What `sense7.labelstudio.importer.import_conversations(predict=...)` takes: the served version's
        predictions in Label Studio's import format. None when no version is served. A job's (or a command's)
        call: the registry's current version is loaded first if the process does not hold it yet."""
        self.hot_model.refresh()
        loaded = self.hot_model.get()
        return ImportPredictor(self, label_config, loaded.version) if loaded is not None else None

    # ------------------------------------------------------------------ /webhook
    def fit(self, event: str, data: dict, **kwargs) -> Any:
        """Hand the event to `on_event` (e.g. enqueue a sync/retrain job); never train inline."""
        return self.on_event(event, data)


def import_prediction(answer: dict) -> dict | None:
    """One `predict` answer as a prediction to import ({"result", "score", "model_version"}); None for an
    error or an empty result (nothing worth pre-filling)."""
    if answer.get("error") or not answer.get("result"):
        return None
    return {"result": answer["result"], "score": answer["score"], "model_version": answer["model_version"]}


class ImportPredictor:
    """Callable: task dicts -> one importable prediction or None each (see Sense7Model.import_predictor).
    `version` is the version served when it was made; a promotion meanwhile is picked up by `predict` once the
    process's model follows it (HotModel.start, or the next job's `refresh`)."""

    def __init__(self, model: Sense7Model, label_config: str, version: str):
        self.model, self.label_config, self.version = model, label_config, version

    def __call__(self, tasks: list[dict]) -> list[dict | None]:
        return [import_prediction(a) for a in self.model.predict(tasks, label_config=self.label_config)]

    def with_records(self, tasks: list[dict]) -> tuple[list[dict | None], list[dict | None]]:
        """(importable predictions, records to keep) from one pass (Sense7Model.predict_and_record)."""
        answers, records = self.model.predict_and_record(tasks, self.label_config)
        return [import_prediction(a) for a in answers], records


def import_predictor(settings, label_config: str) -> ImportPredictor | None:
    """The served version's predictor for a bulk import (None when no version was promoted)."""
    return build_model(settings).import_predictor(label_config)


def log_event(action: str, payload: dict) -> None:
    """Default event handler: record that the event arrived (ids only, never the payload)."""
    project = payload.get("project") if isinstance(payload, dict) else None
    project_id = project.get("id") if isinstance(project, dict) else project
    log.info("webhook %s for project %s received (no handler configured)", action, project_id)


def build_model(settings, on_event: Callable[[str, dict], Any] | None = None,
                check_interval: float = 1.0, refresh_seconds: float = 30.0, serving: bool = False) -> Sense7Model:
    """The model of one serving process (the backend's gunicorn worker, or a Celery worker pushing
    pre-annotations): the registry's current version loaded now, once (so a worker answers /predict only with a
    model loaded). It then follows promotions only when asked: the backend's app factory starts its background
    thread (HotModel.start), a job calls HotModel.refresh when it starts. Its text encoder, if any, reads the
    store's text vectors; `serving` (the backend's requests): a text not embedded yet is embedded within
    settings.text_vector_budget seconds or answered by the lexical part (each answer's `text_vectors` says which);
    otherwise (bulk pre-annotation, imports) every missing text is embedded."""
    from sense7.store.database import Store
    from sense7.model.registry import ModelRegistry
    from sense7.model.vector_cache import VectorCache
    from sense7.taxonomy import study_taxonomy

    store = Store(settings.store_url)
    hot = HotModel(ModelRegistry.from_settings(settings, store), check_interval=check_interval,
                   vectors=VectorCache.of_store(store),
                   on_demand_seconds=settings.text_vector_budget if serving else None)
    hot.refresh()
    taxonomy = study_taxonomy(settings)
    return Sense7Model(hot, RaterInfoCache(store, taxonomy, refresh_seconds=refresh_seconds),
                       taxonomy, on_event=on_event, prefill_rule=settings.study.prefill_rule,
                       live=LiveServing(store, taxonomy, check_interval=check_interval))
