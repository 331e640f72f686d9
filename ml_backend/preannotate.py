"""Push pre-annotations: predict every rating task lacking a prediction of the served version, in bulk.

Predictions are built by the ML backend's own `Sense7Model.predict` (the code that answers Label Studio's
/predict), so a task gets the same pre-annotation whichever way it arrives. Pushing them ourselves in
chunks through `projects.import_predictions` avoids Label Studio's one-request-per-batch /predict calls
with their 100 s timeout. Idempotent: tasks that already carry the served version are skipped.

The study's hidden arm (sense7.store.study_design): those tasks' predictions are recorded in the store (once per
version) and never pushed to Label Studio, where a staff member or a rater could see them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from sense7.store.study_design import SHOWN, StudyRecords, arm_of


@dataclass
class PreannotateResult:
    version: str | None
    pending: int = 0     # tasks without a prediction of `version` when the run started
    pushed: int = 0      # predictions imported into Label Studio
    recorded: int = 0    # predictions recorded in the store (both arms; hidden ones only there)
    failed: list[str] = field(default_factory=list)  # "task <id>: reason" (no task content)
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # seconds spent listing tasks, predicting, importing

    def as_dict(self) -> dict:
        return asdict(self)


class Preannotator:
    def __init__(self, client, model, project_id: int, chunk: int = 500, records: StudyRecords | None = None):
        self.client = client
        self.model = model
        self.project_id = project_id
        self.chunk = chunk
        self.records = records  # where predictions are recorded (None: not recorded)

    def pending_tasks(self, version: str) -> list[dict]:
        """Unlabeled tasks of the project without a prediction of `version` (id and data only). Labeled
        tasks are left alone: a pre-annotation helps only before someone rates the turn."""
        pending = []
        for task in self.client.tasks.list(project=self.project_id,
                                           include="id,data,predictions_model_versions,total_annotations",
                                           page_size=1000):
            if task.total_annotations:
                continue
            versions = {v.strip() for v in str(task.predictions_model_versions or "").split(",") if v.strip()}
            data = dict(task.data or {})
            # A hidden task may carry the empty answer the backend gave Label Studio's editor for it: whether
            # its prediction is recorded is the store's to say (run() filters by the records), not Label Studio's.
            if version not in versions or arm_of(data) != SHOWN:
                pending.append({"id": task.id, "data": data})
        return pending

    def run(self, on_total: Callable[[int], None] | None = None,
            on_chunk: Callable[[int], None] | None = None) -> PreannotateResult:
        from sense7.ml_backend.model import ModelUnavailable, import_prediction

        started = time.perf_counter()
        self.model.hot_model.refresh()  # the version served now (a promotion queues this job), loaded by the job
        loaded = self.model.hot_model.get()
        if loaded is None:
            raise ModelUnavailable("no model version has been promoted yet: run `sense7 retrain` first")
        version = loaded.version
        result = PreannotateResult(version)
        clock = time.perf_counter()
        tasks = self.pending_tasks(version)
        if self.records is not None:  # hidden tasks never carry a prediction in Label Studio: once a version
            done = self.records.recorded_keys(version)  # has recorded theirs, there is nothing left to do
            tasks = [t for t in tasks if arm_of(t["data"]) == SHOWN or t["data"].get("task_key") not in done]
        else:
            tasks = [t for t in tasks if arm_of(t["data"]) == SHOWN]
        result.phases["list"] = time.perf_counter() - clock
        result.pending = len(tasks)
        if on_total:
            on_total(len(tasks))
        label_config = self.client.projects.get(self.project_id).label_config
        for start in range(0, len(tasks), self.chunk):
            part = tasks[start:start + self.chunk]
            clock = time.perf_counter()
            if self.records is not None:  # one pass of the model: the records of both arms, the shown answers
                answers, made = self.model.predict_and_record(part, label_config)
                rows = [r for r in made if r]
                self.records.record_predictions(rows)
                result.recorded += len(rows)
                shown = [k for k, t in enumerate(part) if arm_of(t["data"]) == SHOWN]
                part, answers = [part[k] for k in shown], [answers[k] for k in shown]
            else:
                part = [t for t in part if arm_of(t["data"]) == SHOWN]
                answers = self.model.predict(part, label_config=label_config) if part else []
            result.phases["predict"] = result.phases.get("predict", 0.0) + time.perf_counter() - clock
            predictions = []
            for task, answer in zip(part, answers):
                prediction = import_prediction(answer)
                if prediction is None:
                    result.failed.append(answer.get("error") or f"task {task['id']}: empty prediction")
                    continue
                predictions.append({"task": task["id"], **prediction})
            if predictions:
                clock = time.perf_counter()
                self.client.projects.import_predictions(self.project_id, request=predictions)
                result.phases["import"] = result.phases.get("import", 0.0) + time.perf_counter() - clock
                result.pushed += len(predictions)
            if on_chunk:
                on_chunk(len(tasks[start:start + self.chunk]))
        result.seconds = round(time.perf_counter() - started, 3)
        result.phases = {k: round(v, 3) for k, v in result.phases.items()}
        return result
