"""Assistants' data exports built by the tests, in each vendor's shape (ChatGPT mapping trees with branches,
Claude chat_messages with content blocks, ShareGPT), and the account files that come with them."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

BASE_TIME = 1_735_689_600  # 2025-01-01T00:00:00Z


def chatgpt_conversation(cid: str, exchanges: list[tuple[str, str]], *, title: str = "A chat",
                         created: float = BASE_TIME, model: str = "gpt-4o", branch: bool = True,
                         image_in_first: bool = False, tool_call: bool = False) -> dict:
    """A ChatGPT export conversation: a system root, then user/assistant pairs along `current_node`'s path.
    `branch`: the first answer was regenerated (the old one is a sibling branch) and the second question edited
    (the old one, with its answer, is a branch): neither is on the path the user saw."""
    mapping: dict[str, dict] = {}

    def node(node_id, parent, role, text=None, *, content=None, metadata=None, recipient="all"):
        message = None
        if role is not None:
            message = {"id": node_id, "author": {"role": role, "name": None, "metadata": {}},
                       "create_time": created, "content": content or {"content_type": "text", "parts": [text]},
                       "status": "finished_successfully", "metadata": metadata or {}, "recipient": recipient}
        mapping[node_id] = {"id": node_id, "message": message, "parent": parent, "children": []}
        if parent is not None:
            mapping[parent]["children"].append(node_id)
        return node_id

    last = node(f"{cid}-root", None, None)
    last = node(f"{cid}-sys", last, "system", "You are ChatGPT.",
                metadata={"is_visually_hidden_from_conversation": True})
    for i, (question, answer) in enumerate(exchanges):
        if branch and i == 1:
            old_q = node(f"{cid}-q{i}-old", last, "user", "BRANCH edited-away question")
            node(f"{cid}-a{i}-old", old_q, "assistant", "BRANCH answer to the edited-away question",
                 metadata={"model_slug": model})
        if image_in_first and i == 0:
            content = {"content_type": "multimodal_text",
                       "parts": [{"content_type": "image_asset_pointer", "asset_pointer": "file-service://x",
                                  "width": 10, "height": 10}, question]}
            last = node(f"{cid}-q{i}", last, "user", content=content,
                        metadata={"attachments": [{"id": "file-1", "name": "scan.pdf"}]})
        else:
            last = node(f"{cid}-q{i}", last, "user", question)
        if tool_call and i == 0:
            last = node(f"{cid}-code{i}", last, "assistant",
                        content={"content_type": "code", "language": "python", "text": "print(1)"},
                        metadata={"model_slug": model}, recipient="python")
            last = node(f"{cid}-tool{i}", last, "tool",
                        content={"content_type": "execution_output", "text": "1"})
        if branch and i == 0:
            node(f"{cid}-a{i}-regen", last, "assistant", "BRANCH regenerated-away answer",
                 metadata={"model_slug": "gpt-3.5"})
        last = node(f"{cid}-a{i}", last, "assistant", answer, metadata={"model_slug": model})
    return {"title": title, "create_time": created, "update_time": created + 60, "mapping": mapping,
            "current_node": last, "conversation_id": cid, "id": cid}


def claude_conversation(cid: str, exchanges: list[tuple[str, str]], *, name: str = "A chat",
                        created: str = "2025-01-01T10:00:00Z", blocks: bool = True) -> dict:
    messages = []
    for question, answer in exchanges:
        messages.append({"uuid": f"{cid}-h{len(messages)}", "sender": "human", "text": question,
                         "content": [{"type": "text", "text": question}] if blocks else [],
                         "attachments": [], "files": [], "created_at": created})
        content = [{"type": "text", "text": answer}] if blocks else []
        messages.append({"uuid": f"{cid}-a{len(messages)}", "sender": "assistant", "text": answer,
                         "content": content, "attachments": [], "files": [], "created_at": created})
    return {"uuid": cid, "name": name, "created_at": created, "updated_at": created,
            "account": {"uuid": "acct-1"}, "chat_messages": messages}


def sharegpt_conversation(cid: str, exchanges: list[tuple[str, str]]) -> dict:
    turns = []
    for question, answer in exchanges:
        turns += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return {"id": cid, "conversations": turns}


CHATGPT_USER = {"id": "user-abc123", "email": "jane.doe@mailbox.example", "chatgpt_plus_user": True,
                "phone_number": "+14155550132"}
CLAUDE_USERS = [{"uuid": "acct-1", "full_name": "Jane Doe", "email_address": "jane.doe@mailbox.example",
                 "verified_phone_number": "+14155550132"}]


def write_chatgpt_zip(path: Path, conversations: list[dict], user: dict | None = CHATGPT_USER) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("conversations.json", json.dumps(conversations))
        if user is not None:
            archive.writestr("user.json", json.dumps(user))
        archive.writestr("chat.html", "<html></html>")
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path
