"""Label Studio through its SDK: projects, task listing, bulk import. No business logic here."""

from __future__ import annotations

import json

from collections.abc import Callable, Iterator

from label_studio_sdk import LabelStudio

from sense7.settings import Settings
from sense7.taxonomy import Taxonomy, render_profile_config, render_rating_config

IMPORT_CHUNK = 5000  # tasks per bulk request: Label Studio redoes project bookkeeping per request


def connect(settings: Settings, timeout: float = 120.0) -> LabelStudio:
    return LabelStudio(base_url=settings.ls_url, api_key=settings.ls_token, timeout=timeout)


class UsersCallLog:
    """The real client, recording the name of each call of its `users` resource (`calls`; every call goes
    through): what the sync's benchmark and tests count, since listing every user grows with the study."""

    def __init__(self, client: LabelStudio):
        self.client, self.calls = client, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    @property
    def users(self):
        log = self

        class Users:
            def __getattr__(self, name):
                method = getattr(log.client.users, name)

                def recorded(*args, **kwargs):
                    log.calls.append(name)
                    return method(*args, **kwargs)
                return recorded
        return Users()


def find_project(client: LabelStudio, title: str) -> int | None:
    for project in client.projects.list(title=title):
        if project.title == title:
            return project.id
    return None


def _ensure(client: LabelStudio, title: str, label_config: str, description: str) -> int:
    project_id = find_project(client, title)
    if project_id is None:
        return client.projects.create(title=title, label_config=label_config, description=description).id
    current = client.projects.get(project_id).label_config or ""
    if current.strip() != label_config.strip():  # Label Studio drops the trailing newline
        # The taxonomy changed since the project was made: bring the interface up to date.
        client.projects.update(project_id, label_config=label_config)
    return project_id


def create_rating_project(client: LabelStudio, title: str, taxonomy: Taxonomy) -> int:
    return _ensure(client, title, render_rating_config(taxonomy),
                   "Rate each assistant response on the SENSE-7 empathy dimensions.")


def create_profile_project(client: LabelStudio, title: str, taxonomy: Taxonomy) -> int:
    return _ensure(client, title, render_profile_config(taxonomy),
                   "Rater-profile questionnaire: one task per rater.")


def ensure_projects(client: LabelStudio, settings: Settings, taxonomy: Taxonomy) -> tuple[int, int]:
    """Create (or find) the rating project and the profile project, rendered from the study's `taxonomy`
    (a project whose interface differs is brought up to date). Idempotent."""
    return (create_rating_project(client, settings.rating_project_title, taxonomy),
            create_profile_project(client, settings.profile_project_title, taxonomy))


def list_tasks(client: LabelStudio, page_size: int = 1000, **query) -> Iterator:
    """Tasks of a Data Manager list (`query`: project, fields, include, query), page by page, stopping
    at the first short page. (The SDK's pager always asks for one more page, which costs a full filtered
    query on Label Studio's side: twice the requests for a list that fits in one page.)"""
    from label_studio_sdk.core.api_error import ApiError

    pager = client.tasks.list(page_size=page_size, **query)
    while pager is not None:
        items = pager.items or []
        yield from items
        if len(items) < page_size or pager.get_next is None:
            return
        try:
            pager = pager.get_next()
        except ApiError as exc:
            if exc.status_code == 404:  # Label Studio's answer to a page past the last one
                return
            raise


def iter_tasks(client: LabelStudio, project_id: int, include: str = "id,data", page_size: int = 1000) -> Iterator:
    """Every task of a project. `include` trims the payload: listing only id and data is ~4x faster."""
    yield from list_tasks(client, page_size, project=project_id, fields="task_only", include=include)


def rater_query(rater_id: str) -> str:
    """A Data Manager query for one rater's tasks (data.rater_id equal to theirs)."""
    return json.dumps({"filters": {"conjunction": "and", "items": [
        {"filter": "filter:tasks:data.rater_id", "operator": "equal", "type": "String", "value": rater_id}]}})


RATERS_PER_QUERY = 20  # raters OR-ed in one Data Manager filter: the query travels in the URL (~150 B each)


def raters_query(rater_ids) -> str:
    """A Data Manager query for these raters' tasks (data.rater_id equal to any of theirs)."""
    return json.dumps({"filters": {"conjunction": "or", "items": [
        {"filter": "filter:tasks:data.rater_id", "operator": "equal", "type": "String", "value": rater_id}
        for rater_id in rater_ids]}})


def raters_tasks(client: LabelStudio, project_id: int, rater_ids, **fields) -> Iterator:
    """The tasks of these raters (a few OR-filtered queries, RATERS_PER_QUERY raters each: O(raters), not
    O(project)); tasks whose data.rater_id is not one of theirs are dropped (the filter is Label Studio's)."""
    wanted = sorted(set(rater_ids))
    for start in range(0, len(wanted), RATERS_PER_QUERY):
        part = wanted[start:start + RATERS_PER_QUERY]
        for task in list_tasks(client, 1000, project=project_id, query=raters_query(part), **fields):
            if (task.data or {}).get("rater_id") in part:
                yield task


def task_keys(client: LabelStudio, project_id: int, rater_id: str | None = None,
              rater_ids=None) -> dict[str, int]:
    """task_key -> task id for the tasks sense7 imported into a project; with `rater_id` (or `rater_ids`),
    only that rater's (those raters') tasks (filtered queries: O(raters) instead of O(project), for
    importing the conversations of a few raters)."""
    keys = {}
    if rater_id is not None:
        rater_ids = [rater_id]
    if rater_ids is None:
        tasks = iter_tasks(client, project_id)
    else:
        tasks = raters_tasks(client, project_id, rater_ids, fields="task_only", include="id,data")
    for task in tasks:
        key = (task.data or {}).get("task_key")
        if key:
            keys[key] = task.id
    return keys


def count_tasks(client: LabelStudio, project_id: int) -> int:
    return client.projects.get(project_id).task_number or 0


def import_tasks(client: LabelStudio, project_id: int, tasks: list[dict],
                 on_chunk: Callable[[int], None] | None = None, chunk: int = IMPORT_CHUNK) -> list[int]:
    """Bulk import in chunks; returns the new task ids. (Synchronous in the Community edition.)"""
    ids: list[int] = []
    for start in range(0, len(tasks), chunk):
        part = tasks[start:start + chunk]
        response = client.projects.import_tasks(project_id, request=part, return_task_ids=True)
        ids.extend(response.task_ids or [])
        if on_chunk:
            on_chunk(len(part))
    return ids
