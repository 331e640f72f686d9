"""Import a validated batch of conversations into the rating project: one task per (assistant turn,
rater), skipping tasks that already exist, so importing the same batch twice creates nothing new.

Re-import never diverges silently: a conversation whose text differs from the one imported before is an
error (nothing is written) unless `replace=True`, which re-creates the tasks from the first changed
message on, for turns nobody has rated yet, and refuses (again writing nothing) where ratings exist.

Pre-annotations travel with the tasks: given `predict` (the served model's, injected by the caller: this
package never imports the ML backend), each new task carries its prediction in the same bulk import request
that creates it. A task the model cannot predict is imported without one (the pre-annotate job fills it).

The study's design (`design`, sense7.store.study_design) is drawn here: every new task gets its pre-fill arm in
`data.prefill` and each rater some repeat tasks; every prediction is recorded in the store before the task
reaches Label Studio, and only shown-arm tasks carry theirs into Label Studio."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from label_studio_sdk import LabelStudio

from sense7.data.conversations import Conversation, profile_task_key
from sense7.labelstudio import client as ls_client
from sense7.labelstudio.protocol import profile_task, rating_tasks
from sense7.readers.intake import ReimportConflict, TextChange, text_changes
from sense7.store import study_design
from sense7.store.database import Store


@dataclass
class ImportResult:
    conversations: int
    tasks_in_batch: int
    created: int
    skipped_existing: int
    replaced: int = 0  # tasks re-created because their conversation's text changed (replace=True)
    predicted: int = 0  # new tasks imported together with a prediction (`predict` given)
    repeats: int = 0    # tasks of the batch that repeat a turn for test-retest (sense7.store.study_design)


# task dicts ({"data": ...}) -> one Label Studio prediction ({"result", "score", "model_version"}) or None each
Predict = Callable[[list[dict]], list]


def _affected_tasks(client: LabelStudio, project_id: int, changes: list[TextChange]) -> dict[str, list]:
    """conversation id -> its tasks from the first changed message on (any rater)."""
    first = {c.conversation_id: c.message_index for c in changes}
    affected: dict[str, list] = {cid: [] for cid in first}
    for task in client.tasks.list(project=project_id, include="id,data,total_annotations", page_size=1000):
        data = task.data or {}
        cid = str(data.get("conversation_id"))
        if cid in first and int(data.get("turn_index", -1)) >= first[cid]:
            affected[cid].append(task)
    return affected


def plan_tasks(conversations: list[Conversation]) -> list[dict]:
    return [task for conv in conversations for task in rating_tasks(conv)]


def import_conversations(client: LabelStudio, project_id: int, conversations: list[Conversation],
                         store: Store, on_progress: Callable[[int], None] | None = None,
                         on_total: Callable[[int], None] | None = None, replace: bool = False,
                         predict: Predict | None = None, design=None, *, taxonomy,
                         rater_id: str | None = None, rater_ids=None) -> ImportResult:
    """`conversations` must already be admitted (sense7.readers.intake). Raises ReimportConflict, having
    written nothing, when a conversation's text changed (see the module's docstring).

    `predict`: see the module's docstring; called once per import chunk, after the store holds the
    batch's contexts (the model reads them from there). `design` (settings.study): the study's pre-fill
    policy and repeats; None imports plain tasks (no arm: shown, no repeats). `taxonomy`: the study's, whose
    instructed-response items (if any) the design places on a share of the turns.

    Our store gets the texts and contexts first: if Label Studio then fails half-way, a retry skips
    what was imported and the store upsert is a no-op, so retries are idempotent.

    `rater_id`: every conversation is this rater's; the tasks that exist are then looked up among theirs
    only (a filtered query) instead of the whole project (a crowd participant's tasks, one at a time).
    `rater_ids`: the same for several raters at once (a burst of crowd participants, one bulk import)."""
    if rater_id is not None and any(c.rater_id != rater_id for c in conversations):
        raise ValueError(f"import_conversations(rater_id={rater_id!r}) given another rater's conversation")
    if rater_ids is not None and any(c.rater_id not in set(rater_ids) for c in conversations):
        raise ValueError("import_conversations(rater_ids=...) given a conversation of a rater not listed")
    changes = text_changes(conversations, store)
    replaced = 0
    if changes:
        if not replace:
            raise ReimportConflict(changes, replace=False)
        affected = _affected_tasks(client, project_id, changes)
        rated = [TextChange(c.conversation_id, c.line, c.message_index, rated=True) for c in changes
                 if any(t.total_annotations for t in affected[c.conversation_id])
                 or store.has_ratings_from(c.conversation_id, c.message_index)]
        if rated:
            raise ReimportConflict(rated, replace=True)
        for tasks_of_conversation in affected.values():
            for task in tasks_of_conversation:  # re-created below from the new text
                client.tasks.delete(task.id)
                replaced += 1
    tasks = plan_tasks(conversations)
    records = study_design.StudyRecords(store)
    if design is not None:
        seed = records.seed(design)
        tasks = study_design.plan(tasks, design, seed, taxonomy)
    existing = ls_client.task_keys(client, project_id, rater_id=rater_id, rater_ids=rater_ids)
    new = [t for t in tasks if t["data"]["task_key"] not in existing]
    if on_total:
        on_total(len(new))
    store.upsert_conversations(conversations)
    if design is not None:
        records.record_arms(new, design, seed)
    predicted = 0
    if predict is None or not new:
        ls_client.import_tasks(client, project_id, new, on_chunk=on_progress)
    else:
        predicted = _import_with_predictions(client, project_id, new, predict, on_progress, records)
    return ImportResult(len({(c.conversation_id, c.rater_id) for c in conversations}), len(tasks), len(new),
                        len(tasks) - len(new), replaced, predicted,
                        sum(bool(t["data"].get("repeat_of")) for t in tasks))


def with_predictions(tasks: list[dict], predict: Predict,
                     records: study_design.StudyRecords | None = None) -> tuple[list[dict], int]:
    """Copies of `tasks`, each with `"predictions": [its prediction]` where `predict` gave one and the
    task's arm shows it. With `records`, every task's prediction (either arm) is recorded first, when
    `predict` can make records (`predict.with_records`, as the ML backend's ImportPredictor)."""
    asked = [{"data": t["data"]} for t in tasks]
    if records is not None and hasattr(predict, "with_records"):
        answers, made = predict.with_records(asked)
        records.record_predictions([r for r in made if r])
    else:
        answers = predict(asked)
    if len(answers) != len(tasks):
        raise RuntimeError(f"predict returned {len(answers)} predictions for {len(tasks)} tasks")
    out, n = [], 0
    for task, prediction in zip(tasks, answers):
        if prediction and prediction.get("result") and not prediction.get("error") \
                and study_design.arm_of(task["data"]) == study_design.SHOWN:
            task = {**task, "predictions": [{k: prediction[k] for k in ("result", "score", "model_version")
                                             if k in prediction}]}
            n += 1
        out.append(task)
    return out, n


def _import_with_predictions(client: LabelStudio, project_id: int, tasks: list[dict], predict: Predict,
                             on_progress: Callable[[int], None] | None,
                             records: study_design.StudyRecords | None = None) -> int:
    """One bulk import request per chunk, each task with its prediction. Label Studio sets an empty project
    `model_version` to the last imported prediction's; ours stays empty (DESIGN.md: the editor then
    pre-fills from whatever prediction a task has), so it is put back."""
    project_version = client.projects.get(project_id).model_version
    predicted, sent = 0, False
    try:
        for start in range(0, len(tasks), ls_client.IMPORT_CHUNK):
            part, n = with_predictions(tasks[start:start + ls_client.IMPORT_CHUNK], predict, records)
            sent = sent or n > 0
            ls_client.import_tasks(client, project_id, part, on_chunk=on_progress)
            predicted += n
    finally:
        if sent and not project_version:
            client.projects.update(project_id, model_version="")
    return predicted


def import_profile_tasks(client: LabelStudio, project_id: int, rater_ids: list[str], filtered: bool = False) -> int:
    """One questionnaire task per rater (idempotent). With `filtered`, the existing ones are looked up among
    these raters' tasks only (O(raters): a few crowd participants); otherwise the whole project is read
    (a study's roster at once), except for a single rater."""
    existing = ls_client.task_keys(client, project_id, rater_ids=rater_ids if filtered or len(rater_ids) == 1 else None)
    new = [profile_task(r) for r in rater_ids if profile_task_key(r) not in existing]
    ls_client.import_tasks(client, project_id, new)
    return len(new)
