"""A bag-of-n-grams vectorizer whose transform runs in bulk, not one document at a time.

scikit-learn's vectorizers call a Python analyzer per document and count terms in a Python loop, which
capped prediction at ~8,000 items/s. Here a whole batch is tokenized with one `str.split` on the joined
text, tokens are looked up with one hash-table `get_indexer` call, and bigrams by the integer pair of
their tokens' ids; the result equals what `analyze` gives document by document (tests check it).

Tokens: lower-cased runs of characters other than whitespace and ASCII punctuation.
"""

from __future__ import annotations

import itertools
import string

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import BaseEstimator

_SEPARATOR = "\x01"  # cannot survive _TABLE inside a document, so it only marks document boundaries
_TABLE = str.maketrans({c: " " for c in string.punctuation + _SEPARATOR})
# _TABLE for a batch joined with separators (_SEPARATOR kept), every ASCII character listed: str.translate
# looks each distinct character up once per call, and a character missing from the table costs a KeyError.
_SURROGATES = 0xD800  # the first code point that is not one UTF-16 unit of its own
_JOINED_TABLE = str.maketrans({**{chr(i): chr(i) for i in range(128)},
                               **{c: " " for c in string.punctuation}})


class TextEncoder(BaseEstimator):
    """The interface of a text encoder: what turns texts into the rater models' text columns.

        fit(texts: list[str]) -> self          learn what it needs from the training texts only
        transform(texts: list[str]) -> (n, k)  a dense array or a scipy sparse matrix, same k for any texts
        fit_transform(texts)                   both

    sklearn-clonable (constructor parameters stored as attributes under their own names), picklable with the
    model bundle, and nothing downloaded when it runs: weights ship with a package or a path the study names.
    Two implementations ship: the n-grams (`BulkNgramVectorizer`, the default and the one the compiled
    serving path scores directly) and sentence embeddings (`sense7.model.embeddings.SentenceEmbeddingEncoder`,
    the optional `[embeddings]` extra). A team plugs in its own (an LLM scorer, say) by subclassing this, or
    by duck typing, and passing it as `text_encoder=` to either rater model (docs/guides/researchers.md, "Text encoders").
    """

    def fit(self, texts, y=None):  # pragma: no cover - the interface
        return self

    def transform(self, texts):  # pragma: no cover - the interface
        raise NotImplementedError

    def fit_transform(self, texts, y=None):
        return self.fit(texts).transform(texts)


class BulkNgramVectorizer(TextEncoder):
    """The n-gram text encoder. weighting: "presence" (1 if the term occurs) or "tfidf" (sublinear tf x
    smoothed idf, rows L2)."""

    def __init__(self, ngram_max: int = 2, min_df: int = 2, max_features: int | None = None,
                 weighting: str = "presence"):
        if weighting not in ("presence", "tfidf"):
            raise ValueError(f"weighting must be presence or tfidf, got {weighting!r}")
        self.ngram_max = ngram_max
        self.min_df = min_df
        self.max_features = max_features
        self.weighting = weighting

    def analyze(self, doc: str) -> list[str]:
        """The terms of one document (the reference the bulk path must equal)."""
        tokens = doc.translate(_TABLE).lower().split()
        terms = list(tokens)
        if self.ngram_max >= 2:
            terms += [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]
        return terms

    def _terms(self, docs) -> tuple[np.ndarray, np.ndarray]:
        """(terms, document index of each term) for a batch."""
        joined = f" {_SEPARATOR} ".join(d.translate(_TABLE) for d in docs).lower()
        tokens = np.array(joined.split(), dtype=object)
        if not len(tokens):
            return tokens, np.zeros(0, dtype=np.int64)
        is_sep = tokens == _SEPARATOR
        doc = np.cumsum(is_sep)
        keep = ~is_sep
        terms, owners = [tokens[keep]], [doc[keep]]
        if self.ngram_max >= 2 and len(tokens) > 1:
            pair = keep[:-1] & keep[1:]  # neighbours in the same document
            terms.append(tokens[:-1][pair] + " " + tokens[1:][pair])
            owners.append(doc[:-1][pair])
        return np.concatenate(terms), np.concatenate(owners)

    def fit(self, docs):
        self.fit_transform(docs)
        return self

    def fit_transform(self, docs):
        docs = list(docs)
        terms, owners = self._terms(docs)
        codes, uniques = pd.factorize(terms)
        if not len(uniques):
            raise ValueError("empty vocabulary: the documents hold no terms")
        pairs = np.unique(owners.astype(np.int64) * len(uniques) + codes)
        df = np.bincount(pairs % len(uniques), minlength=len(uniques))
        total = np.bincount(codes, minlength=len(uniques))
        chosen = np.flatnonzero(df >= self.min_df)
        if self.max_features and len(chosen) > self.max_features:
            # Most frequent first; ties by the term itself, so the choice is deterministic.
            order = np.lexsort((np.asarray(uniques, dtype=object)[chosen].astype(str), -total[chosen]))
            chosen = chosen[order[: self.max_features]]
        if not len(chosen):
            raise ValueError("empty vocabulary: no term reaches min_df")
        vocab = np.sort(np.asarray(uniques, dtype=object)[chosen].astype(str))
        self.vocabulary_ = pd.Index(vocab)
        self.idf_ = np.log((1 + len(docs)) / (1 + df[pd.Index(uniques).get_indexer(vocab)])) + 1
        self._index_tokens()
        cols = self.vocabulary_.get_indexer(terms)
        return self._matrix(owners[cols >= 0], cols[cols >= 0], len(docs))

    def _index_tokens(self):
        """Integer look-up tables for transform: a bigram is found by the pair of its tokens' ids, so
        no bigram string is ever built at prediction time. Every token of a kept bigram is in the token
        table (id 0 is the document separator, which therefore breaks pairs)."""
        vocab = list(self.vocabulary_)
        tokens = {_SEPARATOR}
        for term in vocab:
            tokens.update(term.split(" "))
        self.token_index_ = pd.Index([_SEPARATOR] + sorted(tokens - {_SEPARATOR}))
        self.unigram_col_ = np.full(len(self.token_index_), -1, dtype=np.int64)
        bigram_codes, bigram_cols = [], []
        for col, term in enumerate(vocab):
            parts = term.split(" ")
            ids = self.token_index_.get_indexer(parts)
            if len(parts) == 1:
                self.unigram_col_[ids[0]] = col
            else:
                bigram_codes.append(ids[0] * len(self.token_index_) + ids[1])
                bigram_cols.append(col)
        self.bigram_index_ = pd.Index(np.asarray(bigram_codes, dtype=np.int64))
        self.bigram_col_ = np.asarray(bigram_cols, dtype=np.int64)
        self._index_for_lookups()

    def _index_for_lookups(self):
        # A plain dict and a sorted array: for the small batches of serving, pandas' hash-table set-up
        # per call cost more than the look-ups themselves.
        n_tokens = len(self.token_index_)
        self.unknown_id_ = n_tokens  # a token no kept term uses
        if n_tokens < _SURROGATES:  # every id, unknown included, is one UTF-16 unit (the usual case)
            self.token_ids_, self.token_chars_ = None, dict(zip(self.token_index_, map(chr, range(n_tokens))))
        else:
            self.token_ids_, self.token_chars_ = dict(zip(self.token_index_, range(n_tokens))), None
        self.unigram_lookup_ = np.append(self.unigram_col_, -1)  # by token id, unknown included
        # A bigram by the code of its token pair (first id * pair_base_ + second id), sorted, then a code no
        # pair reaches (every id is below pair_base_).
        self.pair_base_ = n_tokens + 1
        codes = self.bigram_index_.to_numpy()
        codes = codes // n_tokens * self.pair_base_ + codes % n_tokens
        order = np.argsort(codes, kind="stable")
        self.bigram_lookup_ = (np.append(codes[order], self.pair_base_ ** 2),
                               np.append(self.bigram_col_[order], -1))

    _DERIVED = ("token_ids_", "token_chars_", "unknown_id_", "unigram_lookup_", "pair_base_", "bigram_lookup_")

    def __getstate__(self):
        # The look-up tables are derived: rebuilt on load rather than stored in every saved bundle.
        return {k: v for k, v in self.__dict__.items() if k not in self._DERIVED}

    def __setstate__(self, state):
        self.__dict__.update(state)
        if "token_index_" in state:
            self._index_for_lookups()

    def _lookup_tokens(self, docs) -> np.ndarray:
        """The token id of every token of a batch, in order: 0 for the document separator, `unknown_id_`
        for a token no kept term uses."""
        separator = f" {_SEPARATOR} "
        joined = separator.join(docs)
        if joined.count(_SEPARATOR) == max(len(docs) - 1, 0):  # no document holds the separator itself
            joined = joined.translate(_JOINED_TABLE).lower()
        else:
            joined = separator.join(d.translate(_TABLE) for d in docs).lower()
        tokens = joined.split()
        if self.token_chars_ is not None:
            # Each token's id as one character, the ids read back from the UTF-16 bytes: one C-level pass
            # with no number boxed or unboxed per token (a third cheaper than np.fromiter over the ids).
            coded = "".join(map(self.token_chars_.get, tokens, itertools.repeat(chr(self.unknown_id_))))
            return np.frombuffer(coded.encode("utf-16-le"), dtype=np.uint16).astype(np.int64)
        return np.fromiter(map(self.token_ids_.get, tokens, itertools.repeat(self.unknown_id_)),
                           dtype=np.int64, count=len(tokens))

    def _cells_of(self, docs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(documents, columns) of the unigram and then of the bigram occurrences of a batch."""
        ids = self._lookup_tokens(docs)
        doc = np.cumsum(ids == 0)
        unigram = self.unigram_lookup_[ids]  # -1: the separator, an unknown token, or not a kept unigram
        is_unigram = unigram >= 0
        if self.ngram_max < 2:
            return doc[is_unigram], unigram[is_unigram], doc[:0], unigram[:0]
        # Every neighbouring pair by its code; a pair with the separator or an unknown token has no kept
        # bigram's code, and the table ends with a code above every pair's, so no index runs past it.
        codes, bigram_cols = self.bigram_lookup_
        wanted = ids[:-1] * self.pair_base_ + ids[1:]
        at = np.searchsorted(codes, wanted)
        found = codes[at] == wanted
        return doc[is_unigram], unigram[is_unigram], doc[:-1][found], bigram_cols[at[found]]

    def cells(self, docs) -> tuple[np.ndarray, np.ndarray]:
        """(document, column) of every kept term occurrence in a batch (repeats included): the matrix
        `transform` builds, before it is built."""
        uni_rows, uni_cols, bi_rows, bi_cols = self._cells_of(docs)
        return np.concatenate((uni_rows, bi_rows)), np.concatenate((uni_cols, bi_cols))

    def present_cells(self, docs) -> tuple[np.ndarray, np.ndarray]:
        """(document, column) of every kept term present in a batch, each once, sorted by document then
        column: the non-zero cells of the presence matrix. The serving path sums coefficients over these."""
        uni_rows, uni_cols, bi_rows, bi_cols = self._cells_of(docs)
        width = len(self.vocabulary_)
        keys = np.concatenate((uni_rows * width + uni_cols, bi_rows * width + bi_cols))
        keys.sort()
        if len(keys) > 1:  # what np.unique does, without its set-up
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        rows = keys // width
        return rows, keys - rows * width

    def transform(self, docs):
        docs = list(docs)
        return self._matrix(*self.cells(docs), len(docs))

    def _matrix(self, rows, cols, n_docs):
        counts = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)),
                               shape=(n_docs, len(self.vocabulary_)))
        counts.sum_duplicates()
        if self.weighting == "presence":
            counts.data[:] = 1.0
            return counts
        counts.data = (1 + np.log(counts.data)) * self.idf_[counts.indices].astype(np.float32)
        norms = np.sqrt(np.asarray(counts.multiply(counts).sum(axis=1)).ravel())
        return sp.diags(1 / np.where(norms > 0, norms, 1.0).astype(np.float32)) @ counts
