"""Embed once: a text encoder's vectors kept by content hash, so that each distinct text is embedded once per
encoder and every process reads its vector (issue 39 item 1).

- `encoder_key(encoder)`: what names an encoder's vectors: its class, its parameters and, for the shipped
  encoders, the hash of their weights (`cache_key()`: the static table's key, the MiniLM weights' digest). A
  changed encoder gets a new key, so it never reads another's vectors.
- `VectorCache(rows)`: vectors by (encoder key, SHA-256 of the text) in the store's `text_vectors` table
  (`sense7.store.text_vectors.TextVectorRows`; `TextVectorRows.local(path)` for a command without a store), with
  a bounded in-process LRU in front, so that a served request costs dictionary look-ups.
- `CachedTextEncoder(encoder, cache)`: a `TextEncoder` that reads the cache in bulk, computes only the missing
  texts with `encoder` and writes them back. With `on_demand_seconds` (serving) it embeds missing texts for at
  most that long per call; a text still missing then gets zeros, i.e. the model's lexical part answers for it,
  and `transform_known` says which texts had their vector (the backend returns and records it).
- `with_vector_cache(model, cache)`: the same wrapper put around the encoder of an already fitted model or
  bundle (what the ML backend, pre-annotation, live pre-fills and the jury do after loading a version).
- `embed_texts(encoder, texts, cache)`: the job's work (sense7.tasks.embedding): the missing ones computed.

Only encoders whose vector of a text depends on that text alone (pre-trained: the static table, MiniLM, an
LLM scorer) can be cached this way; the n-grams learn their vocabulary from the training texts, and are never
wrapped. Vectors are stored as float16 and every caller gets the stored value back (computed ones too), so a
text's vector is the same whether it was computed in this call or read.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict

import numpy as np
from sklearn.base import clone

from sense7.model.features import text_encoder_named
from sense7.model.text import BulkNgramVectorizer, TextEncoder
from sense7.store.text_vectors import TextVectorRows, text_sha256

MEMORY_VECTORS = 50_000  # vectors an in-process LRU keeps (256 float16 each: ~25 MB)
STORED_DTYPE = "float16"
ON_DEMAND_CHUNK = 16  # texts embedded per step under a time budget (the budget is checked between steps)
EMBEDDED, LEXICAL = "embedded", "lexical"  # what a served prediction read: its texts' vectors, or none (n-grams)


def encoder_key(encoder) -> str:
    """The 64-hex key of an encoder's vectors. An encoder with `cache_key()` names its vectors itself (the
    shipped ones: their weights' hash and the parameters that change a vector); any other is named by its class
    and parameters (so it must learn nothing from texts: see the module's docstring)."""
    if isinstance(encoder, CachedTextEncoder):
        encoder = encoder.encoder
    if encoder is None or isinstance(encoder, BulkNgramVectorizer):
        raise ValueError("the n-grams learn from the training texts: their vectors are not cached by text")
    own = getattr(encoder, "cache_key", None)
    if callable(own):  # (a subclass that changes the vectors overrides cache_key too)
        material = own()
    else:
        material = f"{type(encoder).__module__}.{type(encoder).__qualname__}\n" \
                   f"{sorted(encoder.get_params(deep=False).items())!r}"
    return hashlib.sha256(f"{material}\n{STORED_DTYPE}".encode()).hexdigest()


def _clean(text) -> str:
    return "" if text is None or text != text else str(text)


class VectorCache:
    """Vectors by (encoder key, text hash): an LRU of `memory_vectors` in this process, then `rows` (the store's
    table; None: memory only). A handle on shared storage: sklearn's clone keeps the same cache, and a pickled
    model keeps none (`CachedTextEncoder.__getstate__`)."""

    def __init__(self, rows: TextVectorRows | None = None, memory_vectors: int = MEMORY_VECTORS):
        self.rows = rows
        self.memory_vectors = int(memory_vectors)
        self._memory: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of_store(cls, store, memory_vectors: int = MEMORY_VECTORS) -> "VectorCache":
        """The cache over a `sense7.store.database.Store`'s `text_vectors` table."""
        return cls(TextVectorRows(store.engine), memory_vectors)

    def __deepcopy__(self, memo):
        return self

    def lookup(self, key: str, hashes: list[str]) -> dict[str, np.ndarray]:
        """{hash: vector} of the hashes known here or in the store (the store read once, in bulk)."""
        found, missing = {}, []
        with self._lock:
            for sha in hashes:
                vector = self._memory.get((key, sha))
                if vector is None:
                    missing.append(sha)
                else:
                    self._memory.move_to_end((key, sha))
                    found[sha] = vector
        if missing and self.rows is not None:
            stored = self.rows.vectors(key, missing)
            self._remember(key, stored)
            found.update(stored)
        return found

    def put(self, key: str, vectors: dict[str, np.ndarray]) -> None:
        """Keep vectors (already in the stored dtype) here and in the store."""
        self._remember(key, vectors)
        if self.rows is not None:
            self.rows.add(key, vectors)

    def _remember(self, key: str, vectors: dict) -> None:
        with self._lock:
            for sha, vector in vectors.items():
                self._memory[(key, sha)] = vector
                self._memory.move_to_end((key, sha))
            while len(self._memory) > self.memory_vectors:
                self._memory.popitem(last=False)

    def forget_memory(self) -> None:
        """Empty this process's LRU (the store keeps its rows): what a restarted process starts with."""
        with self._lock:
            self._memory.clear()


class CachedTextEncoder(TextEncoder):
    """`encoder`'s vectors read from `cache` (a VectorCache) by text hash; only the missing ones are computed
    (in one bulk call) and written back. on_demand_seconds: None (training, evaluation, the jury: every missing
    text is computed), or the most a call spends computing missing texts (serving); texts left then get zeros
    (`transform_known` says which). Without a cache it is `encoder` with stored-precision vectors."""

    def __init__(self, encoder=None, cache: VectorCache | None = None, on_demand_seconds: float | None = None):
        self.encoder = encoder
        self.cache = cache
        self.on_demand_seconds = on_demand_seconds

    def fit(self, texts=None, y=None):
        if self.encoder is None:
            raise ValueError("CachedTextEncoder needs an encoder")
        self.encoder_ = clone(self.encoder).fit(texts)
        self.key_ = encoder_key(self.encoder_)
        self.dimension_ = getattr(self.encoder_, "dimension_", None)
        return self

    @classmethod
    def around(cls, fitted, cache: VectorCache | None, on_demand_seconds: float | None = None) -> "CachedTextEncoder":
        """A wrapper of an encoder fitted already (a loaded model's): no refit."""
        wrapped = cls(fitted, cache, on_demand_seconds)
        wrapped.encoder_ = fitted
        wrapped.key_ = encoder_key(fitted)
        wrapped.dimension_ = getattr(fitted, "dimension_", None)
        return wrapped

    def fit_transform(self, texts, y=None):
        texts = list(texts)
        return self.fit(texts).transform(texts)

    def __getstate__(self):
        # A model bundle is pickled into the registry: it never carries a handle on a store or a process's memory.
        state = dict(self.__dict__)
        state["cache"] = None
        return state

    def transform(self, texts) -> np.ndarray:
        return self.transform_known(texts)[0]

    def transform_known(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """((n, dimension) float32 vectors, (n,) bool: the text had its vector, not zeros)."""
        texts = [_clean(t) for t in texts]
        hashes = {t: text_sha256(t) for t in dict.fromkeys(texts)}
        found = self.cache.lookup(self.key_, list(hashes.values())) if self.cache is not None else {}
        missing = [t for t, sha in hashes.items() if sha not in found]
        if missing:
            found.update(self._compute(missing, hashes))
        width = self._width(found)
        out = np.zeros((len(texts), width), dtype=np.float32)
        known = np.zeros(len(texts), dtype=bool)
        for i, text in enumerate(texts):
            vector = found.get(hashes[text])
            if vector is not None:
                out[i] = vector
                known[i] = True
        return out, known

    def missing(self, texts) -> list[str]:
        """The distinct texts of `texts` with no vector in the cache yet (nothing is computed)."""
        hashes = {t: text_sha256(t) for t in dict.fromkeys(_clean(t) for t in texts)}
        found = self.cache.lookup(self.key_, list(hashes.values())) if self.cache is not None else {}
        return [t for t, sha in hashes.items() if sha not in found]

    def _compute(self, texts: list[str], hashes: dict) -> dict[str, np.ndarray]:
        budget = self.on_demand_seconds
        if budget is None:
            return self._embed(texts, hashes)
        deadline = time.monotonic() + float(budget)
        done: dict[str, np.ndarray] = {}
        for start in range(0, len(texts), ON_DEMAND_CHUNK):
            if time.monotonic() >= deadline:
                break  # the rest is served by the lexical part; a later call (or the embed job) embeds it
            done.update(self._embed(texts[start:start + ON_DEMAND_CHUNK], hashes))
        return done

    def _embed(self, texts: list[str], hashes: dict) -> dict[str, np.ndarray]:
        vectors = self.encoder_.transform(texts)
        vectors = vectors.toarray() if hasattr(vectors, "toarray") else np.asarray(vectors)
        stored = {hashes[t]: np.ascontiguousarray(v, dtype=STORED_DTYPE) for t, v in zip(texts, vectors)}
        if self.cache is not None:
            self.cache.put(self.key_, stored)
        return stored

    def _width(self, found: dict) -> int:
        if found:
            return len(next(iter(found.values())))
        if self.dimension_:
            return int(self.dimension_)
        return int(np.asarray(self.encoder_.transform([""])).shape[1])


def embed_texts(encoder, texts, cache: VectorCache) -> dict:
    """Make sure every distinct text of `texts` has `encoder`'s vector in `cache` (a fitted encoder, wrapped or
    not); what is there already is not computed again. Returns {key, texts, embedded, seconds}."""
    fitted = encoder.encoder_ if isinstance(encoder, CachedTextEncoder) else encoder
    wrapped = CachedTextEncoder.around(fitted, cache)  # (every missing text: no time budget)
    started = time.perf_counter()
    distinct = list(dict.fromkeys(_clean(t) for t in texts))
    missing = wrapped.missing(distinct)
    if missing:
        wrapped._compute(missing, {t: text_sha256(t) for t in missing})
    return {"key": wrapped.key_, "texts": len(distinct), "embedded": len(missing),
            "seconds": round(time.perf_counter() - started, 3)}


def fitted_encoders(model) -> list:
    """The fitted ItemFeatures of a model or bundle (a ModelBundle's two estimators, or one estimator)."""
    estimators = [getattr(model, name) for name in ("personalized", "generic") if hasattr(model, name)] or [model]
    seen, out = set(), []
    for estimator in estimators:
        features = getattr(estimator, "features_", None)
        if features is not None and id(features) not in seen:
            seen.add(id(features))
            out.append(features)
    return out


def model_encoder(model):
    """The fitted text encoder (beside the n-grams) of a model or bundle, unwrapped; None with n-grams only."""
    for features in fitted_encoders(model):
        encoder = (getattr(features, "vectorizers_", None) or {}).get("encoder")
        if encoder is not None and not isinstance(encoder, BulkNgramVectorizer):
            return encoder.encoder_ if isinstance(encoder, CachedTextEncoder) else encoder
    return None


def with_vector_cache(model, cache: VectorCache | None, on_demand_seconds: float | None = None):
    """Put `cache` around the fitted text encoder of `model` (a ModelBundle or an estimator), in place, and
    return the model; a model with n-grams only is returned unchanged. Call it before compiling a bundle
    (sense7.model.serving reads the encoder when it compiles)."""
    for features in fitted_encoders(model):
        vectorizers = getattr(features, "vectorizers_", None) or {}
        encoder = vectorizers.get("encoder")
        if encoder is None or isinstance(encoder, BulkNgramVectorizer):
            continue
        if isinstance(encoder, CachedTextEncoder):
            encoder.cache, encoder.on_demand_seconds = cache, on_demand_seconds
        else:
            vectorizers["encoder"] = CachedTextEncoder.around(encoder, cache, on_demand_seconds)
    return model


def cached_encoder(encoder, cache: VectorCache | None):
    """A model's `text_encoder` parameter (None, a name of sense7.model.features.TEXT_ENCODER_NAMES, or an
    encoder) with `cache` around it: what a reader that fits passes (retraining, evaluate). None and "ngrams"
    stay as they are."""
    if encoder is None or cache is None or isinstance(encoder, CachedTextEncoder):
        return encoder
    if isinstance(encoder, str):
        encoder = text_encoder_named(encoder)
        if encoder is None:
            return None
    if isinstance(encoder, BulkNgramVectorizer):
        return encoder
    return CachedTextEncoder(encoder, cache)


EMBED_CHUNK = 2000  # texts embedded and written per step by the embed job (a killed job keeps what it wrote)


def encoders_to_embed(settings, registry) -> list[tuple]:
    """(fitted encoder, history characters) of each text encoder whose vectors the study's processes read: the
    served version's (sense7.model.registry) and the one the next retrain fits (SENSE7_MODEL_TEXT_ENCODER),
    each once. Empty when both are n-grams only."""
    from sense7.data.items import HISTORY_CHARS

    found: dict[str, tuple] = {}
    served = registry.current()
    if served:
        bundle = registry.load(served)
        encoder = model_encoder(bundle)
        if encoder is not None:
            history = min((int(f.history_chars) for f in fitted_encoders(bundle)), default=HISTORY_CHARS)
            found[encoder_key(encoder)] = (encoder, history)
    named = getattr(settings, "model_text_encoder", None)
    encoder = text_encoder_named(named) if named else None
    if encoder is not None:
        encoder.fit([])
        found.setdefault(encoder_key(encoder), (encoder, HISTORY_CHARS))
    return list(found.values())


def embed_stored_conversations(store, encoders: list[tuple], conversation_ids: list[str] | None = None) -> dict:
    """Every text the encoders read for the store's conversations (`conversation_ids`; None: all of them)
    embedded into the store's text vectors, in chunks; texts embedded before are only looked up, so running it
    again (a retried job) computes nothing. Returns {encoder key: {texts, embedded, seconds}}."""
    from sense7.data.items import encoder_texts

    wanted = None if conversation_ids is None else set(map(str, conversation_ids))
    messages = [[{"role": m.role, "content": m.content} for m in msgs]
                for cid, msgs in store.conversations_by_id().items() if wanted is None or cid in wanted]
    cache = VectorCache.of_store(store, memory_vectors=EMBED_CHUNK)
    out = {}
    for encoder, history_chars in encoders:
        texts = list(dict.fromkeys(t for m in messages for t in encoder_texts(m, history_chars)))
        totals = {"texts": len(texts), "embedded": 0, "seconds": 0.0}
        for start in range(0, len(texts), EMBED_CHUNK):
            done = embed_texts(encoder, texts[start:start + EMBED_CHUNK], cache)
            totals["embedded"] += done["embedded"]
            totals["seconds"] = round(totals["seconds"] + done["seconds"], 3)
            key = done["key"]
        if texts:
            out[key] = totals
    return out
