"""Conversations: the in-memory form every importer, model and job shares.

A conversation is what one rater had (or was assigned to rate) with an assistant. Each assistant message
is one ratable *turn*, identified by its index in `messages` (so system messages keep indices stable).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("user", "assistant", "system")


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass
class Conversation:
    conversation_id: str
    rater_id: str
    messages: list[Message]
    context: dict = field(default_factory=dict)  # task_type, emotional_state, empathy_wanted (taxonomy.yaml)
    line: int | None = None  # where it came from, for error messages

    def assistant_turns(self) -> list[int]:
        """Indices in `messages` of the assistant turns, in order."""
        return [i for i, m in enumerate(self.messages) if m.role == "assistant"]

    def history(self, turn_index: int) -> list[Message]:
        """The messages before the turn, i.e. what the rater had seen when the turn arrived."""
        return self.messages[:turn_index]

    def to_json(self) -> dict:
        return {
            "conversation_id": self.conversation_id,
            "rater_id": self.rater_id,
            "context": self.context,
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
        }

    @classmethod
    def from_json(cls, obj: dict, line: int | None = None) -> "Conversation":
        """Trusting constructor for data sense7 wrote itself; user files go through sense7.readers.formats."""
        return cls(
            conversation_id=str(obj["conversation_id"]),
            rater_id=str(obj["rater_id"]),
            messages=[Message(m["role"], m["content"]) for m in obj["messages"]],
            context=dict(obj.get("context") or {}),
            line=line,
        )


def task_key(conversation_id: str, turn_index: int, rater_id: str) -> str:
    """The stable identity of a rating task: importing the same batch twice finds these and skips them."""
    return f"{conversation_id}::{turn_index}::{rater_id}"


def profile_task_key(rater_id: str) -> str:
    """The stable identity of a rater's questionnaire task (the rater page's provisional copy of it, made
    before Label Studio has it, is found again by this key: sense7.store.rater_page_tables.RaterQueue)."""
    return f"profile::{rater_id}"
