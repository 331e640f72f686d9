"""Relational features (sense7.data.items.relational_features): by hand, the same from every way into a
model (training items, Label Studio task data, unrated transcripts), and used by the rater models."""

import numpy as np
import pandas as pd
import pytest

from sense7.data.conversations import Conversation, Message
from sense7.data.dataset import RatingData
from sense7.data.items import (
    RELATIONAL_COLUMNS,
    build_items,
    forget_kept_words,
    relational_columns,
    relational_features,
    task_columns,
    transcript_columns,
)
from sense7.model.features import ItemFeatures, TextEncoder
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()
USER = "I failed my Biology exam on Monday and feel awful. What should I do?"



def out_of_fold_error(model, X, Y) -> float:
    """The squared error of `model`'s out-of-fold text scores on its training rows: what the inner
    cross-validation minimises when it chooses a weight."""
    Yv = model._check_fit_input(X, Y)
    Tv = model._fit_target_scale(Yv)
    oof = model._fit_text(X, Tv)
    return float(np.nansum((oof - Tv) ** 2))

def _msg(role, content):
    return {"role": role, "content": content}


def test_relational_features_by_hand():
    history = [_msg("assistant", "Hello! How can I help?"), _msg("user", USER)]
    taking_up = relational_features(history, [_msg("assistant", "I'm sorry you feel awful about the Biology exam. "
                                                                 "You could retake it.")])
    # Content words of the question ("should", "what" are stop words): failed, biology, exam, monday, feel,
    # awful (6); the reply has biology, exam, feel, awful -> 4/6. Named details: biology, monday -> 1/2.
    # Feeling stems: awful -> 1.
    assert taking_up["rel_answer_overlap"] == pytest.approx(4 / 6)
    assert taking_up["rel_detail_overlap"] == pytest.approx(0.5)
    assert taking_up["rel_feeling_echo"] == 1.0
    assert taking_up["rel_question_asked"] == 1.0 and taking_up["rel_question_answered"] == 1.0
    ignoring = relational_features(history, [_msg("assistant", "Do you like cats?")])
    assert ignoring["rel_answer_overlap"] == 0 and ignoring["rel_detail_overlap"] == 0
    assert ignoring["rel_feeling_echo"] == 0 and ignoring["rel_question_answered"] == 0
    assert ignoring["rel_question_ratio"] == 0  # one question each
    assert ignoring["rel_length_ratio"] < taking_up["rel_length_ratio"]
    assert set(relational_features([], [_msg("assistant", "Hi")])) == set(RELATIONAL_COLUMNS)


def test_every_way_into_a_model_gets_the_same_relational_columns():
    messages = [Message("user", USER), Message("assistant", "Sorry about the Biology exam; what happened?"),
                Message("user", "I froze."), Message("assistant", "Freezing is common.")]
    conv = Conversation("c1", "r1", messages, {})
    ratings = pd.DataFrame({"conversation_id": ["c1", "c1"], "turn_index": pd.array([1, 3], dtype="Int64"),
                            "rater_id": ["r1", "r1"], "dimension": [TAXONOMY.controls[0]] * 2, "rating": [4, 3]})
    X, _ = build_items(RatingData({("c1", "r1"): conv}, ratings, pd.DataFrame(index=pd.Index([], name="rater_id"))),
                       TAXONOMY)
    tasks = [{"conversation_id": "c1", "rater_id": "r1", "turn_index": t, "position": f"Response {k} of 2",
              "history": [{"role": m.role, "content": m.content} for m in messages[:t]],
              "turn": [{"role": "assistant", "content": messages[t].content}]} for k, t in ((1, 1), (2, 3))]
    trained = relational_columns(X)
    served = relational_columns(task_columns(tasks, {}, TAXONOMY))
    jury = relational_columns(transcript_columns([conv], TAXONOMY))
    as_messages = [_msg(m.role, m.content) for m in messages]
    direct = [relational_features(as_messages[:t], [as_messages[t]]) for t in (1, 3)]
    for name in RELATIONAL_COLUMNS:
        assert trained[name].tolist() == served[name].tolist() == jury[name].tolist() == [d[name] for d in direct]
    assert trained["rel_detail_overlap"][0] == 1 / 2 and trained["rel_question_asked"].tolist() == [1.0, 0.0]


def test_a_whole_conversation_item_answers_every_message():
    history = "user: I lost my dog Rex.\nuser: He was twelve."
    out = relational_columns({"text": ["Rex sounds lovely."], "history_text": [history], "turn_position": [0.0]})
    assert out["rel_detail_overlap"][0] == 1.0  # "Rex" is in the first of the answered messages
    one_turn = relational_columns({"text": ["Rex sounds lovely."], "history_text": [history], "turn_position": [2.0]})
    assert one_turn["rel_detail_overlap"][0] == 0.0  # only the last message ("He was twelve.") is answered


def test_item_features_use_them_only_when_weighted():
    X = pd.DataFrame({"n_turns": [2.0, 2.0], "turn_position": [1.0, 2.0], "text": ["your exam", "hi"],
                      "history_text": ["user: my exam went badly", "user: my exam went badly"]})
    off = ItemFeatures(text_features="none").fit(X)
    on = ItemFeatures(text_features="none", relational_weight=0.3, context_weight=0.1).fit(X)
    extra = on.dense_features(X).shape[1] - off.dense_features(X).shape[1]
    assert extra == len(RELATIONAL_COLUMNS)
    # In the design matrix the dense block is multiplied by context_weight: the column ends up x 0.3.
    design = on.transform(X).toarray()
    first = off.dense_features(X).shape[1]
    # rel_answer_overlap: "exam" of (exam, went, badly) -> 1/3, times 0.3.
    assert design[:, first].tolist() == pytest.approx([0.1, 0.0])


class _Apology(TextEncoder):
    def transform(self, texts):
        return np.array([[float("sorry" in t.lower())] for t in texts])


def test_a_text_encoder_adds_its_columns_after_the_ngrams():
    X = pd.DataFrame({"n_turns": [2.0] * 4, "turn_position": [1.0] * 4, "history_text": [""] * 4,
                      "text": ["so sorry", "ok then", "sorry again", "ok sorry"]})
    plain = ItemFeatures().fit(X)
    encoded = ItemFeatures(text_encoder=_Apology()).fit(X)
    a, b = plain.transform(X).toarray(), encoded.transform(X).toarray()
    assert b.shape[1] == a.shape[1] + 1 and np.array_equal(b[:, :-1], a)
    assert (b[:, -1] > 0).tolist() == [True, False, True, True]


def test_the_relational_weight_chosen_by_inner_cv_is_a_fixed_weight_refitted():
    """relational_weight="cv" picks one of RELATIONAL_WEIGHTS on the training rows; the fitted model is then
    exactly the model fitted with that weight (the features are linear in it), and it is the candidate whose
    out-of-fold error is least (checked against each candidate's own inner-CV error)."""
    from sense7.synthetic.synth import generate
    from sense7.model import GenericRater, PersonalizedRater
    from sense7.model.estimators import RELATIONAL_WEIGHTS

    synth = generate(40, 8, seed=5, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    chosen = GenericRater(relational_weight="cv", text_encoder=None).fit(X, Y)
    assert chosen.relational_weight_ in RELATIONAL_WEIGHTS
    fixed = GenericRater(relational_weight=chosen.relational_weight_ or 1e-12, text_encoder=None).fit(X, Y)
    np.testing.assert_allclose(chosen.predict_expected(X), fixed.predict_expected(X), atol=1e-4)

    errors = {w: out_of_fold_error(GenericRater(relational_weight=w or 1e-12, text_encoder=None), X, Y)
              for w in RELATIONAL_WEIGHTS}
    assert errors[chosen.relational_weight_] == pytest.approx(min(errors.values()), rel=1e-3)
    personalized = PersonalizedRater(relational_weight="cv", text_encoder=None).fit(X, Y)
    assert personalized.relational_weight_ in RELATIONAL_WEIGHTS
    assert personalized.features_.relational_scale() == personalized.relational_weight_


def test_a_relational_weight_chosen_as_zero_still_predicts(monkeypatch):
    """The columns stay in the design matrix at scale 0 (the fitted coefficients' layout is kept)."""
    from sense7.synthetic.synth import generate
    from sense7.model import GenericRater, estimators

    monkeypatch.setattr(estimators, "RELATIONAL_WEIGHTS", (0.0,))
    synth = generate(30, 6, seed=2, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    model = GenericRater(relational_weight="cv", text_encoder=None).fit(X, Y)
    assert model.relational_weight_ == 0.0
    plain = GenericRater(relational_weight=0.0, text_encoder=None).fit(X, Y)
    np.testing.assert_allclose(model.predict_expected(X), plain.predict_expected(X), atol=1e-4)


class _Cues(TextEncoder):
    """Dense columns that carry part of the planted signal (a stand-in for embeddings)."""

    def transform(self, texts):
        return np.array([[len(t.split()) / 20.0, float("sorry" in t.lower()), float("?" in t)] for t in texts])


def test_the_encoder_weight_chosen_by_inner_cv_is_a_fixed_weight_refitted():
    """encoder_weight="cv" picks one of ENCODER_WEIGHTS on the training rows (jointly with the relational
    scale); the fitted model is exactly the model fitted with that weight, it is the candidate whose
    out-of-fold error is least, and weight 0 is the n-gram model (the encoder's columns at 0)."""
    from sense7.synthetic.synth import generate
    from sense7.model import GenericRater, PersonalizedRater
    from sense7.model.estimators import ENCODER_WEIGHTS

    synth = generate(40, 8, seed=5, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    chosen = GenericRater(encoder_weight="cv", text_encoder=_Cues()).fit(X, Y)
    assert chosen.encoder_weight_ in ENCODER_WEIGHTS
    fixed = GenericRater(encoder_weight=chosen.encoder_weight_, text_encoder=_Cues()).fit(X, Y)
    np.testing.assert_allclose(chosen.predict_expected(X), fixed.predict_expected(X), atol=1e-4)

    errors = {w: out_of_fold_error(GenericRater(encoder_weight=w, text_encoder=_Cues()), X, Y)
              for w in ENCODER_WEIGHTS}
    assert errors[chosen.encoder_weight_] == pytest.approx(min(errors.values()), rel=1e-3)
    assert len({round(e, 6) for e in errors.values()}) == len(ENCODER_WEIGHTS)  # the weight matters
    ngrams = GenericRater(text_encoder=None).fit(X, Y)
    off = GenericRater(encoder_weight=0.0, text_encoder=_Cues()).fit(X, Y)
    np.testing.assert_allclose(off.predict_expected(X), ngrams.predict_expected(X), atol=1e-4)
    both = PersonalizedRater(encoder_weight="cv", relational_weight="cv", text_encoder=_Cues()).fit(X, Y)
    assert both.encoder_weight_ in ENCODER_WEIGHTS and both.relational_weight_ in (0.0, 0.3, 1.0)
    assert both.features_.encoder_scale_ == both.encoder_weight_


def _near_duplicate_items(n: int, seed: int) -> dict[str, list]:
    """Item columns whose texts repeat, share long beginnings and ends, and often have the same length:
    what a cache keyed by less than the whole text would confuse."""
    rng = np.random.default_rng(seed)
    starts = ["I'm so sorry to hear that about your", "That sounds really hard, how are you feeling about your"]
    topics = ["exam", "dog", "mother", "job", "move", "Biology exam on Monday", "trip to Paris", "loan of 300"]
    feelings = ["sad", "angry", "glad", "worried", "lonely", "proud", "tired", "fine"]
    ends = ["?", ".", "!", ". What happened?", ". Did you tell Anna?"]

    def sentence():
        return f"{rng.choice(starts)} {rng.choice(topics)}; I feel {rng.choice(feelings)}{rng.choice(ends)}"

    columns = {"text": [], "history_text": [], "turn_position": []}
    for _ in range(n):
        history = [f"{rng.choice(['user', 'assistant'])}: {sentence()}" for _ in range(rng.integers(0, 4))]
        columns["text"].append(sentence() if rng.random() < 0.8 else "\n".join([sentence(), sentence()]))
        columns["history_text"].append("\n".join(history))
        columns["turn_position"].append(float(rng.choice([0, 1, 2, 3])))  # 0: a whole-conversation item
    return columns


def test_relational_columns_from_the_kept_words_equal_a_fresh_computation():
    """The relational columns are computed through per-text caches (sense7.data.items keeps each text's words,
    a history's tail words and messages): over a few hundred items with repeated and near-duplicate texts,
    computed in bulk, again, and in another order, every value must equal the item computed alone with empty
    caches, so a cache entry read for the wrong text (a stale or wrongly keyed entry) fails here."""
    columns = _near_duplicate_items(400, seed=3)
    fresh = []
    for i in range(len(columns["text"])):
        forget_kept_words()
        one = relational_columns({name: values[i:i + 1] for name, values in columns.items()})
        fresh.append([one[name][0] for name in RELATIONAL_COLUMNS])
    fresh = np.array(fresh)
    assert len(set(columns["text"])) < len(columns["text"])  # (texts do repeat: the caches are hit)
    assert np.ptp(fresh, axis=0).min() > 0  # (every column varies: each is checked)
    forget_kept_words()
    order = np.random.default_rng(4).permutation(len(fresh))
    for rows in (np.arange(len(fresh)), np.arange(len(fresh)), order):  # cold, warm, warm in another order
        cached = relational_columns({name: [values[i] for i in rows] for name, values in columns.items()})
        got = np.column_stack([cached[name] for name in RELATIONAL_COLUMNS])
        np.testing.assert_array_equal(got, fresh[rows])
