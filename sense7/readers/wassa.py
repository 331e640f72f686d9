"""The WASSA 2024 empathic-conversations data as `RatingData`: real people rating perceived empathy.

Two crowd workers chat about a news article, then each rates how empathic the *other* person was (1-7).
Mapped onto sense7's shapes from the rater's point of view: the other person's turns are the rated
"assistant" messages, the rater's own turns are "user" messages, and the rating is conversation-level
(turn_index NA) on one control, `perceived_empathy`. Traits are the 14 questionnaire columns. The other
person is the conversation's `assistant_id` (context), since people are rated in several conversations.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sense7.data.conversations import Conversation, Message
from sense7.data.dataset import RatingData
from sense7.readers.formats import RATING_COLUMNS

CONTROL = "perceived_empathy"
SCALE = (1, 7)
RATINGS_FILE = "trac1_CONVD_train.csv"
TURNS_FILE = "trac2_CONVT_train.csv"
TRAIT_FILES = ("trac4_PER_train.csv", "trac4_PER_dev.csv")
TRAIT_COLUMNS = (
    "gender", "education", "race", "age", "income",
    "iri_perspective_taking", "iri_personal_distress", "iri_fantasy", "iri_empathatic_concern",
    "personality_openess", "personality_conscientiousness", "personality_extraversion",
    "personality_agreeableness", "personality_stability",
)
RENAMED = {"gender": "gender_code"}
RATING_SOURCE = "this_persons_perceived_empathy_of_other_person"


def _read(directory: Path, name: str, required: tuple[str, ...]) -> pd.DataFrame:
    path = directory / name
    if not path.is_file():
        raise ValueError(f"{path}: file not found (expected the WASSA 2024 CSV files in {directory})")
    # The published files escape quotes inside text with a backslash.
    frame = pd.read_csv(path, escapechar="\\")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)}")
    return frame


def _person_id(value) -> str:
    return str(value).strip()


def load_wassa(directory: str | Path) -> RatingData:
    """Ratings with their conversations and the raters' traits; see the module docstring for the mapping.

    Dropped, on purpose: ratings outside 1-7 (two rows hold 8 and 9) and ratings of conversations whose
    turns are not in the train turns file (about 3%): without text there is nothing to model.
    """
    directory = Path(directory)
    ratings = _read(directory, RATINGS_FILE, ("conversation_id", "person_id_1", RATING_SOURCE))
    turns = _read(directory, TURNS_FILE, ("conversation_id", "turn_id", "speaker", "text",
                                          "person_id_1", "person_id_2"))

    ratings = ratings[ratings[RATING_SOURCE].between(*SCALE)]
    conversations = {}
    for conv_id, conv_turns in turns.sort_values(["conversation_id", "turn_id"]).groupby("conversation_id"):
        first = conv_turns.iloc[0]
        speakers = {"Person 1": _person_id(first["person_id_1"]), "Person 2": _person_id(first["person_id_2"])}
        for rater in speakers.values():
            messages = [
                Message("user" if speakers.get(str(row.speaker).strip()) == rater else "assistant",
                        "" if pd.isna(row.text) else str(row.text))
                for row in conv_turns.itertuples()
            ]
            # The ratee (the other person) is the "assistant" being rated: the models' optional
            # assistant effect (sense7.model.rater_effects.AssistantEffects) learns how empathic they come across.
            other = next((p for p in speakers.values() if p != rater), None)
            context = {"assistant_id": other} if other else {}
            conversations[(str(conv_id), rater)] = Conversation(str(conv_id), rater, messages, context)

    frame = pd.DataFrame({
        "conversation_id": ratings["conversation_id"].astype(str),
        "turn_index": pd.array([pd.NA] * len(ratings), dtype="Int64"),
        "rater_id": ratings["person_id_1"].map(_person_id),
        "dimension": CONTROL,
        "rating": ratings[RATING_SOURCE].astype(int),
    })[RATING_COLUMNS]
    has_text = [(c, r) in conversations for c, r in zip(frame["conversation_id"], frame["rater_id"])]
    frame = frame[has_text].reset_index(drop=True)
    used = set(zip(frame["conversation_id"], frame["rater_id"]))
    conversations = {key: conv for key, conv in conversations.items() if key in used}
    traits = _read_traits(directory)
    return RatingData(conversations, frame, traits[traits.index.isin(frame["rater_id"])])


def _read_traits(directory: Path) -> pd.DataFrame:
    """Trait rows by person id. The dev file numbers people without the "p" prefix and its numbers do
    not match the train file's people (ages differ), so its rows are kept under their own ids and never
    merged into a train rater. Only raters with ratings are returned."""
    frames = []
    for name in TRAIT_FILES:
        if (directory / name).is_file():
            frame = _read(directory, name, ("person_id",) + TRAIT_COLUMNS)
            frames.append(frame.assign(person_id=frame["person_id"].map(_person_id)))
    if not frames:
        raise ValueError(f"{directory / TRAIT_FILES[0]}: file not found")
    traits = pd.concat(frames).drop_duplicates("person_id", keep="first").set_index("person_id")
    traits.index.name = "rater_id"
    # "gender" is also a taxonomy profile field (a choice of words); WASSA codes it as a number, so it
    # keeps a name of its own and stays a numeric trait.
    return traits[list(TRAIT_COLUMNS)].astype(float).rename(columns=RENAMED)
