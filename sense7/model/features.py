"""Features of an item that do not depend on who rates it: the turn's text, the recent history, the
conversation context (task type, mood, wanted empathy) and the turn's position.

Everything is learned in `fit` only (vocabularies, imputation means, context categories), so evaluation
folds never see held-out text.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.feature_extraction.text import TfidfVectorizer

from sense7.data.items import HISTORY_CHARS, RELATIONAL_COLUMNS, answered_texts, relational_columns
from sense7.model.text import BulkNgramVectorizer, TextEncoder  # noqa: F401 (TextEncoder: the interface, also here)

TEXT_FEATURE_KINDS = ("tfidf", "tfidf+char", "none")
# With a text encoder and relational_weight > 0: the cosine similarity of the encoded turn with the encoded
# message it answers (sense7.data.items.answered_texts) and with the encoded history tail.
ENCODER_RELATIONAL_COLUMNS = ("rel_encoded_answer_similarity", "rel_encoded_history_similarity")
# The text encoders a model or a command names (`text_encoder="static"`, `--text-encoder static`);
# "ngrams": none beyond the n-grams.
TEXT_ENCODER_NAMES = ("static", "ngrams", "minilm")


def text_encoder_named(name: str):
    """A fresh encoder for one of TEXT_ENCODER_NAMES: "static" (StaticEmbeddingEncoder, distilled from the
    packaged MiniLM), "minilm" (SentenceEmbeddingEncoder, the optional [embeddings] extra), "ngrams" (None)."""
    if name == "static":
        from sense7.model.static_embeddings import StaticEmbeddingEncoder
        return StaticEmbeddingEncoder()
    if name == "minilm":
        from sense7.model.embeddings import SentenceEmbeddingEncoder
        return SentenceEmbeddingEncoder()
    if name in ("ngrams", "none"):
        return None
    raise ValueError(f"unknown text encoder {name!r}; choose one of {', '.join(TEXT_ENCODER_NAMES)}")


def _fresh_encoder(value):
    """A model's text_encoder parameter (None, a name, or an encoder) as a fresh, unfitted encoder or None."""
    if value is None:
        return None
    return text_encoder_named(value) if isinstance(value, str) else clone(value)


class ItemFeatures(TransformerMixin, BaseEstimator):
    """Sparse design matrix from X (the columns of `sense7.data.items.build_items`).

    text_features: "tfidf" (word 1-2 gram presence of the turn, word presence in the history's tail;
    document frequencies from fit), "tfidf+char" (adds character 2-4 grams of the turn: slower, more robust
    to spelling), "none" (context and position only).
    history_chars: how much of the history (its end: what the turn answers) is used.
    context_weight: scale of the context/position columns relative to the text (smaller = more shrinkage).
    context_interactions: add turn words x numeric context answers (off: it overfits on small data).
    text_encoder: an optional extra encoder of the rated turn (the `sense7.model.text.TextEncoder`
    interface, or one of TEXT_ENCODER_NAMES), whose columns join the n-grams: static token embeddings
    (sense7.model.static_embeddings, "static"), sentence embeddings
    (sense7.model.embeddings.SentenceEmbeddingEncoder, "minilm"), or an LLM's scores of the turn. None:
    n-grams only. The compiled serving path scores the n-grams and any encoder whose transform gives a
    dense array directly.
    relational_weight: scale of the relational columns (sense7.data.items.relational_columns: the turn
    against the message it answers, derived from the item columns); 0 leaves them out (and uncomputed);
    "cv": the rater model chooses it on its training rows (RELATIONAL_WEIGHTS, see
    sense7.model.estimators), the features built at scale 1 until it sets `relational_scale_`.
    They join the dense block, so serving (sense7.model.serving) computes them with the same
    `dense_features`. With a text encoder, also ENCODER_RELATIONAL_COLUMNS (the similarity of the encoded
    turn with the encoded message it answers and history), a block after the encoder's, at the same scale.
    encoder_weight: scale of the encoder's block relative to the n-grams (each block has unit typical row
    norm first; a larger weight is a lighter penalty on the encoder's columns); "cv": the rater model
    chooses it on its training rows (ENCODER_WEIGHTS, see sense7.model.estimators), the block built at
    scale 1 until it calls `set_encoder_scale`. The scale is folded into `block_scales_["encoder"]`, so
    serving (sense7.model.serving) needs nothing else.
    """

    encoder_weight = 1.0  # what features saved before the parameter existed had

    def __init__(self, text_features: str = "tfidf", max_features: int = 30000, history_chars: int = HISTORY_CHARS,
                 min_df: int = 2, text_weighting: str = "presence", context_weight: float = 0.1,
                 context_interactions: bool = False, relational_weight: float = 0.0, text_encoder=None,
                 encoder_weight: float | str = 1.0):
        self.relational_weight = relational_weight
        self.encoder_weight = encoder_weight
        self.text_encoder = text_encoder
        self.text_features = text_features
        self.text_weighting = text_weighting
        self.context_weight = context_weight
        self.context_interactions = context_interactions
        self.max_features = max_features
        self.history_chars = history_chars
        self.min_df = min_df

    def _vectorizers(self):
        if self.text_features not in TEXT_FEATURE_KINDS:
            raise ValueError(f"text_features must be one of {TEXT_FEATURE_KINDS}, got {self.text_features!r}")
        encoder = _fresh_encoder(getattr(self, "text_encoder", None))
        if self.text_features == "none":
            return {"encoder": encoder} if encoder is not None else {}
        word = dict(min_df=self.min_df, max_features=self.max_features, weighting=self.text_weighting)
        # History in unigrams: it is longer than the turn and tokenizing it dominates prediction time.
        out = {"text": BulkNgramVectorizer(ngram_max=2, **word), "history": BulkNgramVectorizer(ngram_max=1, **word)}
        if encoder is not None:
            out["encoder"] = encoder
        if self.text_features == "tfidf+char":
            out["text_char"] = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df=self.min_df,
                                               max_features=self.max_features, dtype=np.float32,
                                               sublinear_tf=True)
        return out

    # block_texts and dense_features read X[column] only, so X may be an item frame or the plain item columns
    # of `sense7.data.items` (the serving path, sense7.model.serving): one definition for both.

    def block_texts(self, X, name: str) -> list[str]:
        """The texts one vectorizer block reads ("text": the rated turn; "history": its last characters)."""
        # "encoder" (the optional text encoder) reads the rated turn, as "text" does.
        if name == "history":
            keep = int(self.history_chars)
            texts = _strings(X["history_text"])
            if keep <= 0:  # no history at all (h[-0:] would be the whole of it)
                return [""] * len(texts)
            return [h[-keep:] for h in texts]
        return _strings(X["text"])

    def dense_features(self, X) -> np.ndarray:
        """(n, k) the non-text features: the turn's position and the context fields, standardized."""
        n_turns = np.asarray(X["n_turns"], dtype=float)
        position = np.asarray(X["turn_position"], dtype=float)
        n = len(n_turns)
        whole = (position <= 0).astype(float)  # a rating of the whole conversation
        columns = [
            np.where(n_turns > 0, position / np.maximum(n_turns, 1), 1.0),
            np.log1p(n_turns) / 3.0,
            (position == 1).astype(float),
            whole,
        ]
        for name in self.ctx_numeric_:
            values = _numbers(X[name]) if name in X else np.full(n, np.nan)
            missing = np.isnan(values)
            mean, scale = self.ctx_stats_[name]
            columns.append(np.where(missing, 0.0, (values - mean) / scale))
            columns.append(missing.astype(float))
        for name, categories in self.ctx_categories_.items():
            values = _objects(X[name]) if name in X else np.full(n, None, dtype=object)
            for category in categories:
                columns.append((values == category).astype(float))
        weight = self.relational_scale()
        if getattr(self, "relational_weight", 0.0):  # (a scale chosen as 0 keeps the columns, at 0)
            # The whole dense block is multiplied by context_weight later: divide it out here.
            factor = weight / self.context_weight if self.context_weight else 0.0
            relational = relational_columns(X)
            for name in RELATIONAL_COLUMNS:
                columns.append(np.nan_to_num(relational[name], nan=0.0) * factor)
        return np.column_stack(columns)

    def fit(self, X: pd.DataFrame, y=None):
        self.fit_context(X)
        self._fit_blocks(X)
        return self

    def fit_context(self, X: pd.DataFrame):
        ctx = [c for c in X.columns if c.startswith("ctx_")]
        self.ctx_numeric_ = [c for c in ctx if pd.api.types.is_numeric_dtype(X[c])]
        self.ctx_stats_ = {}
        for name in self.ctx_numeric_:
            values = X[name].to_numpy(dtype=float)
            mean = float(np.nanmean(values)) if np.isfinite(values).any() else 0.0
            scale = float(np.nanstd(values)) if np.isfinite(values).sum() > 1 else 1.0
            self.ctx_stats_[name] = (mean, scale if scale > 0 else 1.0)
        self.ctx_categories_ = {
            c: sorted(str(v) for v in pd.unique(X[c].dropna())) for c in ctx if c not in self.ctx_numeric_
        }

    def _fit_blocks(self, X: pd.DataFrame) -> list:
        self.vectorizers_ = self._vectorizers()
        self.block_scales_, self.block_widths_ = {}, {}
        blocks = []
        for name, vec in self.vectorizers_.items():
            try:
                encoded = vec.fit_transform(self.block_texts(X, name.replace("_char", "")))
            except ValueError:  # empty vocabulary (e.g. no history anywhere): drop the block
                self.vectorizers_[name] = None
                continue
            block = sp.csr_matrix(encoded, dtype=np.float32)
            self.block_widths_[name] = block.shape[1]
            # Presence features are not length-normalised (a cue counts the same in a long or a short
            # turn: ratings add up cues); scale the block so a typical row has unit norm.
            self.block_scales_[name] = np.float32(1 / np.sqrt(max(block.getnnz(axis=1).mean(), 1.0))
                                                  if self.text_weighting == "presence" else 1.0)
            if name == "encoder":
                # An encoder's columns are dense values, not presences: a typical row gets unit norm too
                # (by the mean squared norm; dividing by the number of columns, as for presences, would
                # shrink 384 embedding columns ~20x and let the ridge ignore them). Scaling by the rows'
                # spread around their mean instead was tried (issue 39): no gain on WASSA (0.513 vs 0.511).
                squared = float(block.multiply(block).sum()) / max(block.shape[0], 1)
                self.block_scales_[name] = np.float32(1 / np.sqrt(squared) if squared > 0 else 1.0)
                self.encoder_unit_scale_ = float(self.block_scales_[name])
                weight = getattr(self, "encoder_weight", 1.0)
                if weight != "cv":
                    self.block_scales_[name] = np.float32(self.encoder_unit_scale_ * float(weight))
            blocks.append(block * self.block_scales_[name])
            if name == "encoder" and self._encoder_relations():
                relation = self._encoder_relation_block(X, encoded)
        self.block_layout_ = [(name, self.block_widths_[name]) for name, vec in self.vectorizers_.items()
                              if vec is not None]
        # Last, so the vectorizers' blocks keep their offsets (block_widths_, read by sense7.model.serving).
        if self._encoder_relations():
            self.block_layout_.append(("encoder_relations", relation.shape[1]))
            return blocks + [relation]
        return blocks

    def block_columns(self, name: str) -> slice:
        """The design matrix's columns of one text block ("text", "history", "encoder", ...), as fitted."""
        start = self.dense_width_
        for block, width in self.block_layout_:
            if block == name:
                return slice(start, start + width)
            start += width
        raise KeyError(f"no {name!r} block in these features")

    def set_encoder_scale(self, weight: float) -> None:
        """Fix the encoder block's scale at `weight` times its unit-norm scale (what encoder_weight="cv"
        chose): transform and serving then use it."""
        self.encoder_scale_ = float(weight)
        self.block_scales_["encoder"] = np.float32(self.encoder_unit_scale_ * float(weight))

    def relational_scale(self) -> float:
        """The relational columns' scale: the one chosen in fit (relational_weight="cv"), else
        relational_weight (models saved before it: 0)."""
        chosen = getattr(self, "relational_scale_", None)
        if chosen is not None:
            return float(chosen)
        weight = getattr(self, "relational_weight", 0.0) or 0.0
        return 1.0 if weight == "cv" else float(weight)

    def relational_column_indices(self) -> np.ndarray:
        """The fitted design matrix's relational columns (RELATIONAL_COLUMNS at the end of the dense block,
        then ENCODER_RELATIONAL_COLUMNS): what a relational scale multiplies."""
        if not (getattr(self, "relational_weight", 0.0) or 0.0):
            return np.zeros(0, dtype=np.int64)
        lexical = np.arange(self.dense_width_ - len(RELATIONAL_COLUMNS), self.dense_width_)
        if not self._encoder_relations():
            return lexical
        encoded = self.block_columns("encoder_relations")
        return np.concatenate([lexical, np.arange(encoded.start, encoded.stop)])

    def encoder_relations_on(self) -> bool:
        """Whether the fitted features hold the encoder's relational similarities (ENCODER_RELATIONAL_COLUMNS)."""
        return self._encoder_relations()

    def _encoder_relations(self) -> bool:
        """Whether the encoder's relational similarities are columns (an encoder and relational_weight > 0)."""
        return bool(getattr(self, "relational_weight", 0.0) or 0.0) \
            and (getattr(self, "vectorizers_", {}) or {}).get("encoder") is not None

    def encoder_relations(self, X, encoded=None, answered=None, history=None) -> np.ndarray:
        """(n, len(ENCODER_RELATIONAL_COLUMNS)) the cosine similarity of each encoded turn (`encoded`: the
        encoder's transform of the turns, when already computed) with the encoded message it answers and
        with the encoded history tail (0 where either is empty); `answered`, `history`: those encoded, when
        already computed (sense7.model.serving reads all three from the text vectors' cache in one call)."""
        encoder = self.vectorizers_["encoder"]
        if encoded is None:
            encoded = encoder.transform(self.block_texts(X, "encoder"))
        if answered is None:
            answered = encoder.transform(answered_texts(X))
        if history is None:
            history = encoder.transform(self.block_texts(X, "history"))
        return np.column_stack([_row_cosine(encoded, answered), _row_cosine(encoded, history)])

    def encoded_texts(self, X) -> tuple[list[str], list[str], list[str]]:
        """(turns, the messages they answer, history tails): every text the encoder reads for the items of X
        (the last two only with the encoder's relational columns: relational_weight > 0)."""
        turns = self.block_texts(X, "encoder")
        if not (getattr(self, "relational_weight", 0.0) or 0.0):
            return turns, [], []
        return turns, answered_texts(X), self.block_texts(X, "history")

    def _encoder_relation_block(self, X, encoded):
        return sp.csr_matrix(self.encoder_relations(X, encoded) * self.relational_scale(), dtype=np.float32)

    def fit_transform(self, X: pd.DataFrame, y=None):
        self.fit_context(X)
        return self._assemble(X, self._fit_blocks(X))

    def transform(self, X: pd.DataFrame):
        blocks = []
        for name, vec in self.vectorizers_.items():
            if vec is None:
                continue
            encoded = vec.transform(self.block_texts(X, name.replace("_char", "")))
            blocks.append(sp.csr_matrix(encoded, dtype=np.float32) * self.block_scales_[name])
            if name == "encoder" and self._encoder_relations():
                relation = self._encoder_relation_block(X, encoded)
        return self._assemble(X, blocks + ([relation] if self._encoder_relations() else []))

    def _assemble(self, X: pd.DataFrame, text_blocks: list):
        # The context/position block is scaled down, i.e. penalised more by the ridge: a few dense
        # columns with a light penalty overfit conversation-level quirks (measured on synthetic data).
        dense = self.dense_features(X)
        self.dense_width_ = dense.shape[1]  # the same for any X: where the text blocks start (block_columns)
        blocks = [sp.csr_matrix(dense * self.context_weight, dtype=np.float32)] + text_blocks
        if self.context_interactions and text_blocks:
            # The turn's words times each numeric context answer (standardized): the same words can
            # matter more when, e.g., the rater wanted a lot of empathy.
            for name in self.ctx_numeric_:
                values = pd.to_numeric(X[name], errors="coerce").to_numpy(dtype=float) if name in X \
                    else np.full(len(X), np.nan)
                mean, scale = self.ctx_stats_[name]
                z = np.nan_to_num((values - mean) / scale, nan=0.0).astype(np.float32)
                blocks.append(sp.diags(z) @ text_blocks[0])
        return sp.hstack(blocks, format="csr", dtype=np.float32)


def _row_cosine(A, B) -> np.ndarray:
    """(n,) cosine similarity of the rows of A and B (dense or sparse, same width); 0 where a row is 0."""
    if sp.issparse(A) or sp.issparse(B):
        A, B = sp.csr_matrix(A, dtype=np.float64), sp.csr_matrix(B, dtype=np.float64)
        dot = np.asarray(A.multiply(B).sum(axis=1)).ravel()
        norms = np.sqrt(np.asarray(A.multiply(A).sum(axis=1)).ravel() * np.asarray(B.multiply(B).sum(axis=1)).ravel())
    else:
        A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
        dot = (A * B).sum(axis=1)
        norms = np.sqrt((A * A).sum(axis=1) * (B * B).sum(axis=1))
    return np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), 0.0)


def _strings(column) -> list[str]:
    """A text column as strings, missing values as ""."""
    if isinstance(column, pd.Series):
        return column.fillna("").astype(str).tolist()
    return ["" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else str(v) for v in column]


def _objects(column) -> np.ndarray:
    """A column as a 1-d object array (np.asarray alone would split list-like values)."""
    if isinstance(column, pd.Series):
        return column.astype(object).to_numpy()
    out = np.empty(len(column), dtype=object)
    out[:] = list(column)
    return out


def _numbers(column) -> np.ndarray:
    """Floats, NaN where a value is missing or not a number (pandas' to_numeric with errors="coerce").
    The direct conversion first: serving calls this per request, and pandas costs ~50 us a column."""
    try:
        return np.asarray(column, dtype=float)
    except (TypeError, ValueError):
        return np.asarray(pd.to_numeric(pd.Series(column, dtype=object), errors="coerce"), dtype=float)
