"""The shape of sense7 data inside Label Studio: task data built from conversations, annotations parsed
back into ratings. Both directions live here so they cannot drift apart."""

from __future__ import annotations

from sense7.data.conversations import Conversation, task_key
from sense7.taxonomy import PROFILE_OBJECT_TAG, Taxonomy

START_PLACEHOLDER = {"role": "system", "content": "(This is the start of the conversation.)"}
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
    return {"data": {"task_key": f"profile::{rater_id}", "rater_id": rater_id, "intro": PROFILE_INTRO}}


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
