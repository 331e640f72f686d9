"""A withdrawn rater's side of Label Studio erased: their tasks (and with them the annotations and
predictions on them), any annotation their accounts wrote elsewhere, and the attribution account sense7 made
for them. A staff member's own login that carries the rater's email (a staff member who also rated) loses
the rater's annotations but is kept: it is their way into Label Studio, and not sense7's to delete.

Every step reads what is there before deleting it, so running it again after an interruption finishes the
job and deletes nothing twice (sense7.tasks.erasure runs it before the store's side).
"""

from __future__ import annotations

from label_studio_sdk import LabelStudio

from sense7.labelstudio.client import list_tasks
from sense7.labelstudio.protocol import user_id
from sense7.labelstudio.rater_accounts import made_by_sense7


def rater_users(client: LabelStudio, emails) -> list:
    """Label Studio users with any of these emails (the rater's own and their reserved address)."""
    wanted = {e.lower() for e in emails if e}
    return [u for u in client.users.list() if (u.email or "").lower() in wanted]


def erase_rater(client: LabelStudio, projects, rater_id: str, users: list) -> dict[str, int]:
    """Delete the rater's tasks in `projects`, annotations by their accounts (`users`: rater_users) on
    anybody's tasks, then the accounts sense7 made. Returns counts (tasks, annotations, accounts deleted, staff
    logins kept)."""
    from label_studio_sdk.core.api_error import ApiError

    accounts = {u.id for u in users}
    logins = {u.id for u in users if not made_by_sense7(u.username or "", u.email or "")}
    tasks = annotations = 0
    for project in projects:
        for task in list(list_tasks(client, 1000, project=project, fields="all")):
            own = [dict(a) for a in (task.annotations or [])]
            if (task.data or {}).get("rater_id") == rater_id:
                annotations += len(own)
                _gone_ok(lambda: client.tasks.delete(str(task.id)), ApiError)
                tasks += 1
                continue
            for annotation in own:
                if user_id(annotation.get("completed_by")) in accounts:
                    _gone_ok(lambda: client.annotations.delete(annotation["id"]), ApiError)
                    annotations += 1
    for account in sorted(accounts - logins):
        _gone_ok(lambda: client.users.delete(account), ApiError)
    return {"tasks": tasks, "annotations": annotations, "accounts": len(accounts - logins),
            "staff_logins_kept": len(logins)}


def _gone_ok(call, api_error) -> None:
    """Delete; a 404 means an earlier (interrupted) run or someone else already did."""
    try:
        call()
    except api_error as exc:
        if exc.status_code != 404:
            raise
