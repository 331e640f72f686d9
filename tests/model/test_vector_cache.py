"""Embed once (sense7.model.vector_cache, the store's text_vectors): a text's vector is computed once per encoder
and read by every process. The encoder is the real static encoder over a tiny BERT made here
(tests/support/tiny_bert.py), subclassed to count the texts it embeds (no mock)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sense7.data.items import build_items, task_columns
from sense7.labelstudio.importer import plan_tasks
from sense7.model.bundle import train_bundle
from sense7.model.vector_cache import (CachedTextEncoder, VectorCache, embed_stored_conversations, embed_texts,
                                       encoder_key, with_vector_cache)
from sense7.store.database import Store
from sense7.store.text_vectors import TextVectorRows
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy
from tests.support.tiny_bert import CountingEncoder, counting_encoders

TAXONOMY = load_taxonomy()
REPO = Path(__file__).resolve().parents[2]
TEXTS = ["the dog died", "so sad", "the dog died", "how are you", "", "my stock rose today"]


@pytest.fixture
def make_encoder(tmp_path):
    return counting_encoders(tmp_path)


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'store.sqlite'}")


def test_vectors_of_one_text_never_collide_across_encoders(make_encoder, store):
    """Two encoders of the same width (other weights) and one of another width: three keys, each reads only
    its own vectors, so the second encoder computes every text although the first stored them all."""
    first, other_weights, other_width = make_encoder(0), make_encoder(1), make_encoder(0, dimensions=3)
    keys = {encoder_key(e.fit([])) for e in (first, other_weights, other_width)}
    assert len(keys) == 3
    cache = VectorCache.of_store(store)
    a = CachedTextEncoder(first, cache).fit_transform(TEXTS)
    CountingEncoder.embedded.clear()
    b = CachedTextEncoder(other_weights, cache).fit_transform(TEXTS)
    assert sorted(CountingEncoder.embedded) == sorted(set(TEXTS))  # nothing of the first encoder's was read
    np.testing.assert_allclose(b, other_weights.fit([]).transform(TEXTS), atol=2e-3)
    assert not np.allclose(a[:2], b[:2], atol=1e-2)
    c = CachedTextEncoder(other_width, cache).fit_transform(TEXTS)
    assert c.shape == (len(TEXTS), 3)
    assert TextVectorRows(store.engine).count() == 3 * len(set(TEXTS))


def test_a_second_transform_computes_nothing_and_a_restarted_cache_reads_the_store(make_encoder, store):
    encoder = CachedTextEncoder(make_encoder(), VectorCache.of_store(store))
    first = encoder.fit_transform(TEXTS)
    assert sorted(CountingEncoder.embedded) == sorted(set(TEXTS))  # each distinct text once
    CountingEncoder.embedded.clear()
    np.testing.assert_array_equal(encoder.transform(TEXTS[::-1]), first[::-1])
    # A fresh cache over the same store (this process's memory empty): read, not computed.
    encoder.cache = VectorCache.of_store(store)
    np.testing.assert_array_equal(encoder.transform(TEXTS), first)
    assert CountingEncoder.embedded == []
    # Without a cache every call computes (what the cache saves).
    uncached = CachedTextEncoder(make_encoder()).fit(TEXTS)
    uncached.transform(TEXTS)
    uncached.transform(TEXTS)
    assert len(CountingEncoder.embedded) == 2 * len(set(TEXTS))


def test_a_restarted_process_reads_the_vectors_from_the_store(make_encoder, store, tmp_path):
    encoder = make_encoder()
    expected = CachedTextEncoder(encoder, VectorCache.of_store(store)).fit_transform(TEXTS)
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from sense7.model.static_embeddings import StaticEmbeddingEncoder
        from sense7.model.vector_cache import CachedTextEncoder, VectorCache
        from sense7.store.database import Store

        embedded = []
        class Counting(StaticEmbeddingEncoder):
            def transform(self, texts):
                embedded.extend(texts)
                return super().transform(texts)

        encoder = Counting(model_path={encoder.model_path!r}, cache_dir={encoder.cache_dir!r}, dimensions=4)
        cached = CachedTextEncoder(encoder, VectorCache.of_store(Store({store.engine.url.render_as_string(False)!r})))
        vectors = cached.fit_transform(json.loads(sys.argv[1]))
        print(json.dumps({{"embedded": embedded, "vectors": vectors.tolist()}}))
    """)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(TEXTS)], capture_output=True, text=True,
                          cwd=REPO, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["embedded"] == []
    np.testing.assert_array_equal(np.array(answer["vectors"], dtype=np.float32), expected)


def test_a_fitted_model_pickles_without_its_cache_and_reads_it_again_once_given(make_encoder, store):
    study = generate(12, 4, seed=3, taxonomy=TAXONOMY)
    params = {"text_encoder": CachedTextEncoder(make_encoder(), VectorCache.of_store(store)), "relational_weight": 1.0}
    bundle = train_bundle(study.rating_data(), "v1", TAXONOMY, personalized_params=params)
    X, _ = build_items(study.rating_data(), TAXONOMY)
    before = bundle.predict_items(X)
    loaded = pickle.loads(pickle.dumps(bundle))
    encoder = loaded.personalized.features_.vectorizers_["encoder"]
    assert isinstance(encoder, CachedTextEncoder) and encoder.cache is None
    CountingEncoder.embedded.clear()
    after = with_vector_cache(loaded, VectorCache.of_store(store)).predict_items(X)
    assert CountingEncoder.embedded == []  # every text was embedded when the model was fitted
    for b, a in zip(before, after):
        for control in b.controls:
            np.testing.assert_allclose(b.controls[control].probs, a.controls[control].probs, atol=1e-9)


def _served_columns(study, store):
    tasks = plan_tasks(study.conversations)
    datas = [t["data"] for t in tasks]
    contexts = store.contexts_for((str(d["conversation_id"]), str(d["rater_id"])) for d in datas)
    return task_columns(datas, contexts, TAXONOMY)


def test_served_texts_without_vectors_are_answered_lexically_and_say_so_until_embedded(make_encoder, store, tmp_path):
    """With no time to embed (budget 0), a served prediction reads no vectors ("lexical") and is not kept; once
    the embed job's work has run, the same items read their vectors ("embedded") and equal the reference."""
    study = generate(12, 4, seed=3, taxonomy=TAXONOMY)
    bundle = train_bundle(study.rating_data(), "v1", TAXONOMY,
                          personalized_params={"text_encoder": make_encoder(), "relational_weight": 1.0})
    store.upsert_conversations(study.conversations)
    columns = _served_columns(study, store)
    reference = pickle.loads(pickle.dumps(bundle)).compile()  # computes every vector itself
    served = with_vector_cache(bundle, VectorCache.of_store(store), on_demand_seconds=0.0).compile()
    nobody = served.rater_table(study.raters.drop(columns=["email"]).set_index("rater_id").iloc[:0])
    lexical = served.predict(columns, nobody)
    assert set(lexical.text_vectors()) == {"lexical"}
    assert not np.allclose(lexical.probs, reference.predict(columns, nobody).probs, atol=1e-6)
    CountingEncoder.embedded.clear()
    done = embed_stored_conversations(store, [(bundle.personalized.features_.vectorizers_["encoder"].encoder_, 300)])
    assert [v["embedded"] for v in done.values()] == [len(set(CountingEncoder.embedded))]
    CountingEncoder.embedded.clear()
    embedded = served.predict(columns, nobody)
    assert CountingEncoder.embedded == []
    assert set(embedded.text_vectors()) == {"embedded"}
    np.testing.assert_allclose(embedded.probs, reference.predict(columns, nobody).probs, atol=1e-3)
    # The job again: every text is there already, nothing is computed.
    again = embed_stored_conversations(store, [(bundle.personalized.features_.vectorizers_["encoder"].encoder_, 300)])
    assert [v["embedded"] for v in again.values()] == [0] and CountingEncoder.embedded == []


def test_embed_texts_computes_only_missing_texts(make_encoder, store):
    encoder = make_encoder().fit([])
    cache = VectorCache.of_store(store)
    assert embed_texts(encoder, TEXTS[:2], cache)["embedded"] == 2
    assert embed_texts(encoder, TEXTS, cache)["embedded"] == len(set(TEXTS)) - 2
    assert TextVectorRows(store.engine).count(encoder_key(encoder)) == len(set(TEXTS))
