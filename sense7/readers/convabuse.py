"""The ConvAbuse data (Cercas Curry, Abercrombie and Rieser, EMNLP 2021) as `RatingData`: identified
expert annotators rating, in context, how abusive a user's message to a conversational agent is.

`ConvAbuseEMNLPfull.csv` has one row per (example, annotator): the agent's previous utterance
(`prev_agent`), the user's previous utterance (`prev_user`), the agent's utterance (`agent`), the rated user
utterance (`user`) and the annotator's one-hot severity `is_abuse.1` (not abusive), `.0` (ambiguous),
`.-1` (mild), `.-2` (strong), `.-3` (very strong).

Mapped onto sense7's shapes from the rated side: the rated party is the *user*, so the user's utterances
are sense7's "assistant" turns (the rated turns) and the agent's utterances are the "user" messages they
answer. An item is (conv_id, prev_agent, prev_user, agent, user); every item of a conversation becomes four
messages of one sense7 conversation per `conv_id`, in the order of their first example number, the rated
turn being the fourth (so the turn key, sense7.research.perspectivist.TURN_KEY, is the same for every
annotator of an item and folds group whole conversations). The rating is on one control, `abuse_severity`,
1 (not abusive) to 5 (very strongly abusive). No traits. The agent's name (`bot`: CarbonBot or
E.L.I.Z.A.) is the conversation's context `agent`; it is not the rated party, so it is not `assistant_id`.

Repeat annotations (an annotator rating the same item again, for the authors' test-retest agreement): the
first (lowest example number) is kept; `repeats` of the loader's result counts the rest.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sense7.data.conversations import Conversation, Message
from sense7.data.dataset import RatingData
from sense7.readers.formats import RATING_COLUMNS

CONTROL = "abuse_severity"
FILE = "ConvAbuseEMNLPfull.csv"
# One-hot severity columns, from level 1 (not abusive) to 5 (very strongly abusive).
SEVERITY_COLUMNS = ("is_abuse.1", "is_abuse.0", "is_abuse.-1", "is_abuse.-2", "is_abuse.-3")
TEXT_COLUMNS = ("prev_agent", "prev_user", "agent", "user")
REQUIRED = ("example_no", "annotator_id", "conv_id") + TEXT_COLUMNS + SEVERITY_COLUMNS
# Each item's messages in a sense7 conversation: (column, sense7 role); the rated turn is the last.
ROLES = (("prev_agent", "user"), ("prev_user", "assistant"), ("agent", "user"), ("user", "assistant"))


def _read(path: Path) -> pd.DataFrame:
    if path.is_dir():
        path = path / FILE
    if not path.is_file():
        raise ValueError(f"{path}: file not found (expected ConvAbuse's {FILE})")
    frame = pd.read_csv(path, dtype={"conv_id": str, "annotator_id": str}, keep_default_na=False)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)}")
    severity = frame[list(SEVERITY_COLUMNS)].apply(pd.to_numeric, errors="coerce")
    bad = severity.isna().any(axis=1) | (severity.sum(axis=1) != 1) | ~severity.isin([0, 1]).all(axis=1)
    if bad.any():
        row = int(bad.to_numpy().argmax())
        raise ValueError(f"{path}:{row + 2}: {', '.join(SEVERITY_COLUMNS)}: expected exactly one 1 (one-hot "
                         f"severity), got {severity.iloc[row].tolist()}")
    blank = (frame["annotator_id"].str.strip() == "") | (frame["conv_id"].str.strip() == "")
    if blank.any():
        row = int(blank.to_numpy().argmax())
        field = "annotator_id" if frame["annotator_id"].iloc[row].strip() == "" else "conv_id"
        raise ValueError(f"{path}:{row + 2}: {field}: empty")
    frame["level"] = severity.to_numpy().argmax(axis=1) + 1
    frame["example_no"] = pd.to_numeric(frame["example_no"], errors="coerce")
    return frame


class ConvAbuseData(RatingData):
    """RatingData with how many repeat annotations were left out (`repeats`)."""

    repeats: int = 0


def load_convabuse(path: str | Path) -> RatingData:
    """ConvAbuse's full file (or a directory holding it) as RatingData; see the module docstring."""
    frame = _read(Path(path))
    frame["conv_id"] = frame["conv_id"].str.strip()
    frame["annotator_id"] = frame["annotator_id"].str.strip()
    item_key = ["conv_id", *TEXT_COLUMNS]
    frame = frame.sort_values("example_no", kind="stable")
    frame["item"] = frame.groupby(item_key, sort=False).ngroup()
    kept = frame.drop_duplicates(["item", "annotator_id"], keep="first")

    conversations, turn_of_item = {}, {}
    messages_of = {}
    for conv_id, conv_rows in kept.drop_duplicates("item").groupby("conv_id", sort=False):
        messages = []
        for row in conv_rows.itertuples(index=False):
            messages.extend(Message(role, str(getattr(row, column))) for column, role in ROLES)
            turn_of_item[row.item] = len(messages) - 1
        messages_of[conv_id] = (messages, {"agent": str(conv_rows["bot"].iloc[0])} if "bot" in conv_rows else {})
    for (conv_id, rater), _ in kept.groupby(["conv_id", "annotator_id"], sort=False):
        messages, context = messages_of[conv_id]
        conversations[(conv_id, rater)] = Conversation(conv_id, rater, list(messages), dict(context))

    ratings = pd.DataFrame({
        "conversation_id": kept["conv_id"].to_numpy(),
        "turn_index": pd.array(kept["item"].map(turn_of_item).to_numpy(), dtype="Int64"),
        "rater_id": kept["annotator_id"].to_numpy(),
        "dimension": CONTROL,
        "rating": kept["level"].astype(int).to_numpy(),
    })[RATING_COLUMNS].reset_index(drop=True)
    data = ConvAbuseData(conversations, ratings, pd.DataFrame(index=pd.Index([], name="rater_id")))
    data.repeats = int(len(frame) - len(kept))
    return data
