"""Model items: what a rater model reads, one row per (conversation, assistant turn, rater).

Every way into a model builds its rows with `item_row`, so a model sees exactly the same columns when it is
trained, when it is served and when it judges for a jury:

- `build_items(data, taxonomy) -> (X, Y)`: rated conversations (native files, the store, WASSA): training
  and evaluation;
- `task_columns(task_datas, contexts, taxonomy)` and `items_from_tasks(...)`: Label Studio task data
  (DESIGN.md; built by `sense7.labelstudio.protocol.rating_tasks`): the ML backend and pre-annotation;
- `transcript_columns(conversations, taxonomy)`: every assistant turn of unrated transcripts: the jury.

*Columns* are the item columns as plain lists, contexts included, traits not: what the compiled predictor
(`sense7.model.serving`) reads, since building a DataFrame costs more than predicting. `item_frame` turns
columns into X, adding each rater's trait features (`trait_table`).
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pandas as pd

from sense7.data.conversations import Conversation
from sense7.data.dataset import RatingData, trait_features
from sense7.taxonomy import Taxonomy

ITEM_KEYS = ["conversation_id", "turn_index", "rater_id"]

# Task data shows an empty history as this one line (Label Studio cannot lay out an empty list); it is
# display only: the item of a first turn has an empty history, however it was built.
START_PLACEHOLDER = {"role": "system", "content": "(This is the start of the conversation.)"}
# Task data's "position" ("Response 2 of 9", protocol.rating_tasks) carries the turn's position and count.
_POSITION = re.compile(r"(\d+)\D+(\d+)")


def assistant_id_of(value) -> str | None:
    """An optional assistant (ratee) id as a string; None when unknown (missing, NaN or blank)."""
    if value is None or (np.ndim(value) == 0 and pd.isna(value)):
        return None
    text = str(value).strip()
    return text or None


def _joined(messages) -> str:
    return "\n".join([f"{m['role']}: {m['content']}" for m in messages])  # (a list joins faster than a generator)


# -- relational features: the rated turn against the message it answers and the history ------------------
# Whether a reply takes up *what the user said* (their words, their details, their question, their feelings)
# is invisible to bags of n-grams over the reply and the history separately.

_WORD = re.compile(r"[A-Za-z][A-Za-z']+|\d+")
_STOP = frozenset("""a about after again all also am an and any are as at be because been before being but by
can could did do does doing don't for from had has have having he her here hers him his how i i'm if in into is
it it's its just me more most my no not now of off on once only or other our out over own same she should so
some such than that the their them then there these they this those through to too under until up very was we
were what when where which while who whom why will with would you your yours yeah yes ok okay oh well really
get got like know think going go one thing things much many""".split())
# Feeling words (stems): echoing the user's feeling is the textbook acknowledgement.
_FEELINGS = ("sad", "unhapp", "depress", "lonel", "alone", "hurt", "pain", "cry", "angr", "mad", "furious",
             "annoy", "frustrat", "upset", "afraid", "scare", "fear", "terrif", "anxi", "worr", "nervous",
             "stress", "overwhelm", "tired", "exhaust", "ashamed", "embarrass", "guilt", "disappoint",
             "happy", "glad", "excit", "proud", "relie", "grateful", "love", "hate", "miss", "grief", "griev",
             "heartbr", "devastat", "awful", "terribl", "horribl", "sorry", "confus", "hopeless", "helpless")
RELATIONAL_COLUMNS = ("rel_answer_overlap", "rel_history_overlap", "rel_detail_overlap", "rel_question_asked",
                      "rel_question_answered", "rel_feeling_echo", "rel_length_ratio", "rel_question_ratio")


# One pass over a text: sentence ends and words, in order (named details need to know what starts a sentence).
_TOKEN_OR_END = re.compile(r"([.!?\n])|([A-Za-z][A-Za-z']+|\d+)")
# How much of the answered message and the history is read (their ends): serving computes these per task.
_ANSWERED_CHARS, _HISTORY_CHARS = 1000, 2000


def _content_words(tokens) -> set[str]:
    return {w for w in map(str.lower, tokens) if len(w) > 2 and w not in _STOP}


def _tokens_and_details(text: str) -> tuple[list[str], set[str]]:
    """(the words of `text`, its named details: numbers and capitalized words that do not start a sentence,
    such as names and places)."""
    tokens, details, starts = [], set(), True
    for end, word in _TOKEN_OR_END.findall(text):
        if end:
            starts = True
            continue
        tokens.append(word)
        if word.isdigit():
            details.add(word)
        elif not starts and word[0].isupper() and word != "I" and word.lower() not in _STOP:
            details.add(word.lower())
        starts = False
    return tokens, details


# Texts whose words a process keeps (`_words_of`): serving computes the relational columns per task, and the
# same texts come back (the message a turn answers is the turn before it; Label Studio asks for a task again).
TEXT_WORDS_KEPT = 8192
HISTORIES_KEPT = 2048  # (whole histories: longer than one message)


@functools.lru_cache(maxsize=TEXT_WORDS_KEPT)
def _words_of(text: str) -> tuple[int, frozenset, frozenset]:
    """(how many words, the content words, the named details) of `text`: the tokenizing was most of a served
    request's time with relational columns (regular expressions per text, 3 per item)."""
    tokens, details = _tokens_and_details(text)
    return len(tokens), frozenset(_content_words(tokens)), frozenset(details)


@functools.lru_cache(maxsize=TEXT_WORDS_KEPT)
def _tail_words(text: str) -> frozenset:
    """The content words of a history's tail (as `_words_of`, kept per text)."""
    return frozenset(_content_words(_WORD.findall(text)))


@functools.lru_cache(maxsize=TEXT_WORDS_KEPT)
def _feelings(words: frozenset) -> frozenset:
    """The feeling stems among `words` (a text's kept words: a frozenset hashes once)."""
    return frozenset(next(stem for stem in _FEELINGS if w.startswith(stem))
                     for w in words if w.startswith(_FEELINGS))


def forget_kept_words() -> None:
    """Empty the per-text caches of the relational columns (`_words_of`, `_tail_words`, `_feelings`,
    `_messages_of`): the next computation tokenizes every text afresh (what tests compare the cached values with)."""
    for kept in (_words_of, _tail_words, _feelings, _messages_of):
        kept.cache_clear()


def _share(wanted: set, found: set) -> float:
    return len(wanted & found) / len(wanted) if wanted else 0.0


_ROLE_LINE = re.compile(r"^(user|assistant|system): ", re.MULTILINE)


@functools.lru_cache(maxsize=HISTORIES_KEPT)
def _messages_of(history_text: str) -> tuple[dict, ...]:
    """The messages of an item's history_text (`_joined`'s "role: content" lines) back (kept per text, as
    `_words_of`: the callers only read them)."""
    parts = _ROLE_LINE.split(history_text or "")
    return tuple({"role": role, "content": content.rstrip("\n")} for role, content in zip(parts[1::2], parts[2::2]))


def relational_columns(columns) -> dict[str, np.ndarray]:
    """{name: (n,) values} of RELATIONAL_COLUMNS for item columns (a frame or the plain columns of
    `task_columns`): derived from `text`, `history_text` and `turn_position` (<= 0: a whole-conversation
    item), so training, serving and the jury compute them the same way. Computed on demand by the models
    that use them (ItemFeatures.relational_weight > 0), not by `item_row`: serving would otherwise pay for
    them on every task whether the model reads them or not."""
    texts, histories = list(columns["text"]), list(columns["history_text"])
    positions = np.asarray(columns["turn_position"], dtype=float)
    rows = [relational_features(_messages_of("" if h is None or h != h else str(h)),
                                [{"role": "assistant", "content": "" if t is None or t != t else str(t)}],
                                whole=bool(p <= 0))
            for t, h, p in zip(texts, histories, positions)]
    return {name: np.array([row[name] for row in rows], dtype=float) for name in RELATIONAL_COLUMNS}


def answered_message(history: list[dict], rated_role: str, whole: bool) -> str:
    """What a turn answers: the last message of the history that is not the rated side's nor the system's;
    for a whole-conversation item, all such messages (one a line)."""
    others = [m["content"] for m in history if m["role"] not in (rated_role, "system")]
    return "\n".join(others) if whole else (others[-1] if others else "")


def answered_texts(columns) -> list[str]:
    """The message each item answers (`answered_message`), from item columns (a frame or the plain columns
    of `task_columns`): what a text encoder's relational similarity compares the rated turn with
    (sense7.model.features.ItemFeatures)."""
    return [answered_message(_messages_of("" if h is None or h != h else str(h)), "assistant", bool(p <= 0))
            for h, p in zip(list(columns["history_text"]), np.asarray(columns["turn_position"], dtype=float))]


def relational_features(history: list[dict], turn: list[dict], whole: bool | None = None) -> dict:
    """RELATIONAL_COLUMNS of a turn: overlaps are shares of the answered message's content words / named
    details / feeling words that the turn takes up (0 when there is nothing to take up); the answered
    message is the last message before the turn that is not the rated side's (for a whole-conversation
    item, every such message); ratios compare the turn's words and questions with the answered message's.
    Only the ends of long answered messages and histories are read (serving computes this per task)."""
    whole = len(turn) > 1 if whole is None else whole  # a whole-conversation item answers every message
    answered = answered_message(history, turn[0]["role"] if turn else "assistant", whole)[-_ANSWERED_CHARS:]
    reply = "\n".join(m["content"] for m in turn)
    n_reply, reply_words, reply_details = _words_of(reply)
    n_answered, answered_words, answered_details = _words_of(answered)
    history_words = _tail_words(" ".join(m["content"] for m in history)[-_HISTORY_CHARS:])
    asked = "?" in answered
    # A question is answered when the reply says something (not only asks back) about its words.
    says = asked and bool(reply.strip()) and (not reply.rstrip().endswith("?") or "." in reply or "!" in reply)
    return {
        "rel_answer_overlap": _share(answered_words, reply_words),
        "rel_history_overlap": _share(reply_words, history_words),
        "rel_detail_overlap": _share(answered_details, reply_details | reply_words),
        "rel_question_asked": float(asked),
        "rel_question_answered": float(says and bool(answered_words & reply_words)),
        "rel_feeling_echo": _share(_feelings(answered_words), _feelings(reply_words)),
        "rel_length_ratio": math.log((n_reply + 1) / (n_answered + 1)) / 3.0,
        "rel_question_ratio": (reply.count("?") - answered.count("?")) / 3.0,
    }


def item_row(conversation_id, turn_index, rater_id, history: list[dict], turn: list[dict],
             turn_position: int, n_turns: int, assistant_id=None) -> dict:
    """One item's ITEM_COLUMNS: the rated text, the history before it, where it stands and who is rated
    (the turn's relational features derive from these: `relational_columns`)."""
    return {
        "conversation_id": str(conversation_id),
        "turn_index": turn_index,
        "rater_id": str(rater_id),
        "text": "\n".join(m["content"] for m in turn),
        "history_text": _joined(history),
        "turn_position": float(turn_position),
        "n_turns": float(n_turns),
        # Who is rated (a model version; in WASSA the other person): optional, None when unknown.
        "assistant_id": assistant_id_of(assistant_id),
    }


ITEM_COLUMNS = list(item_row("", 0, "", [], [], 0, 0))


def _conversation_item(conv: Conversation, turn_index) -> dict:
    """The item for one turn (or, with turn_index NA, the whole conversation) of a conversation."""
    turns = conv.assistant_turns()
    assistant_id = (conv.context or {}).get("assistant_id")
    messages = [{"role": m.role, "content": m.content} for m in conv.messages]
    if turn_index is pd.NA or turn_index is None or (isinstance(turn_index, float) and math.isnan(turn_index)):
        # A rating of the whole conversation: the rated text is every assistant turn, the rest is context.
        assistant = [m for m in messages if m["role"] == "assistant"]
        others = [m for m in messages if m["role"] != "assistant"]
        return item_row(conv.conversation_id, pd.NA, conv.rater_id, others, assistant, 0, len(turns),
                        assistant_id)
    turn_index = int(turn_index)
    return item_row(conv.conversation_id, turn_index, conv.rater_id, messages[:turn_index],
                    [messages[turn_index]], turns.index(turn_index) + 1, len(turns), assistant_id)


def _with_contexts(rows: list[dict], contexts: dict, taxonomy: Taxonomy) -> dict[str, list]:
    """Rows as columns, plus ctx_<field>: each item's raw context answer (None when its (conversation,
    rater) pair has no context or no answer)."""
    return _add_contexts({name: [row[name] for row in rows] for name in ITEM_COLUMNS}, contexts, taxonomy)


def _add_contexts(columns: dict[str, list], contexts: dict, taxonomy: Taxonomy) -> dict[str, list]:
    """Item columns plus ctx_<field> (see `_with_contexts`)."""
    pairs = list(zip(columns["conversation_id"], columns["rater_id"]))
    for fld in taxonomy.context_fields:
        columns[f"ctx_{fld.key}"] = [(contexts.get(pair) or {}).get(fld.key) for pair in pairs]
    return columns


def trait_columns(X: pd.DataFrame) -> list[str]:
    """X's trait_<name> columns."""
    return [c for c in X.columns if c.startswith("trait_")]


def trait_table(raters: pd.DataFrame, taxonomy: Taxonomy) -> pd.DataFrame:
    """The trait_<name> features of every rater of a raw trait frame (index rater_id as text): what X's
    trait columns are read from, and what `CompiledBundle.rater_table` takes."""
    if not len(raters.columns):
        return pd.DataFrame(index=raters.index.astype(str))
    traits = trait_features(raters, taxonomy).add_prefix("trait_")
    return traits.set_axis(traits.index.astype(str))


def item_frame(columns: dict[str, list], raters: pd.DataFrame, taxonomy: Taxonomy) -> pd.DataFrame:
    """X from item columns: ITEM_COLUMNS, the ctx_<field> columns (numeric fields as numbers) and the
    trait_<name> columns of each item's rater (numeric, NaN when unknown)."""
    items = pd.DataFrame({name: columns[name] for name in ITEM_COLUMNS}, columns=ITEM_COLUMNS)
    types = {f"ctx_{fld.key}": fld.type for fld in taxonomy.context_fields}
    for name, values in columns.items():
        if name in types:
            column = pd.Series(values, index=items.index, dtype=object)
            items[name] = pd.to_numeric(column, errors="coerce") if types[name] == "int" else column
    traits = trait_table(raters, taxonomy)
    joined = traits.reindex(items["rater_id"].to_numpy())
    for column in traits.columns:
        items[column] = joined[column].to_numpy(dtype=float)
    items["turn_index"] = items["turn_index"].astype("Int64")
    return items


# ---------------------------------------------------------------------------------------------------
# From rated conversations (training)

def build_items(data: RatingData, taxonomy: Taxonomy) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(X, Y) for training: X as in DESIGN.md, Y one float column per control (NaN = not rated)."""
    controls = data.controls(taxonomy)
    ratings = data.ratings[data.ratings["dimension"].isin(controls)]
    # Pivot with a sentinel for the whole-conversation rows (pivot drops NA keys).
    keyed = ratings.assign(turn_index=ratings["turn_index"].astype("Int64").fillna(-1).astype(int))
    wide = keyed.pivot_table(index=ITEM_KEYS, columns="dimension", values="rating", aggfunc="mean")
    wide = wide.reindex(columns=controls).astype(float)
    rows = []
    for conv_id, turn, rater_id in wide.index:
        conv = data.conversations.get((conv_id, rater_id))
        if conv is None:
            raise ValueError(f"ratings name conversation {conv_id!r} for rater {rater_id!r}, which is not loaded")
        rows.append(_conversation_item(conv, pd.NA if turn == -1 else turn))
    contexts = {key: conv.context for key, conv in data.conversations.items()}
    X = item_frame(_with_contexts(rows, contexts, taxonomy), data.raters, taxonomy)
    Y = pd.DataFrame(wide.to_numpy(), columns=controls)
    Y.columns.name = None
    return X, Y


# ---------------------------------------------------------------------------------------------------
# From Label Studio task data (serving)

def task_columns(task_datas: list[dict], contexts: dict, taxonomy: Taxonomy) -> dict[str, list]:
    """The item columns of Label Studio task data (DESIGN.md), contexts (store.contexts_for) included.

    The columns `item_row` gives for each task, filled directly (no row dicts, which cost a served request
    more than the rest of this): tests/model/test_dataset.py holds them equal to the columns of the same
    turns built with `item_row` from the conversations."""
    conversation_ids, turn_indices, rater_ids, texts, history_texts = [], [], [], [], []
    positions, counts, assistant_ids = [], [], []
    for data in task_datas:
        match = _POSITION.search(str(data.get("position", "")))
        position, n_turns = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        history = data.get("history") or []
        if START_PLACEHOLDER in history:  # (one C-level scan: the common case has nothing to remove)
            history = [m for m in history if m != START_PLACEHOLDER]
        turn_index = data.get("turn_index")
        turn_index = pd.NA if turn_index in (None, "") else int(turn_index)
        conversation_id, rater_id = str(data["conversation_id"]), str(data["rater_id"])
        # The assistant (ratee), when the task data or the stored context names it; else unknown.
        assistant_id = data.get("assistant_id")
        if assistant_id_of(assistant_id) is None:
            assistant_id = (contexts.get((conversation_id, rater_id)) or {}).get("assistant_id")
        conversation_ids.append(conversation_id)
        turn_indices.append(turn_index)
        rater_ids.append(rater_id)
        texts.append("\n".join([m["content"] for m in data.get("turn") or []]))
        history_texts.append(_joined(history))
        positions.append(float(position))
        counts.append(float(n_turns))
        assistant_ids.append(assistant_id_of(assistant_id))
    return _add_contexts({"conversation_id": conversation_ids, "turn_index": turn_indices, "rater_id": rater_ids,
                          "text": texts, "history_text": history_texts, "turn_position": positions,
                          "n_turns": counts, "assistant_id": assistant_ids}, contexts, taxonomy)


def items_from_tasks(task_datas: list[dict], raters: pd.DataFrame, contexts: dict,
                     taxonomy: Taxonomy) -> pd.DataFrame:
    """X for Label Studio task data: raters = raw trait frame, contexts = store.contexts_for."""
    return item_frame(task_columns(task_datas, contexts, taxonomy), raters, taxonomy)


# ---------------------------------------------------------------------------------------------------
# From unrated transcripts (the jury)

HISTORY_CHARS = 300  # the history's end a rater model reads by default (ItemFeatures.history_chars)


def encoder_texts(messages: list[dict], history_chars: int = HISTORY_CHARS) -> list[str]:
    """The distinct texts a text encoder reads for the items of one conversation (messages: role and content):
    each assistant turn and the whole conversation's turns, the message each answers, the history's last
    `history_chars` characters (what sense7.model.features.ItemFeatures.encoded_texts reads from the items'
    columns). What the store's text vectors of a conversation are keyed by (sense7.privacy.participation
    erases them with the conversation)."""
    rows = []
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for position, index in enumerate(turns, start=1):
        rows.append(item_row("", index, "", messages[:index], [messages[index]], position, len(turns)))
    if turns:
        rows.append(item_row("", None, "", [m for m in messages if m["role"] != "assistant"],
                             [m for m in messages if m["role"] == "assistant"], 0, len(turns)))
    columns = {"history_text": [r["history_text"] for r in rows], "turn_position": [r["turn_position"] for r in rows]}
    keep = int(history_chars)
    tails = [h[-keep:] if keep > 0 else "" for h in columns["history_text"]]
    return list(dict.fromkeys([r["text"] for r in rows] + answered_texts(columns) + tails))


def transcript_columns(conversations: list[Conversation], taxonomy: Taxonomy) -> dict[str, list]:
    """The item columns of every assistant turn of each conversation, in order, each read with its own
    conversation's context (rater_id: the conversation's own rater)."""
    rows = [_conversation_item(conv, index) for conv in conversations for index in conv.assistant_turns()]
    contexts = {(conv.conversation_id, conv.rater_id): conv.context for conv in conversations}
    return _with_contexts(rows, contexts, taxonomy)
