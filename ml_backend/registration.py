"""Register the ML backend (and its webhook) with a Label Studio project, idempotently.

Label Studio creates a webhook to `<backend>/webhook` when a backend is added (if local URLs are
allowed), but without headers, so its deliveries would be refused by our secret check. We find that
webhook (or create it) and give it the X-Sense7-Secret header (plus basic auth when configured) and the
annotation actions, so annotation events reach `on_event`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from sense7.settings import Settings

BACKEND_TITLE = "sense7 rater model"
WEBHOOK_ACTIONS = ["ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_CREATED", "ANNOTATIONS_DELETED"]
SECRET_HEADER = "X-Sense7-Secret"


@dataclass
class Registration:
    ml_backend_id: int
    created: bool
    webhook_id: int
    state: str | None


def _basic_auth_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def connect_backend(client, project_id: int, settings: Settings, url: str | None = None,
                    title: str = BACKEND_TITLE, is_interactive: bool = False) -> Registration:
    """Add (or update) this backend on the project; returns its ids and Label Studio's view of its state."""
    url = (url or settings.backend_url).rstrip("/")
    auth = {}
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
    headers = {SECRET_HEADER: settings.webhook_secret}
    if settings.backend_user and settings.backend_password:
        headers["Authorization"] = _basic_auth_header(settings.backend_user, settings.backend_password)
    hook_url = f"{url}/webhook"
    hooks = [h for h in client.webhooks.list(project=str(project_id))
             if h.project == project_id and (h.url or "").rstrip("/") == hook_url]
    options = dict(headers=headers, actions=WEBHOOK_ACTIONS, send_for_all_actions=False, send_payload=True,
                   is_active=True)
    if hooks:
        hook_id = hooks[0].id
        client.webhooks.update(hook_id, url=hook_url, **options)
        for extra in hooks[1:]:  # earlier duplicates would deliver every event twice
            client.webhooks.delete(extra.id)
    else:
        hook_id = client.webhooks.create(url=hook_url, project=project_id, **options).id
    state = client.ml.get(backend.id).state
    return Registration(backend.id, created, hook_id, str(state) if state is not None else None)
