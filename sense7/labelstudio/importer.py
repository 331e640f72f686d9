"""Import a validated batch of conversations into the rating project: one task per (assistant turn,
rater), skipping tasks that already exist, so importing the same batch twice creates nothing new."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from label_studio_sdk import LabelStudio

from sense7.data.conversations import Conversation
from sense7.data.store import Store
from sense7.labelstudio import client as ls_client
from sense7.labelstudio.protocol import profile_task, rating_tasks


@dataclass
class ImportResult:
    conversations: int
    tasks_in_batch: int
    created: int
    skipped_existing: int


def plan_tasks(conversations: list[Conversation]) -> list[dict]:
    return [task for conv in conversations for task in rating_tasks(conv)]


def import_conversations(client: LabelStudio, project_id: int, conversations: list[Conversation],
                         store: Store, on_progress: Callable[[int], None] | None = None,
                         on_total: Callable[[int], None] | None = None) -> ImportResult:
    """`conversations` must already be validated (sense7.data.formats): nothing here can fail on user data.

    Our store gets the texts and contexts first: if Label Studio then fails half-way, a retry skips
    what was imported and the store upsert is a no-op, so retries are idempotent."""
    tasks = plan_tasks(conversations)
    existing = ls_client.task_keys(client, project_id)
    new = [t for t in tasks if t["data"]["task_key"] not in existing]
    if on_total:
        on_total(len(new))
    store.upsert_conversations(conversations)
    ls_client.import_tasks(client, project_id, new, on_chunk=on_progress)
    return ImportResult(len({(c.conversation_id, c.rater_id) for c in conversations}), len(tasks), len(new),
                        len(tasks) - len(new))


def import_profile_tasks(client: LabelStudio, project_id: int, rater_ids: list[str]) -> int:
    """One questionnaire task per rater (idempotent)."""
    existing = ls_client.task_keys(client, project_id)
    new = [profile_task(r) for r in rater_ids if f"profile::{r}" not in existing]
    ls_client.import_tasks(client, project_id, new)
    return len(new)
