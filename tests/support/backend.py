"""The ML backend tests' shared names: the backend's test credentials, a Label Studio task as the backend receives
it, and the Basic auth header."""

from __future__ import annotations

import base64

from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

USER, PASSWORD, SECRET = "ls-backend", "pw-not-in-logs-7f3a", "hook-secret-91c2"


def task(task_id, rater_id="r1", conversation_id="c1", turn_index=1, **overrides):
    data = {
        "task_key": f"{conversation_id}::{turn_index}::{rater_id}", "conversation_id": conversation_id,
        "turn_index": turn_index, "rater_id": rater_id, "position": "Response 1 of 2",
        "history": [{"role": "user", "content": "I failed my exam and feel awful."}],
        "turn": [{"role": "assistant", "content": "I'm sorry, that sounds really hard. What happened?"}],
    }
    data.update(overrides)
    data = {k: v for k, v in data.items() if v is not None}
    return {"id": task_id, "project": 1, "data": data, "annotations": [], "predictions": []}


def auth_headers(user=USER, password=PASSWORD) -> dict:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}
