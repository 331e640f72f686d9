"""The one way conversations come in (`sense7 import` and a crowd study's pool, `sense7 crowd init`): read and
validated by the readers of user files (sense7.readers.formats, or an assistant's data export:
sense7.readers.exports), scrubbed of personal details (sense7.privacy.pii), then compared with the texts the store
already holds, so that a conversation id never gets a second, different text (Label Studio would keep the
first one). Nothing here writes: a caller stores the batch only once it was admitted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sense7.data.conversations import Conversation
from sense7.privacy.pii import Identifiers, RedactionReport, scrub_conversations
from sense7.readers.exports import EXPORT_FORMATS, looks_like_export, parse_when, read_export
from sense7.readers.formats import FormatError, Problem, read_conversations
from sense7.store.database import Store


@dataclass
class Batch:
    """Conversations as read (validated, not yet scrubbed), the export's account identifiers, and what was
    left out and why (counts only)."""

    conversations: list[Conversation]
    account: Identifiers = field(default_factory=Identifiers)
    skipped: Counter = field(default_factory=Counter)


def read_batch(path: str | Path, taxonomy, fmt: str | None = None, rater: str | None = None,
               select=None, since: str | None = None, until: str | None = None) -> Batch:
    """A file of sense7.readers.formats (native JSONL, CSV, OpenAI-style JSONL) or an assistant's data export
    (`select`, `since` and `until` apply to exports only). Raises FormatError (file:line: field: reason)
    or ValueError for options that do not fit the file; returns nothing partial."""
    path = Path(path)
    if fmt in EXPORT_FORMATS or (fmt is None and looks_like_export(path)):
        wanted = {i.strip() for value in select or [] for i in value.split(",") if i.strip()} or None
        export = read_export(path, rater, fmt=fmt, select=wanted,
                             since=parse_when(since, "--since") if since else None,
                             until=parse_when(until, "--until") if until else None)
        return Batch(export.conversations, export.account, export.skipped)
    if select or since or until:
        raise ValueError("--select, --since and --until apply to assistants' data exports "
                         f"({', '.join(EXPORT_FORMATS)}), not to {fmt or 'this'} file")
    return Batch(read_conversations(path, taxonomy, fmt=fmt, rater=rater))


@dataclass(frozen=True)
class TextChange:
    conversation_id: str
    line: int | None       # the conversation's line in the file being imported
    message_index: int     # the first message whose text (or role) differs; later turns are affected
    rated: bool = False    # a turn from that message on has ratings


class ReimportConflict(ValueError):
    """Conversations whose text differs from the one the store holds (see TextChange)."""

    def __init__(self, changes: list[TextChange], replace: bool):
        self.changes, self.replace = changes, replace
        what = "has ratings on the changed turns" if replace else "differs from the imported text"
        super().__init__(f"{len(changes)} conversation(s) {what}")

    def problems(self, path, remedy: str) -> FormatError:
        """The conflict as a FormatError: one line per conversation, file:line: conversation X, message N."""
        return FormatError([Problem(str(path), c.line, f"conversation {c.conversation_id}, message {c.message_index}",
                                    f"the text differs from the one stored before ({remedy})") for c in self.changes])


def text_changes(conversations: list[Conversation], store: Store) -> list[TextChange]:
    """Conversations of the batch whose messages differ from those the store holds from an earlier import."""
    stored = store.conversations_by_id()
    changes, seen = [], set()
    for conv in conversations:
        before = stored.get(conv.conversation_id)
        if before is None or conv.conversation_id in seen:
            continue
        seen.add(conv.conversation_id)
        now = [(m.role, m.content) for m in conv.messages]
        old = [(m.role, m.content) for m in before]
        if now == old:
            continue
        first = next((i for i, (a, b) in enumerate(zip(now, old)) if a != b), min(len(now), len(old)))
        changes.append(TextChange(conv.conversation_id, conv.line, first))
    return changes


@dataclass
class Admitted:
    """A batch ready to store: its conversations (scrubbed unless asked otherwise), what the scrub replaced
    (None: not scrubbed) and the conversations whose stored text they change (only with `replace`)."""

    conversations: list[Conversation]
    redaction: RedactionReport | None
    changes: list[TextChange]


def admit(conversations: list[Conversation], store: Store, identifiers: Identifiers | None = None,
          phone_region: str = "US", scrub: bool = True, replace: bool = False) -> Admitted:
    """The step every batch goes through before anything is stored: personal details replaced by
    placeholders (each conversation with `identifiers`, its participant's names and terms), then the
    texts compared with the store's. A changed text raises ReimportConflict (nothing written) unless
    `replace`, for a caller that can replace the turns nobody rated (`sense7 import --replace`)."""
    redaction = None
    if scrub:
        owners = {c.rater_id for c in conversations}
        conversations, redaction = scrub_conversations(
            conversations, {r: identifiers or Identifiers() for r in owners}, phone_region=phone_region)
    changes = text_changes(conversations, store)
    if changes and not replace:
        raise ReimportConflict(changes, replace=False)
    return Admitted(conversations, redaction, changes)
