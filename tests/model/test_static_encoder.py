"""The static text encoder: static token embeddings distilled from a BERT model (sense7.model.static_embeddings).

Most tests distil a tiny BERT made here (random weights, a 40-token WordPiece vocabulary: built in
milliseconds); the packaged MiniLM's table (made by ./run setup) is checked for meaning and for running
without any network."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone

from sense7.model import static_embeddings
from sense7.model.static_embeddings import StaticEmbeddingEncoder, bert_forward, distill_table
from tests.support.tiny_bert import VOCAB, tiny_model

@pytest.fixture
def tiny(tmp_path):
    # The process keeps tables by their content key, and every test's tiny model has the same content: each
    # test starts from its own empty cache folder and an empty process cache.
    static_embeddings._tables.clear()
    return tiny_model(tmp_path / "model"), tmp_path / "cache"


def _encoder(tiny, **params) -> StaticEmbeddingEncoder:
    model, cache = tiny
    return StaticEmbeddingEncoder(model_path=str(model), cache_dir=str(cache), dimensions=4, **params)


def test_the_forward_pass_attends_over_every_position():
    """bert_forward against a direct computation for a one-token input (attention over one position is
    the identity on its value), so the layer wiring is checked, not only shapes."""
    rng = np.random.default_rng(1)
    folder_weights = {}
    hidden = 4
    for name, shape in (("embeddings.word_embeddings.weight", (5, hidden)), ("embeddings.position_embeddings.weight", (3, hidden)),
                        ("embeddings.token_type_embeddings.weight", (2, hidden))):
        folder_weights[name] = rng.normal(size=shape).astype(np.float32)
    folder_weights["embeddings.LayerNorm.weight"] = np.ones(hidden, np.float32)
    folder_weights["embeddings.LayerNorm.bias"] = np.zeros(hidden, np.float32)
    p = "encoder.layer.0."
    for name, shape in (("attention.self.query", (hidden, hidden)), ("attention.self.key", (hidden, hidden)),
                        ("attention.self.value", (hidden, hidden)), ("attention.output.dense", (hidden, hidden)),
                        ("intermediate.dense", (6, hidden)), ("output.dense", (hidden, 6))):
        folder_weights[p + name + ".weight"] = rng.normal(size=shape).astype(np.float32)
        folder_weights[p + name + ".bias"] = rng.normal(size=shape[0]).astype(np.float32)
    for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
        folder_weights[p + norm + ".weight"] = np.ones(hidden, np.float32)
        folder_weights[p + norm + ".bias"] = np.zeros(hidden, np.float32)
    config = {"num_attention_heads": 2, "num_hidden_layers": 1}
    got = bert_forward(folder_weights, config, np.array([[3]]))[0, 0]

    def norm(v):
        return (v - v.mean()) / np.sqrt(v.var() + 1e-12)

    def gelu(v):
        from scipy.special import erf
        return 0.5 * v * (1 + erf(v / np.sqrt(2)))

    w = folder_weights
    x = norm(w["embeddings.word_embeddings.weight"][3] + w["embeddings.position_embeddings.weight"][0]
             + w["embeddings.token_type_embeddings.weight"][0])
    value = w[p + "attention.self.value.weight"] @ x + w[p + "attention.self.value.bias"]
    x = norm(w[p + "attention.output.dense.weight"] @ value + w[p + "attention.output.dense.bias"] + x)
    inner = gelu(w[p + "intermediate.dense.weight"] @ x + w[p + "intermediate.dense.bias"])
    want = norm(w[p + "output.dense.weight"] @ inner + w[p + "output.dense.bias"] + x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_batch_is_each_sequence_computed_alone(tiny):
    """The dense layers multiply a whole batch at once (one matrix product): each sequence's states must be
    what it gives alone, position by position, so no row or position is mixed with another's."""
    from safetensors.numpy import load_file

    model, _ = tiny
    weights = load_file(str(model / "model.safetensors"))
    config = json.loads((model / "config.json").read_text())
    ids = np.random.default_rng(3).integers(0, len(VOCAB), size=(5, 4))
    together = bert_forward(weights, config, ids)
    alone = np.concatenate([bert_forward(weights, config, row[None, :]) for row in ids])
    assert together.shape == (5, 4, 8)
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
    assert not np.allclose(together[:, 0], together[:, 1])  # the positions differ: a real check


def test_encoding_is_deterministic_and_handles_empty_and_unknown_text(tiny):
    texts = ["I feel so sad, my dog died.", "", None, "zzz qqq", "the market rose today", "SAD sad"]
    first = _encoder(tiny).fit(texts).transform(texts)
    static_embeddings._tables.clear()  # read back from the cache file: the same numbers
    second = _encoder(tiny).fit([]).transform(texts)
    np.testing.assert_array_equal(first, second)
    assert first.shape == (6, 4) and first.dtype == np.float32
    np.testing.assert_array_equal(first[1], 0)  # empty
    np.testing.assert_array_equal(first[2], 0)  # missing
    assert np.abs(first[3]).sum() > 0  # unknown words are [UNK], a token of the vocabulary like any other
    np.testing.assert_allclose(np.linalg.norm(first[[0, 3, 4, 5]], axis=1), 1, rtol=1e-5)
    # A text's vector is the normalised weighted mean of its tokens' rows: "SAD sad" is the row of "sad".
    table = _encoder(tiny).table().astype(np.float32)
    row = table[VOCAB.index("sad")]
    np.testing.assert_allclose(first[5], row / np.linalg.norm(row), rtol=1e-5)


def test_the_table_is_the_distilled_rows_projected_and_weighted(tiny):
    model, _ = tiny
    table = distill_table(model, dimensions=0, sif_coefficient=0).astype(np.float32)
    assert table.shape == (len(VOCAB), 8)
    # Without projection or weights, a row is the centred mean output of [CLS] token [SEP].
    from safetensors.numpy import load_file
    weights = load_file(str(model / "model.safetensors"))
    config = json.loads((model / "config.json").read_text())
    out = bert_forward(weights, config, np.array([[2, t, 3] for t in range(len(VOCAB))])).mean(axis=1)
    centred = out - out.mean(axis=0)
    # (the SVD rotates the basis: compare distances, which a rotation keeps)
    np.testing.assert_allclose(table @ table.T, centred @ centred.T, rtol=0, atol=2e-2)
    weighted = distill_table(model, dimensions=4, sif_coefficient=1e-2).astype(np.float32)
    assert weighted.shape == (len(VOCAB), 4)
    # SIF: a frequent (early) token's row is shrunk more than a rare (late) one's.
    ratio = np.linalg.norm(weighted, axis=1) / np.maximum(np.linalg.norm(table[:, :4], axis=1), 1e-6)
    assert ratio[5] < ratio[-2]


def test_the_table_is_rebuilt_when_its_source_changes(tiny):
    model, cache = tiny
    encoder = _encoder(tiny).fit([])
    before = encoder.transform(["sad dog"])
    files = sorted(cache.glob("static-*.npz"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o644"
    fitted = pickle.loads(pickle.dumps(encoder))  # a saved model keeps the key, not the table
    assert len(pickle.dumps(encoder)) < 2000  # (the table itself is 40 x 4 float16 here, 40,000 x 256 for real)
    tiny_model(model, seed=1)  # new weights in the same folder
    after = _encoder(tiny).fit([]).transform(["sad dog"])
    assert len(sorted(cache.glob("static-*.npz"))) == 2  # a new key, a new table
    assert not np.allclose(before, after)
    with pytest.raises(ValueError, match="retrain"):
        fitted.transform(["sad dog"])  # fitted with the old table: refuses to serve different numbers
    # Another parameter is another table, too.
    _encoder(tiny, sif_coefficient=0.5).fit([])
    assert len(sorted(cache.glob("static-*.npz"))) == 3


def test_a_cache_file_with_another_key_or_garbage_is_rebuilt(tiny):
    encoder = _encoder(tiny)
    path = encoder.table_path()
    path.parent.mkdir(parents=True)
    np.savez(path, key=np.array("someone-else"), table=np.ones((len(VOCAB), 4), np.float16))
    got = encoder.fit([]).table()
    assert not np.allclose(got, 1)
    static_embeddings._tables.clear()
    path.write_bytes(b"not a table")
    np.testing.assert_array_equal(_encoder(tiny).fit([]).table(), got)
    with np.load(path) as stored:  # rewritten
        assert str(stored["key"]) == encoder.table_key()


def test_a_missing_model_file_is_named(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        StaticEmbeddingEncoder(model_path=str(tmp_path / "model"), cache_dir=str(tmp_path)).fit([])


def test_the_encoder_is_an_sklearn_estimator(tiny):
    encoder = _encoder(tiny)
    copy = clone(encoder)
    assert copy.get_params() == encoder.get_params()
    assert not hasattr(copy, "table_key_")


# -- the packaged model (./run setup installs the weights and makes the table) -----------------------------

# slow: the packaged table is made on its first use in an installation (minutes of CPU)
@pytest.mark.slow
def test_the_packaged_table_sees_meaning_not_words():
    encoder = StaticEmbeddingEncoder().fit([])
    v = encoder.transform(["I am so sad, my dog died last week.", "I feel unhappy since my pet passed away.",
                           "The stock market rose three percent today.", "Shares climbed on Wall Street."])
    similar = v @ v.T
    # No word in common, yet the two griefs are closer to each other than to the markets, and vice versa.
    assert similar[0, 1] > max(similar[0, 2], similar[0, 3], similar[1, 2], similar[1, 3]) + 0.2
    assert similar[2, 3] > max(similar[1, 3], similar[0, 3])
    assert v.shape[1] == 256


@pytest.mark.slow  # the packaged table, in a process of its own
def test_the_packaged_encoder_runs_without_any_network(tmp_path):
    """In a fresh process with the Hugging Face libraries told they are offline and no route out (proxies
    pointing nowhere), the table is read and texts encoded; no hub client is even imported."""
    code = ("import sys; from sense7.model.static_embeddings import StaticEmbeddingEncoder;"
            "v = StaticEmbeddingEncoder().fit([]).transform(['so sorry to hear that', '']);"
            "assert v.shape == (2, 256) and abs(v[1]).sum() == 0;"
            "print('huggingface_hub' in sys.modules)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HTTP_PROXY": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_chunked_tokens_equal_the_tokenizers_own(tiny):
    """transform tokenizes each whitespace-separated chunk once per process: the tokens must be those of
    the tokenizer run on the whole text, whitespace of any kind and punctuation included."""
    encoder = _encoder(tiny).fit([])
    texts = ["I feel so SAD, my dog died.", "  you\\tare\\n\\nglad!! ", "", "the stock-market rose today...",
             "sad", "zzz dogs feeling", "i.e. a dog's day"]
    rows, ids = encoder._token_rows(texts)
    whole = encoder.token_ids(texts)
    for i, expected in enumerate(whole):
        assert ids[rows == i].tolist() == expected
    rows, ids = encoder._token_rows(texts)  # the second time from the chunk cache: the same
    assert [ids[rows == i].tolist() for i in range(len(texts))] == whole


def test_line_pooling_averages_each_lines_unit_vector(tiny):
    """pooling="lines" (issue 39): a text's vector is the unit-length mean of its lines' own unit vectors (the
    k-th line from the end weighted line_decay ** k), so a long line does not outweigh short ones; blank lines
    are skipped, a one-line text is encoded as by whole-text pooling, and its vectors are cached apart."""
    long_line = "i feel so sad my dog died today and the news is hard"
    texts = [f"{long_line}\nglad\n\n", "sorry to hear that", "", "  \n "]
    whole = _encoder(tiny).fit([])
    lines = _encoder(tiny, pooling="lines").fit([])
    got = lines.transform(texts)
    a, b = whole.transform([long_line, "glad"])
    want = (a + b) / np.linalg.norm(a + b)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    # Pooling the whole text weighs the long line by its tokens: not the same vector.
    assert not np.allclose(whole.transform(texts[:1])[0], got[0], atol=1e-3)
    np.testing.assert_allclose(got[1], whole.transform(texts[1:2])[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2:], 0)  # no line with text: zeros
    # Recency: the last line weighs 1, the one before it 0.5.
    recent = _encoder(tiny, pooling="lines", line_decay=0.5).fit([]).transform(texts[:1])[0]
    np.testing.assert_allclose(recent, (0.5 * a + b) / np.linalg.norm(0.5 * a + b), rtol=1e-5, atol=1e-6)
    # A batch pools each text on its own (the sums are grouped by text, whatever else is in the batch).
    np.testing.assert_allclose(lines.transform(texts[::-1])[::-1], got, rtol=1e-5, atol=1e-6)
    # Another pooling is other vectors: the text vectors' cache must not mix them; the table is the same.
    assert len({whole.cache_key(), lines.cache_key(),
                _encoder(tiny, pooling="lines", line_decay=0.5).cache_key()}) == 3
    assert whole.table_key() == lines.table_key()
    assert clone(lines).get_params()["pooling"] == "lines"
    with pytest.raises(ValueError, match="pooling"):
        _encoder(tiny, pooling="sentences").fit([])
    with pytest.raises(ValueError, match="line_decay"):
        _encoder(tiny, pooling="lines", line_decay=0).fit([])
