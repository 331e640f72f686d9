"""A small study with a signal a model can learn, for the jobs' tests and the benchmarks: raters with a
profile, and conversations whose assistant turns are either warm (WARM, rated high) or cold (COLD, rated
low). `turn_level` is the rating a rater with a given bias gives a turn."""

from __future__ import annotations

import random

from sense7.data.conversations import Conversation, Message
from sense7.taxonomy import Taxonomy

WARM = ["I hear how hard this has been for you.", "That sounds really painful, and it makes sense you feel so.",
        "Thank you for telling me; what feels heaviest right now?"]
COLD = ["Here is a list of options.", "Try to be more productive.", "That is a common problem. Next question?"]


def make_raters(n: int, taxonomy: Taxonomy, prefix: str = "r", domain: str = "raters.test") -> list[dict]:
    """`n` raters `{prefix}1..` with an email at `domain` and an answer to every profile question."""
    rows = []
    for i in range(1, n + 1):
        traits = {f.key: (f.choices[i % len(f.choices)] if f.type == "choice" else f.min + (i % (f.max - f.min + 1)))
                  for f in taxonomy.profile_fields}
        rows.append({"rater_id": f"{prefix}{i}", "email": f"{prefix}{i}@{domain}", "traits": traits})
    return rows


def make_conversations(raters: list[str], per_rater: int = 6, turns: int = 3, seed: int = 0,
                       prefix: str = "c") -> list[Conversation]:
    """`per_rater` conversations of `turns` user/assistant pairs for each rater; warm and cold turns alternate."""
    rng = random.Random(seed)
    convs = []
    for r in raters:
        for k in range(per_rater):
            messages = []
            for t in range(turns):
                messages.append(Message("user", f"({prefix}{r}{k}/{t}) I feel {rng.choice(['sad', 'lost', 'tired'])}."))
                messages.append(Message("assistant", rng.choice(WARM if (k + t) % 2 == 0 else COLD)))
            convs.append(Conversation(f"{prefix}-{r}-{k}", r, messages,
                                      {"task_type": "emotional_support", "emotional_state": 1 + k % 5,
                                       "empathy_wanted": 1 + (k + 2) % 5}))
    return convs


def turn_level(turn_text: str, bias: int = 0) -> int:
    """The rating of a turn: 4 for a warm turn, 2 for a cold one, shifted by the rater's bias (1..5)."""
    base = 4 if turn_text in WARM else 2
    return max(1, min(5, base + bias))
