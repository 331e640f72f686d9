"""The cheaper computations of a served /predict (issue 23, "The backend got slower") equal their reference
definitions exactly: the n-gram cells by token look-up (both look-up tables) against `analyze`, the presence
cells against the distinct cells, the ordinal link against the padded differences it replaced, and the task
check against every malformed task it must keep refusing with the same message."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit

from sense7.labelstudio.protocol import task_problem
from sense7.model.ordinal import cumulative_logit_proba
from sense7.model.text import BulkNgramVectorizer

TRAIN = ["That sounds really hard.", "What would help?", "I see. That sounds hard!", "Max is sick; that's hard",
         "", "what WOULD help, Max?", "Ünïcödé ÇAFÉ straße"]
# Past 0xD800 tokens a token's id is no longer one UTF-16 unit: the look-up falls back to integer ids.
MANY = [" ".join(f"w{i}" for i in range(start, start + 2000)) for start in range(0, 56_000, 2000)]


def _small() -> BulkNgramVectorizer:
    return BulkNgramVectorizer(ngram_max=2, min_df=1).fit(TRAIN)


def _large() -> BulkNgramVectorizer:
    return BulkNgramVectorizer(ngram_max=2, min_df=1).fit(TRAIN + MANY)


@pytest.fixture(scope="module")
def vectorizers():
    small, large = _small(), _large()
    assert small.token_chars_ is not None and large.token_chars_ is None  # both look-ups are exercised
    return small, large


def _reference_cells(vec, docs) -> set:
    vocab = {term: col for col, term in enumerate(vec.vocabulary_)}
    return {(row, vocab[t]) for row, doc in enumerate(docs) for t in vec.analyze(doc) if t in vocab}


DOCS = ["that sounds hard, Max", "w3 w4 w55000 w55001 zzz w55001 w55002", "", "hard\x01that sounds",  # separator
        "Ünïcödé çafé STRASSE straße", "what would help? What WOULD help!", "w0"]


def test_cells_and_present_cells_equal_the_per_document_terms(vectorizers):
    for vec in vectorizers:
        rows, cols = vec.cells(DOCS)
        expected = _reference_cells(vec, DOCS)
        assert set(zip(rows.tolist(), cols.tolist())) == expected
        present_rows, present_cols = vec.present_cells(DOCS)
        pairs = list(zip(present_rows.tolist(), present_cols.tolist()))
        assert pairs == sorted(expected)  # each cell once, sorted by document then column
        assert len(rows) > len(pairs)  # repeats were there to remove (w55001 twice)
    large = vectorizers[1]
    assert {large.vocabulary_[c] for r, c in zip(*large.present_cells(DOCS)) if r == 1} >= {"w55000 w55001", "w4"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("ab \x01.,!ÜŞwW0123456789hard")), max_size=30),
                min_size=0, max_size=5))
def test_present_cells_of_any_text(docs):
    vec = _small()
    assert list(zip(*[a.tolist() for a in vec.present_cells(docs)])) == sorted(_reference_cells(vec, docs))


def _padded_differences(thresholds, scale, scores):
    """The link as it was written before (np.diff of (0, cum..., 1), np.clip)."""
    scores = np.asarray(scores, dtype=float)
    cum = expit((np.asarray(thresholds, dtype=float) - scores[..., None]) / np.asarray(scale, dtype=float)[..., None])
    edge = np.zeros(cum.shape[:-1] + (1,))
    probs = np.clip(np.diff(np.concatenate([edge, cum, edge + 1.0], axis=-1), axis=-1), 1e-9, None)
    return probs / probs.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("levels", [1, 2, 5, 7])
def test_the_ordinal_link_equals_the_padded_differences_bit_for_bit(levels):
    rng = np.random.default_rng(levels)
    thresholds = np.sort(rng.normal(size=(8, levels - 1)), axis=1)
    scale = rng.uniform(0.2, 3.0, size=8)
    scores = np.concatenate([rng.normal(scale=4.0, size=(50, 8)), [[np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300,
                                                                      -1e300, 40.0]]])
    got, expected = cumulative_logit_proba(thresholds, scale, scores), _padded_differences(thresholds, scale, scores)
    assert got.shape == expected.shape == (51, 8, levels)
    assert np.array_equal(got, expected, equal_nan=True)
    one = cumulative_logit_proba(thresholds[0], scale[0], scores[:, 0])  # one link, (n,) scores
    assert np.array_equal(one, _padded_differences(thresholds[0], scale[0], scores[:, 0]), equal_nan=True)


GOOD = {"data": {"conversation_id": "c1", "turn_index": 2, "rater_id": "r1",
                 "turn": [{"role": "assistant", "content": "ok"}],
                 "history": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}}


def _with(**data) -> dict:
    return {"data": {**GOOD["data"], **data}}


class Message(dict):
    pass


@pytest.mark.parametrize("task, problem", [
    ("text", "task is not a JSON object"),
    ({"data": []}, "task has no 'data' object"),
    (_with(rater_id=""), "task data has no 'rater_id'"),
    (_with(turn=[]), "task data has no 'turn'"),
    (_with(turn_index=None), "task data has no 'turn_index'"),
    (_with(rater_id=[1]), "task data 'rater_id' and 'conversation_id' must be strings"),
    (_with(turn_index=True), "task data 'turn_index' must be an integer"),
    (_with(turn=[{"role": "assistant"}]), "task data 'turn' must be a list"),
    (_with(history="hi"), "task data 'history' must be a list"),
    (_with(history=[{"role": "user", "content": "hi"}, "hi"]), "task data 'history' must be a list"),
    (_with(history=[{"role": "user", "content": "hi"}, {"role": "user"}]), "task data 'history' must be a list"),
    (_with(history=[["content"]]), "task data 'history' must be a list"),
    (_with(history=[None]), "task data 'history' must be a list"),
    (GOOD, None),
    (_with(history=[]), None),
    (_with(history=[Message(role="user", content="hi")]), None),  # any dict with a content
    (_with(history=[{"content": 3}]), None),  # the content's type is the reader's business (as before)
])
def test_task_problems_keep_their_messages(task, problem):
    found = task_problem(task)
    assert (found is None) if problem is None else found.startswith(problem), found
