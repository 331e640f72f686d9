"""sense7's side of Label Studio's protocol, in one place so that no two parts can drift apart:

- task data: built from conversations (`rating_tasks`, `profile_task`) and validated (`task_problem`);
  DESIGN.md describes the shape, and `sense7.data.items.task_columns` reads it back into model items;
- annotations parsed into ratings and questionnaire answers (`parse_annotation`, ...);
- webhooks: the actions we listen to, their payloads parsed (`parse_annotation_event`), the headers they
  carry and their idempotent registration, and the ML backend's registration on a project
  (`connect_backend`).

Functions that talk to Label Studio take its SDK client as an argument: this module imports no client.
"""

from __future__ import annotations

import base64
import itertools
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sense7.data.conversations import Conversation, profile_task_key, task_key
from sense7.data.items import START_PLACEHOLDER
from sense7.taxonomy import PROFILE_OBJECT_TAG, TURN_TAG, Taxonomy

# START_TRAINING is not a webhook action: Label Studio's ML API sends it to the backend's /webhook itself.
WEBHOOK_ACTIONS = ["ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_CREATED", "ANNOTATIONS_DELETED"]
SINGLE_ANNOTATION_ACTIONS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED")  # payload: {"annotation": {...}}
DELETION_ACTION = "ANNOTATIONS_DELETED"
SECRET_HEADER = "X-Sense7-Secret"
BACKEND_TITLE = "sense7 rater model"
REQUIRED_TASK_FIELDS = ("conversation_id", "turn_index", "rater_id", "turn")
_EMPTY_VALUES = (None, "", [])  # a required field with one of these is missing (built once: it holds a list)


class MalformedEvent(ValueError):
    """A webhook payload without what its action promises (answered 400, never retried)."""


PROFILE_INTRO = ("Please answer a few questions about yourself. Your answers are used only to model how "
                 "you perceive empathy and are never shown to other annotators.")


def rating_tasks(conversation: Conversation) -> list[dict]:
    """One Label Studio task per assistant turn of the conversation, for its rater.

    Only the text, ids and position go into task data: other annotators can open any task in the
    Community edition, so traits and the rater's context stay in our store."""
    turns = conversation.assistant_turns()
    tasks = []
    for number, index in enumerate(turns, start=1):
        history = [{"role": m.role, "content": m.content} for m in conversation.history(index)]
        message = conversation.messages[index]
        tasks.append({"data": {
            "task_key": task_key(conversation.conversation_id, index, conversation.rater_id),
            "conversation_id": conversation.conversation_id,
            "turn_index": index,
            "rater_id": conversation.rater_id,
            "position": f"Response {number} of {len(turns)}",
            "history": history or [START_PLACEHOLDER],
            "turn": [{"role": message.role, "content": message.content}],
        }})
    return tasks


def profile_task(rater_id: str) -> dict:
    return {"data": {"task_key": profile_task_key(rater_id), "rater_id": rater_id, "intro": PROFILE_INTRO}}


def user_id(value) -> int | None:
    """A Label Studio user reference (an id, or an inlined user object, as `completed_by` may be) as its
    id; None when it is neither."""
    if isinstance(value, dict):
        value = value.get("id")
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        return None
    return int(value)


def _single_choice(item: dict) -> str | None:
    choices = (item.get("value") or {}).get("choices") or []
    return str(choices[0]) if choices else None


def parse_annotation(result: list[dict], taxonomy: Taxonomy) -> tuple[dict[str, int], str | None, str | None]:
    """A rating annotation's result -> ({control: level}, expectation answer, comment).

    Items that are not ours (or out of range) are ignored rather than trusted."""
    controls = set(taxonomy.controls)
    values, expectation, comment = {}, None, None
    for item in result or []:
        name, value = item.get("from_name"), item.get("value") or {}
        if name in controls and item.get("type") == "rating":
            level = value.get("rating")
            if isinstance(level, (int, float)) and 1 <= int(level) <= taxonomy.levels:
                values[name] = int(level)
        elif name == taxonomy.expectation_key:
            choice = _single_choice(item)
            expectation = choice if choice in taxonomy.expectation_values else None
        elif name == taxonomy.comment_key:
            texts = value.get("text") or []
            comment = "\n".join(str(t) for t in texts) if texts else None
    return values, expectation, comment


def rating_result(values: dict[str, int], taxonomy: Taxonomy, expectation: str | None = None,
                  comment: str | None = None) -> list[dict]:
    """A rating annotation's result as the rating interface produces it: the inverse of parse_annotation."""
    result = [{"from_name": control, "to_name": TURN_TAG, "type": "rating", "value": {"rating": int(level)}}
              for control, level in values.items() if control in taxonomy.controls]
    if expectation:
        result.append({"from_name": taxonomy.expectation_key, "to_name": TURN_TAG, "type": "choices",
                       "value": {"choices": [expectation]}})
    if comment:
        result.append({"from_name": taxonomy.comment_key, "to_name": TURN_TAG, "type": "textarea",
                       "value": {"text": [comment]}})
    return result


def profile_result(answers: dict, taxonomy: Taxonomy) -> list[dict]:
    """A questionnaire annotation's result as the profile interface produces it: the inverse of
    parse_profile_annotation (answers for fields the taxonomy does not have are left out)."""
    keys = {f.key for f in taxonomy.profile_fields}
    return [{"from_name": key, "to_name": PROFILE_OBJECT_TAG, "type": "choices", "value": {"choices": [str(value)]}}
            for key, value in answers.items() if key in keys]


def parse_profile_annotation(result: list[dict], taxonomy: Taxonomy) -> dict:
    """A profile questionnaire annotation -> validated trait answers (invalid answers are dropped)."""
    fields = {f.key: f for f in taxonomy.profile_fields}
    answers = {}
    for item in result or []:
        field = fields.get(item.get("from_name"))
        if field is None or item.get("to_name") != PROFILE_OBJECT_TAG:
            continue
        choice = _single_choice(item)
        if choice is None:
            continue
        try:
            answers[field.key] = field.validate(choice)
        except ValueError:
            continue
    return answers


# ---------------------------------------------------------------------------------------------------
# Task data read back: validated (sense7.data.items turns it into model items)

def task_problem(task: Any) -> str | None:
    """Why a task cannot be predicted, or None. Messages name the field, never its value."""
    if not isinstance(task, dict):
        return "task is not a JSON object"
    data = task.get("data")
    if not isinstance(data, dict):
        return "task has no 'data' object"
    for key in REQUIRED_TASK_FIELDS:
        if data.get(key) in _EMPTY_VALUES:
            return f"task data has no '{key}' (tasks must be imported by `sense7 import`)"
    if not isinstance(data["rater_id"], (str, int)) or not isinstance(data["conversation_id"], (str, int)):
        return "task data 'rater_id' and 'conversation_id' must be strings"
    if isinstance(data["turn_index"], bool) or not isinstance(data["turn_index"], int):
        return "task data 'turn_index' must be an integer"
    turn = data["turn"]
    if not isinstance(turn, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                             and isinstance(m.get("role"), str) for m in turn):
        return "task data 'turn' must be a list of {role, content} messages"
    history = data.get("history", [])
    if not isinstance(history, list) or not _all_messages(history):
        return "task data 'history' must be a list of {role, content} messages"
    return None


def _all_messages(history: list) -> bool:
    """Whether every element is a dict with a "content" key: the check of every history message of every
    task of a /predict, so one C-level pass (dict.__contains__ refuses anything but a dict: TypeError)."""
    try:
        return all(map(dict.__contains__, history, itertools.repeat("content")))
    except TypeError:
        return False


def iso_time(value) -> str:
    """One text form for Label Studio times (the store compares them as text): UTC, microseconds, Z."""
    if value is None:
        return ""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------------------------------------------
# Webhooks and the ML backend's registration

@dataclass(frozen=True)
class AnnotationEvent:
    """What an annotation webhook names (it carries no authority: the sync re-reads Label Studio)."""
    action: str
    project: int | None
    annotations: list[tuple[int, int | None]]  # (annotation id, task id or None)

    @property
    def deletes(self) -> bool:
        return self.action == DELETION_ACTION


def _event_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise MalformedEvent(f"every annotation needs an integer '{what}'")
    return int(value)


def _event_project(payload: dict) -> int | None:
    project = payload.get("project")
    project = project.get("id") if isinstance(project, dict) else project
    try:
        return int(project)
    except (TypeError, ValueError):
        return None


def parse_annotation_event(action: str, payload) -> AnnotationEvent:
    """The annotations (with their tasks when given) and the project an event of one of WEBHOOK_ACTIONS
    names; MalformedEvent when it names none the way its action should."""
    if action not in WEBHOOK_ACTIONS:
        raise ValueError(f"{action} is not an annotation webhook")
    payload = payload if isinstance(payload, dict) else {}
    if action in SINGLE_ANNOTATION_ACTIONS:
        items = [payload.get("annotation")]
    else:
        items = payload.get("annotations")
        if not isinstance(items, list) or not items:
            raise MalformedEvent(f"{action}: 'annotations' must be a non-empty list of {{id}} objects")
    named = []
    for item in items:
        if not isinstance(item, dict):
            raise MalformedEvent(f"{action}: every annotation needs an integer 'id'")
        task = item.get("task")
        task = task.get("id") if isinstance(task, dict) else task
        named.append((_event_int(item.get("id"), "id"), None if task is None else _event_int(task, "task")))
    return AnnotationEvent(action, _event_project(payload), named)


def webhook_headers(settings) -> dict:
    """What every webhook of ours sends to the ML backend's /webhook: the shared secret, and basic auth
    when the backend requires it."""
    headers = {SECRET_HEADER: settings.webhook_secret}
    if settings.backend_user and settings.backend_password:
        token = base64.b64encode(f"{settings.backend_user}:{settings.backend_password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return headers


def ensure_webhook(client, project: int, url: str, headers: dict) -> int:
    """The project's webhook to `url` with our actions and headers, created or mended; returns its id.
    Running it again changes nothing; duplicates (which would deliver every event twice) are removed."""
    url = url.rstrip("/")
    hooks = [h for h in client.webhooks.list(project=str(project))
             if h.project == project and (h.url or "").rstrip("/") == url]
    options = dict(actions=WEBHOOK_ACTIONS, send_for_all_actions=False, send_payload=True, headers=headers,
                   is_active=True)
    if not hooks:
        return client.webhooks.create(url=url, project=project, **options).id
    hook = hooks[0]
    if not (set(hook.actions or []) >= set(WEBHOOK_ACTIONS) and hook.send_payload and hook.is_active
            and not hook.send_for_all_actions and (hook.headers or {}) == headers):
        client.webhooks.update(hook.id, url=url, **options)
    for extra in hooks[1:]:
        client.webhooks.delete(extra.id)
    return hook.id


@dataclass
class Registration:
    ml_backend_id: int
    created: bool
    webhook_id: int
    state: str | None


def connect_backend(client, project_id: int, settings, url: str | None = None,
                    title: str = BACKEND_TITLE, is_interactive: bool = False) -> Registration:
    """Add (or update) the ML backend on the project, idempotently; returns its ids and Label Studio's
    view of its state.

    Label Studio creates a webhook to `<backend>/webhook` when a backend is added (if local URLs are
    allowed), but without headers, so its deliveries would be refused by our secret check: we mend that
    webhook (or create it) with our headers and actions, so annotation events reach the jobs."""
    url = (url or settings.backend_url).rstrip("/")
    if settings.backend_user and settings.backend_password:
        auth = {"auth_method": "BASIC_AUTH", "basic_auth_user": settings.backend_user,
                "basic_auth_pass": settings.backend_password}
    else:
        auth = {"auth_method": "NONE"}
    existing = [m for m in client.ml.list(project=project_id) if (m.url or "").rstrip("/") == url]
    if existing:
        # project must be repeated: Label Studio 1.23 validates a PATCH by calling setup_(url, project)
        backend = client.ml.update(existing[0].id, project=project_id, url=url, title=title,
                                   is_interactive=is_interactive, **auth)
        created = False
    else:
        backend = client.ml.create(project=project_id, url=url, title=title, is_interactive=is_interactive,
                                   auto_update=True, **auth)
        created = True
    hook_id = ensure_webhook(client, project_id, f"{url}/webhook", webhook_headers(settings))
    state = client.ml.get(backend.id).state
    return Registration(backend.id, created, hook_id, str(state) if state is not None else None)
