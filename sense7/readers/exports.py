"""Read what participants actually hold: the data exports of the assistants they use.

- ChatGPT (the export ZIP or its `conversations.json`): each conversation is a `mapping` tree of nodes; the
  conversation the user saw is the path from `current_node` up through `parent`s (edited messages and
  regenerated answers are branches off that path, not shown). System, tool and hidden messages and
  messages addressed to a tool are not turns; `metadata.model_slug` names the model that answered.
  The ZIP's `user.json` (or a `user.json` next to `conversations.json`) is the account: name, e-mail, phone.
- Claude (`conversations.json`, in the ZIP or not): `chat_messages` with `sender` (human/assistant) and
  `text` or `content` blocks; `users.json` is the account.
- ShareGPT (a JSON list or JSONL of `{"id", "conversations": [{"from", "value"}]}`).

Images, files and other non-text parts become a marker ("[image]", "[attachment]", "[tool use]") so a
rater sees that something was there. The conversation's title and its times are kept as context
(`title`, `created`, `updated`; `source`; `assistant_id` = the model that answered most of its turns,
`assistant_ids` = the model of each assistant turn by its index).

A malformed export is refused whole: every problem names the file, the conversation and the field
(FormatError, as every reader of sense7.readers.formats), and nothing is imported.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from sense7.data.conversations import Conversation, Message
from sense7.files import forbidden_character
from sense7.privacy.pii import Identifiers
from sense7.readers.formats import (MAX_CONTENT_CHARS, MAX_MESSAGES, FormatError, JSONTooDeep, Problem, id_problem,
                                    parse_json)

EXPORT_FORMATS = ("chatgpt", "claude", "sharegpt")
MAX_EXPORT_BYTES = 2_000_000_000  # a ZIP member or file larger than this is refused, not read into memory
TRUNCATED = "\n[... truncated]"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system"}


@dataclass
class Export:
    """The conversations read (selection applied, not yet scrubbed), the account's identifiers, and what
    was left out and why (counts only)."""

    conversations: list[Conversation]
    account: Identifiers = field(default_factory=Identifiers)
    skipped: Counter = field(default_factory=Counter)


class _Problems:
    def __init__(self, path: Path):
        self.path = str(path)
        self.items: list[Problem] = []

    def add(self, conversation: str | None, field_name: str, reason: str, line: int | None = None) -> None:
        where = f"conversation {conversation}: {field_name}" if conversation is not None else field_name
        self.items.append(Problem(self.path, line, where, reason))

    def raise_if_any(self) -> None:
        if self.items:
            raise FormatError(self.items)


def _timestamp(value) -> datetime | None:
    """Unix seconds (ChatGPT) or ISO 8601 (Claude) as an aware UTC datetime; None when absent or unreadable."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            return datetime.fromtimestamp(float(value), tz=timezone.utc)
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None


def parse_when(text: str, option: str) -> datetime:
    """A --since/--until date (YYYY-MM-DD or an ISO time) as UTC; ValueError naming the option."""
    parsed = _timestamp(text)
    if parsed is None or isinstance(text, (int, float)):
        raise ValueError(f"{option}: expected a date such as 2025-01-31, got {text!r}")
    return parsed


def _load_json(raw: bytes, name: str, problems: _Problems):
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return parse_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problems.add(None, name, f"invalid UTF-8 at byte {exc.start}")
    except JSONTooDeep as exc:
        problems.add(None, name, str(exc), line=exc.line)
    except json.JSONDecodeError as exc:
        if name.endswith(".jsonl") or exc.msg == "Extra data":
            lines = []
            for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    lines.append(parse_json(line))
                except json.JSONDecodeError as line_exc:
                    problems.add(None, f"{name} line {number}", f"malformed JSON ({line_exc.msg} at column {line_exc.colno})")
                    return None
                except JSONTooDeep as line_exc:
                    problems.add(None, name, str(line_exc).replace(" (at line 1,", " (at"), line=number)
                    return None
            return lines
        problems.add(None, name, f"malformed JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})")
    return None


def _export_files(path: Path, problems: _Problems) -> tuple[object, object]:
    """(the conversations JSON, the account JSON or None) of a ZIP, a conversations file or a folder."""
    def read_member(archive: zipfile.ZipFile, name: str):
        info = archive.getinfo(name)
        if info.file_size > MAX_EXPORT_BYTES:
            problems.add(None, name, f"larger than {MAX_EXPORT_BYTES:,} bytes")
            return None
        return _load_json(archive.read(name), name, problems)

    if path.is_dir():
        path = path / "conversations.json"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = {Path(n).name: n for n in archive.namelist() if not n.endswith("/")}
                if "conversations.json" not in names:
                    problems.add(None, "conversations.json", "not in the ZIP (is this an assistant's data export?)")
                    return None, None
                data = read_member(archive, names["conversations.json"])
                account_name = names.get("user.json") or names.get("users.json")
                account = read_member(archive, account_name) if account_name else None
                return data, account
        except (zipfile.BadZipFile, OSError) as exc:
            problems.add(None, "file", f"cannot read the ZIP: {exc}")
            return None, None
    try:
        if path.stat().st_size > MAX_EXPORT_BYTES:
            problems.add(None, "file", f"larger than {MAX_EXPORT_BYTES:,} bytes")
            return None, None
        data = _load_json(path.read_bytes(), path.name, problems)
    except OSError as exc:
        problems.add(None, "file", f"cannot read: {exc.strerror}")
        return None, None
    account = None
    for sibling in ("user.json", "users.json"):
        if (path.parent / sibling).is_file() and path.name != sibling:
            account = _load_json((path.parent / sibling).read_bytes(), sibling, problems)
            break
    return data, account


def _account_identifiers(account) -> Identifiers:
    """Name, e-mail and phone from ChatGPT's user.json ({email, phone_number, name}) or Claude's users.json
    ([{full_name, email_address, verified_phone_number}])."""
    records = account if isinstance(account, list) else [account] if isinstance(account, dict) else []
    names, emails, phones = [], [], []
    for record in records:
        if not isinstance(record, dict):
            continue
        for key in ("full_name", "name", "display_name"):
            if isinstance(record.get(key), str) and record[key].strip():
                names.append(record[key].strip())
        for key in ("email", "email_address"):
            if isinstance(record.get(key), str) and "@" in record[key]:
                emails.append(record[key].strip())
        for key in ("phone_number", "verified_phone_number", "phone"):
            if isinstance(record.get(key), str) and record[key].strip():
                phones.append(record[key].strip())
    if not names:
        # ChatGPT's user.json has no name; its e-mail's local part often is one (jane.doe@): "jane doe".
        for email in emails:
            parts = [p for p in re.split(r"[._-]", email.split("@")[0]) if p.isalpha()]
            if len(parts) >= 2 and all(len(p) >= 3 for p in parts):
                names.append(" ".join(parts))
    return Identifiers(names=tuple(names), emails=tuple(emails), phones=tuple(phones))


def detect_export(data) -> str | None:
    """chatgpt / claude / sharegpt from the first conversation's keys; None when none fits."""
    first = data[0] if isinstance(data, list) and data else None
    if not isinstance(first, dict):
        return None
    if "mapping" in first:
        return "chatgpt"
    if "chat_messages" in first:
        return "claude"
    if "conversations" in first or "items" in first:
        return "sharegpt"
    return None


# -- ChatGPT ----------------------------------------------------------------------------------------------
def _chatgpt_text(message: dict, cid: str, node_id: str, problems: _Problems) -> str | None:
    content = message.get("content")
    if not isinstance(content, dict):
        problems.add(cid, f"mapping.{node_id}.message.content", "missing or not an object")
        return None
    kind = content.get("content_type")
    pieces = []
    if kind in ("text", "multimodal_text"):
        parts = content.get("parts")
        if not isinstance(parts, list):
            problems.add(cid, f"mapping.{node_id}.message.content.parts", "missing or not a list")
            return None
        for part in parts:
            if isinstance(part, str):
                if part.strip():
                    pieces.append(part)
            elif isinstance(part, dict):
                part_type = str(part.get("content_type", ""))
                pieces.append("[image]" if "image" in part_type else "[audio]" if "audio" in part_type
                              else "[attachment]")
            elif part is not None:
                problems.add(cid, f"mapping.{node_id}.message.content.parts", f"unexpected {type(part).__name__}")
                return None
    elif kind == "code":
        text = content.get("text")
        if isinstance(text, str) and text.strip():
            pieces.append(f"```{content.get('language') or ''}\n{text}\n```")
    else:
        # Browsing results, reasoning summaries, ...: shown to the user at most as a widget, not a turn's text.
        return ""
    return _joined(pieces, (message.get("metadata") or {}).get("attachments"))


def _joined(pieces: list[str], *attachment_lists) -> str:
    """A message's text: its pieces, then "[attachment]" for each item of each attachment list there is."""
    for attachments in attachment_lists:
        if isinstance(attachments, list):
            pieces.extend("[attachment]" for _ in attachments)
    return "\n\n".join(pieces)


def _chatgpt_conversation(obj: dict, cid: str, problems: _Problems) -> tuple[list, list]:
    """(messages, assistant model per message) along the path the user saw."""
    mapping = obj.get("mapping")
    if not isinstance(mapping, dict):
        problems.add(cid, "mapping", "missing or not an object")
        return [], []
    node_id = obj.get("current_node")
    if node_id is None:
        # Old exports: the leaf reached by always taking the last child from the root.
        roots = [k for k, n in mapping.items() if isinstance(n, dict) and n.get("parent") is None]
        node_id = roots[0] if roots else None
        while node_id is not None and isinstance(mapping.get(node_id), dict) and mapping[node_id].get("children"):
            node_id = mapping[node_id]["children"][-1]
    if node_id not in mapping:
        problems.add(cid, "current_node", f"{node_id!r} is not a node of the mapping")
        return [], []
    path, seen = [], set()
    while node_id is not None:
        if node_id in seen:
            problems.add(cid, f"mapping.{node_id}.parent", "the parents form a cycle")
            return [], []
        seen.add(node_id)
        node = mapping.get(node_id)
        if not isinstance(node, dict):
            problems.add(cid, f"mapping.{node_id}", "a parent named here is missing from the mapping")
            return [], []
        path.append((node_id, node))
        node_id = node.get("parent")
    messages, models = [], []
    for node_id, node in reversed(path):
        message = node.get("message")
        if message is None:
            continue
        if not isinstance(message, dict):
            problems.add(cid, f"mapping.{node_id}.message", "not an object")
            continue
        role = (message.get("author") or {}).get("role") if isinstance(message.get("author"), dict) else None
        if role is None:
            problems.add(cid, f"mapping.{node_id}.message.author.role", "missing")
            continue
        metadata = message.get("metadata") or {}
        hidden = metadata.get("is_visually_hidden_from_conversation") or metadata.get("is_user_system_message")
        if role not in ("user", "assistant") or hidden or message.get("recipient", "all") != "all":
            continue
        text = _chatgpt_text(message, cid, node_id, problems)
        if not text:
            continue
        messages.append(Message(role, text))
        models.append(metadata.get("model_slug") if role == "assistant" else None)
    return messages, models


# -- Claude -------------------------------------------------------------------------------------------------
def _claude_text(message: dict, cid: str, index: int, problems: _Problems) -> str | None:
    pieces = []
    blocks = message.get("content")
    if isinstance(blocks, list) and blocks:
        for number, block in enumerate(blocks):
            if not isinstance(block, dict):
                problems.add(cid, f"chat_messages[{index}].content[{number}]", "not an object")
                return None
            kind = block.get("type")
            if kind == "text":
                if isinstance(block.get("text"), str) and block["text"].strip():
                    pieces.append(block["text"])
            elif kind == "image":
                pieces.append("[image]")
            elif kind in ("tool_use", "tool_result"):
                pieces.append(f"[{kind.replace('_', ' ')}]")
            elif kind in ("thinking", "redacted_thinking"):
                continue  # the model's reasoning: not what the user was shown as the answer
            else:
                pieces.append("[attachment]")
    elif isinstance(message.get("text"), str):
        if message["text"].strip():
            pieces.append(message["text"])
    elif "text" in message or "content" in message:
        problems.add(cid, f"chat_messages[{index}].text", "not text")
        return None
    return _joined(pieces, message.get("attachments"), message.get("files"))


def _objects_in(obj: dict, key: str, cid: str, problems: _Problems):
    """(index, item) for each item of the list obj[key] that is an object; a missing list, or an item that is no
    object, is noted as a problem where it is met."""
    raw = obj.get(key)
    if not isinstance(raw, list):
        problems.add(cid, key, "missing or not a list")
        return
    for index, item in enumerate(raw):
        if isinstance(item, dict):
            yield index, item
        else:
            problems.add(cid, f"{key}[{index}]", "not an object")


def _claude_conversation(obj: dict, cid: str, problems: _Problems) -> tuple[list, list]:
    messages = []
    for index, message in _objects_in(obj, "chat_messages", cid, problems):
        sender = message.get("sender")
        role = {"human": "user", "assistant": "assistant"}.get(sender)
        if role is None:
            problems.add(cid, f"chat_messages[{index}].sender", f"unknown sender {sender!r} (expected human or assistant)")
            continue
        text = _claude_text(message, cid, index, problems)
        if text:
            messages.append(Message(role, text))
    return messages, [obj.get("model") if m.role == "assistant" else None for m in messages]


# -- ShareGPT -----------------------------------------------------------------------------------------------
def _sharegpt_conversation(obj: dict, cid: str, problems: _Problems) -> tuple[list, list]:
    key = "conversations" if "conversations" in obj else "items"
    messages = []
    for index, message in _objects_in(obj, key, cid, problems):
        role = SHAREGPT_ROLES.get(str(message.get("from", "")).lower())
        if role is None:
            problems.add(cid, f"{key}[{index}].from", f"unknown speaker {message.get('from')!r} "
                                                       f"(expected one of {', '.join(SHAREGPT_ROLES)})")
            continue
        value = message.get("value")
        if not isinstance(value, str):
            problems.add(cid, f"{key}[{index}].value", "missing or not text")
            continue
        if role != "system" and value.strip():
            messages.append(Message(role, value))
    return messages, [obj.get("model") if m.role == "assistant" else None for m in messages]


def _merged(messages: list[Message], models: list) -> tuple[list[Message], list]:
    """Consecutive messages of one speaker as one (an answer split around a tool call is one turn)."""
    out, out_models = [], []
    for message, model in zip(messages, models):
        if out and out[-1].role == message.role:
            out[-1] = Message(message.role, out[-1].content + "\n\n" + message.content)
            out_models[-1] = out_models[-1] or model
        else:
            out.append(message)
            out_models.append(model)
    return out, out_models


def _conversation_id(obj: dict, fmt: str, index: int, problems: _Problems) -> str | None:
    raw = obj.get({"chatgpt": "conversation_id", "claude": "uuid", "sharegpt": "id"}[fmt])
    if raw is None:
        raw = obj.get("id")
    if raw is None:
        if fmt != "sharegpt":
            problems.add(f"#{index + 1}", "id", "missing")
            return None
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        return f"sg-{digest[:16]}"
    text = str(raw).strip()
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or not text:
        problems.add(f"#{index + 1}", "id", "not a string")
        return None
    if (why := id_problem(text)) is not None:
        problems.add(f"#{index + 1}", "id", why)
        return None
    return text


def _refused_characters(cid: str, messages: list[Message], context: dict, problems: _Problems) -> bool:
    """Report every text of a conversation that no store keeps (a NUL character, a lone surrogate)."""
    found = [(f"messages[{i}].content", why) for i, m in enumerate(messages)
             if (why := forbidden_character(m.content)) is not None]
    texts = {key: value for key, value in context.items() if isinstance(value, str)}
    texts.update({f"assistant_ids.{i}": value for i, value in context.get("assistant_ids", {}).items()})
    found += [(f"context.{key}", why) for key, value in texts.items() if (why := forbidden_character(value)) is not None]
    for field_name, why in found:
        problems.add(cid, field_name, why)
    return bool(found)


def read_export(path: str | Path, rater: str, fmt: str | None = None, select: set[str] | None = None,
                since: datetime | None = None, until: datetime | None = None) -> Export:
    """Read a donated export for one rater. `select`: conversation ids to keep (others are left out);
    `since`/`until`: keep conversations created in [since, until). Raises FormatError listing every problem
    (file: conversation X: field: reason); returns nothing partial."""
    path = Path(path)
    problems = _Problems(path)
    if not rater or not str(rater).strip():
        problems.add(None, "--rater", "an export names no rater id: pass --rater RATER_ID")
        problems.raise_if_any()
    if (why := id_problem(str(rater).strip())) is not None:
        problems.add(None, "--rater", why)
        problems.raise_if_any()
    data, account = _export_files(path, problems)
    problems.raise_if_any()
    if isinstance(data, dict) and isinstance(data.get("conversations"), list) and "mapping" not in data:
        data = data["conversations"]
    elif isinstance(data, dict):
        data = [data]
    fmt = fmt or detect_export(data)
    if fmt not in EXPORT_FORMATS:
        problems.add(None, "format", "not a ChatGPT, Claude or ShareGPT export (pass --format to say which)"
                     if fmt is None else f"unknown export format {fmt!r}; expected one of {', '.join(EXPORT_FORMATS)}")
        problems.raise_if_any()
    if not isinstance(data, list):
        problems.add(None, "conversations", "expected a list of conversations")
        problems.raise_if_any()
    skipped: Counter = Counter()
    out, seen, found_ids = [], {}, set()
    for index, obj in enumerate(data):
        if not isinstance(obj, dict):
            problems.add(f"#{index + 1}", "conversation", f"expected an object, got {type(obj).__name__}")
            continue
        cid = _conversation_id(obj, fmt, index, problems)
        if cid is None:
            continue
        found_ids.add(cid)
        created = _timestamp(obj.get("create_time", obj.get("created_at")))
        updated = _timestamp(obj.get("update_time", obj.get("updated_at")))
        if select is not None and cid not in select:
            skipped["not selected"] += 1
            continue
        if (since or until) and created is None:
            skipped["no creation time (with --since/--until)"] += 1
            continue
        if (since and created < since) or (until and created >= until):
            skipped["outside --since/--until"] += 1
            continue
        reader = {"chatgpt": lambda: _chatgpt_conversation(obj, cid, problems),
                  "claude": lambda: _claude_conversation(obj, cid, problems),
                  "sharegpt": lambda: _sharegpt_conversation(obj, cid, problems)}[fmt]
        before = len(problems.items)
        messages, models = _merged(*reader())
        if len(problems.items) > before:
            continue
        if not any(m.role == "assistant" for m in messages):
            skipped["no assistant reply (empty)"] += 1
            continue
        if len(messages) > MAX_MESSAGES:
            problems.add(cid, "messages", f"more than {MAX_MESSAGES} messages")
            continue
        if cid in seen:
            problems.add(cid, "id", f"duplicate (first as conversation #{seen[cid] + 1})")
            continue
        seen[cid] = index
        messages = [Message(m.role, m.content if len(m.content) <= MAX_CONTENT_CHARS
                            else m.content[:MAX_CONTENT_CHARS - len(TRUNCATED)] + TRUNCATED) for m in messages]
        context = {"source": fmt}
        title = obj.get("title", obj.get("name"))
        if isinstance(title, str) and title.strip():
            context["title"] = title.strip()
        if created:
            context["created"] = created.isoformat(timespec="seconds")
        if updated:
            context["updated"] = updated.isoformat(timespec="seconds")
        turn_models = {str(i): model for i, model in enumerate(models) if model}
        if turn_models:
            context["assistant_ids"] = turn_models
            context["assistant_id"] = Counter(turn_models.values()).most_common(1)[0][0]
        if _refused_characters(cid, messages, context, problems):
            continue
        out.append(Conversation(cid, str(rater).strip(), messages, context, line=None))
    if select is not None and (missing := sorted(select - found_ids)):
        problems.add(None, "--select", f"not in the export: {', '.join(missing[:5])}"
                                       f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}")
    problems.raise_if_any()
    if not out:
        problems.add(None, "conversations", "nothing to import (no conversation with an assistant reply was selected)")
        problems.raise_if_any()
    return Export(out, _account_identifiers(account), skipped)


def looks_like_export(path: str | Path) -> bool:
    """A ZIP, a folder or a .json file (sense7's own files are .jsonl and .csv)."""
    path = Path(path)
    if path.suffix.lower() in (".json", ".zip") or path.is_dir():
        return True
    return path.is_file() and zipfile.is_zipfile(path)
