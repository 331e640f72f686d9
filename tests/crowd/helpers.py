"""A crowd study on disk for the tests: study file, consent text and a pool of conversations."""

from __future__ import annotations

import json
from pathlib import Path

CONSENT = "# Consent\n\nYou will rate replies of an AI assistant. Your answers are kept under a pseudonym.\n"


def pool_lines(n: int, turns: int = 2, prefix: str = "pool") -> list[str]:
    lines = []
    for i in range(n):
        messages = []
        for t in range(turns):
            messages += [{"role": "user", "content": f"{prefix} {i} question {t}: I feel stuck with my thesis draft."},
                         {"role": "assistant", "content": f"{prefix} {i} reply {t}: That sounds hard; what part feels stuck?"}]
        lines.append(json.dumps({"conversation_id": f"{prefix}{i:03d}", "rater_id": "owner",
                                 "context": {"task_type": "advice", "emotional_state": 3,
                                             "empathy_wanted": 4}, "messages": messages}))
    return lines


def write_study(folder: Path, pool: int = 6, turns: int = 2, k: int = 2, n: int = 2, cap: int = 50,
                lease: int = 60, study: str = "pilot", extra: str = "", budget: int | None = None,
                codes: str = "") -> Path:
    """`codes`: more lines of the codes mapping (e.g. "  full: FULL4242\n")."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "consent.md").write_text(CONSENT)
    (folder / "pool.jsonl").write_text("\n".join(pool_lines(pool, turns)) + "\n")
    path = folder / "study.yaml"
    path.write_text(f"""study: {study}
consent: consent.md
comprehension:
  - question: What does "Continuity" mean here?
    choices: ["The reply follows on from what was said", "The reply is long", "The reply is polite"]
    answer: 1
  - question: A reply ignores what the user said. How continuous is it?
    choices: ["Very", "Not at all"]
    answer: 2
raters_per_conversation: {k}
{f"turns_per_participant: {budget}" if budget is not None else f"conversations_per_participant: {n}"}
lease_minutes: {lease}
participant_cap: {cap}
codes:
  completion: DONE1234
  completion_url: https://app.prolific.com/submissions/complete?cc=DONE1234
  no_consent: NOCONS99
  screen_out: SCREEN77
{codes}pool: pool.jsonl
{extra}""")
    return path
