"""A fitted ModelBundle flattened into arrays, to predict Label Studio tasks in well under a millisecond.

The reference is `ModelBundle.predict_items(items_from_tasks(...))`: it builds a DataFrame, a sparse design
matrix and pandas look-ups on every call, about 4 ms of fixed cost whatever the batch, which a serving
process would pay on every /predict. `CompiledBundle` is built once per model version per process and
computes the same probabilities from the plain task columns of `sense7.data.items.task_columns`:

    text score    = intercept + context/position features (ItemFeatures.dense_features) @ their coefficients
                    + the coefficients of every term present (BulkNgramVectorizer.present_cells), per control
    personalized  = text score + the rater's intercept and slope (posterior of a known rater, trait prior
                    of any other rater with traits) + the assistant's effect, through the known or cold link
    generic       = its text score + its assistant effect, through its link

Tokenizing, the context features and the link are the training code's own functions; only the sums are
arranged differently. tests/model/test_serving.py checks the probabilities equal the reference's.
                    + a dense text encoder's vector of the turn (static embeddings) @ its coefficients, and its
                    relational similarities @ theirs
Text features other than presence n-grams and dense encoders (e.g. "tfidf+char") are scored through the
reference estimator, so every bundle can be served, the default ones fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sense7.model.decision import decide
from sense7.model.ordinal import cumulative_logit_proba
from sense7.model.text import BulkNgramVectorizer


DENSE_ROWS_KEPT = 4096  # distinct (position, context) inputs whose dense scores a process keeps
TEXT_ROWS_KEPT = 20_000  # distinct items whose text scores a process keeps (with an encoder or relational columns)


def _rows_of(columns: dict, rows: np.ndarray) -> dict:
    return {name: [values[i] for i in rows] for name, values in columns.items()}


class _TextScores:
    """The text part (features_, text_coef_, text_intercept_) of one fitted rater model."""

    def __init__(self, model):
        self.model = model
        features = model.features_
        self.features = features
        coef = np.asarray(model.text_coef_, dtype=np.float64)
        self.intercept = np.asarray(model.text_intercept_, dtype=np.float64)
        n_dense = features.dense_features({"n_turns": [0.0], "turn_position": [0.0], "text": [""],
                                           "history_text": [""]}).shape[1]
        self.dense_coef = coef[:n_dense] * features.context_weight
        # The dense part of a row depends on a few inputs only (position, context answers): kept per distinct
        # inputs (at most DENSE_ROWS_KEPT), unless relational columns (which read the texts) are in it.
        self.dense_inputs = ["n_turns", "turn_position", *features.ctx_numeric_, *features.ctx_categories_]
        self.dense_rows: dict | None = None if getattr(features, "relational_weight", 0.0) else {}
        self.blocks = []  # (text name, vectorizer, its coefficient rows times the block scale): the n-grams
        self.block_columns = []  # (first design-matrix column, block scale) of each n-gram block
        # A dense text encoder (ItemFeatures' "encoder" block, e.g. static embeddings): (encoder, its
        # coefficient rows times the block scale), and the rows of its relational similarities (or None).
        self.encoder, self.encoder_coef, self.relation_coef = None, None, None
        self.fast = not features.context_interactions
        self.row_inputs = ["text", "history_text", *self.dense_inputs]
        offset = n_dense
        for name, vec in features.vectorizers_.items():
            if vec is None:
                continue
            width = features.block_widths_[name] if hasattr(features, "block_widths_") else len(vec.vocabulary_)
            block = coef[offset:offset + width] * float(features.block_scales_[name])
            if name == "encoder" and not isinstance(vec, BulkNgramVectorizer):
                self.encoder, self.encoder_coef = vec, block
                if features.encoder_relations_on():
                    self.relation_coef = coef[features.block_columns("encoder_relations")] \
                        * features.relational_scale()
            else:
                if not (isinstance(vec, BulkNgramVectorizer) and vec.weighting == "presence"):
                    self.fast = False
                self.blocks.append((name, vec, block))
                self.block_columns.append((offset, float(features.block_scales_[name])))
            offset += width
        # An encoder that reads the text vectors' cache (sense7.model.vector_cache): it says which texts had vectors.
        self.cached_encoder = hasattr(self.encoder, "transform_known")
        # Whole text scores kept per distinct item when they read the texts beyond n-gram look-ups (`scores`).
        self.text_rows: dict | None = {} if self.encoder is not None or self.dense_rows is None else None

    def cells(self, columns: dict) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text block, the (document, column) cells of the terms present in the items (fast path only):
        what `scores` sums coefficients over, kept when another scorer reads the same cells."""
        return [vec.present_cells(self.features.block_texts(columns, name)) for name, vec, _ in self.blocks]

    def scores(self, columns: dict, cells: list | None = None) -> np.ndarray:
        return self.scores_known(columns, cells)[0]

    def scores_known(self, columns: dict, cells: list | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(n, controls) text scores of the items in `columns`; `cells`: cells(columns), when known.

        With a text encoder or relational columns, each distinct item (its texts, position and context
        answers: all the text score reads) is scored once per process (at most TEXT_ROWS_KEPT): Label
        Studio asks for the same tasks again, and a live pre-fill re-predicts a rater's page after each
        answer; encoding the texts and the relational features are most of a request's cost otherwise.

        Also (n,) whether each item's texts had their vectors (a cached encoder, sense7.model.vector_cache,
        under a time budget: False where the lexical part answered alone), or None when the encoder reads
        no cache. An item scored without its vectors is not kept: the next request scores it again."""
        if not self.fast:
            return self.model.text_scores(pd.DataFrame(columns)), None
        rows = self.text_rows  # entries are only ever added to this dict (a full one is replaced): thread-safe
        if rows is None or cells is not None:
            return self._scores(columns, cells)
        n = len(columns["n_turns"])
        try:
            keys = list(zip(*(columns[name] if name in columns else [None] * n for name in self.row_inputs)))
            missing = [i for i, key in enumerate(keys) if key not in rows]
        except TypeError:  # an unhashable value
            return self._scores(columns)
        known = np.ones(n, dtype=bool) if self.cached_encoder else None
        if missing:
            computed, known_missing = self._scores(columns if len(missing) == n else _rows_of(columns, np.asarray(missing)))
            fresh = dict(zip((keys[i] for i in missing), computed))
            if known_missing is not None and not known_missing.all():
                # Scored without some vectors: answered from these scores, never kept (the next request
                # scores the item again, with its vectors once they are embedded).
                known[np.asarray(missing)[~known_missing]] = False
                scored = [fresh[key] if key in fresh else rows[key] for key in keys]
                self._keep(rows, keys, [(keys[i], computed[j]) for j, i in enumerate(missing) if known_missing[j]])
                return np.array(scored).reshape(n, len(self.intercept)), known
            rows = self._keep(rows, keys, list(fresh.items()))
        return np.array([rows[key] for key in keys]).reshape(n, len(self.intercept)), known

    def _keep(self, rows: dict, keys: list, entries: list) -> dict:
        if len(rows) + len(entries) > TEXT_ROWS_KEPT:
            rows = {key: rows[key] for key in keys if key in rows}
        rows.update(entries)
        self.text_rows = rows
        return rows

    def _scores(self, columns: dict, cells: list | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        out = self.dense_scores(columns)
        known = None
        for i, (name, vec, coef) in enumerate(self.blocks):
            # Presence features: a term counts once per document, however often it occurs.
            rows, cols = cells[i] if cells is not None else vec.present_cells(self.features.block_texts(columns, name))
            if not len(rows):
                continue
            starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))  # (np.r_ costs more)
            sums = np.add.reduceat(coef[cols], starts, axis=0)
            if len(starts) == len(out):  # every document has a term (rows are sorted): no scatter needed
                out += sums
            else:
                out[rows[starts]] += sums
        if self.encoder is not None and self.cached_encoder:
            # Every text the encoder reads (turns, answered messages, history tails) in one look-up of the
            # text vectors' cache, under one on-demand budget.
            turns, answered, history = self.features.encoded_texts(columns)
            vectors, present = self.encoder.transform_known(turns + answered + history)
            n = len(turns)
            encoded = vectors[:n].astype(np.float64)
            known = present[:n].copy()
            out += encoded @ self.encoder_coef
            if self.relation_coef is not None:
                known &= present[n:2 * n] & present[2 * n:]
                out += self.features.encoder_relations(columns, encoded, vectors[n:2 * n], vectors[2 * n:]) \
                    @ self.relation_coef
        elif self.encoder is not None:
            encoded = self.encoder.transform(self.features.block_texts(columns, "encoder"))
            encoded = encoded.toarray() if hasattr(encoded, "toarray") else np.asarray(encoded, dtype=np.float64)
            out += encoded @ self.encoder_coef
            if self.relation_coef is not None:
                out += self.features.encoder_relations(columns, encoded) @ self.relation_coef
        return out, known


    def dense_scores(self, columns: dict) -> np.ndarray:
        """(n, controls) the intercept plus the position/context features' part, per item: what
        `dense_features` @ coefficients gives, each distinct row of inputs computed once per process (a
        batch-1 request otherwise pays ~40 small numpy calls for it)."""
        rows = self.dense_rows  # entries are only ever added to this dict (a full one is replaced): thread-safe
        n = len(columns["n_turns"])
        try:
            keys = list(zip(*(columns[name] if name in columns else [None] * n for name in self.dense_inputs)))
            missing = [i for i, key in enumerate(keys) if key not in rows]
        except TypeError:  # not kept (relational columns: rows is None), or an unhashable value
            return self.features.dense_features(columns) @ self.dense_coef + self.intercept
        if missing:
            subset = {name: [columns[name][i] for i in missing] for name in self.dense_inputs if name in columns}
            computed = self.features.dense_features(subset) @ self.dense_coef + self.intercept
            if len(rows) + len(missing) > DENSE_ROWS_KEPT:
                rows = {key: rows[key] for key in keys if key in rows}
            rows.update(zip((keys[i] for i in missing), computed))
            self.dense_rows = rows
        return np.array([rows[key] for key in keys]).reshape(n, len(self.intercept))


class _RaterContentScores:
    """Each known rater's own content weights (PersonalizedRater.rater_ridge over every feature column,
    rater_ridge_from="text") summed over the present cells the text scores read, as _TextScores sums the
    text model's: the feature matrix is never built. Only where the text scores have their fast path. The
    weights are the model's own arrays (features x raters per control), read in place: no copy."""

    def __init__(self, model, text: _TextScores):
        # An infinite penalty: that control has no content weights (RaterResidualRidge.predict gives 0).
        self.ridges = [(c, ridge) for c, ridge in enumerate(model.rater_ridges_) if np.isfinite(ridge.alpha_)]
        self.n_controls = len(model.rater_ridges_)
        self.text = text
        self.n_dense = len(text.dense_coef)

    @classmethod
    def usable(cls, model, text: _TextScores) -> bool:
        return getattr(model, "rater_ridges_", None) is not None and text.fast \
            and model.rater_ridge_from == "text" and not model.features_.context_interactions \
            and (model.features_.vectorizers_ or {}).get("encoder") is None

    def inputs(self, columns: dict, cells: list | None = None) -> tuple:
        """What `shifts` reads of the items, made once for any number of raters: the present cells (`cells`:
        the text scores' own, when known) and the dense columns as the design matrix holds them."""
        features = self.text.features
        return (cells if cells is not None else self.text.cells(columns),
                features.dense_features(columns) * features.context_weight)

    def shifts(self, rater_rows: np.ndarray, inputs: tuple) -> np.ndarray:
        """(n, controls) each item's shift for its rater (rater_rows: the model's known-rater rows; -1: 0)."""
        rows = np.asarray(rater_rows)
        mine = np.maximum(rows, 0)
        out = np.zeros((len(rows), self.n_controls))
        if not self.ridges:
            return out
        cells, dense = inputs  # dense: (n, k)
        starts = [np.flatnonzero(np.concatenate(([True], docs[1:] != docs[:-1]))) if len(docs) else None
                  for docs, _ in cells]  # cells are sorted by document: one sum per document
        for c, ridge in self.ridges:
            coef = ridge.coef_
            out[:, c] = np.einsum("ik,ki->i", dense, coef[:self.n_dense, mine]) - ridge.offset_[mine]
            for (offset, scale), (docs, cols), first in zip(self.text.block_columns, cells, starts):
                if first is not None:
                    values = coef[offset + cols, mine[docs]].astype(np.float64)
                    out[docs[first], c] += np.add.reduceat(values, first) * scale
        out[rows < 0] = 0.0
        return out


class _Links:
    """The ordinal links of all controls as arrays: thresholds (controls, levels - 1), scale (controls,)."""

    def __init__(self, links):
        unpacked = [link.thresholds_and_scale() for link in links]
        self.thresholds = np.array([t for t, _ in unpacked])
        self.scale = np.array([s for _, s in unpacked])

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        """(n, controls) scores -> (n, controls, levels) probabilities."""
        return cumulative_logit_proba(self.thresholds, self.scale, scores)


class _AssistantShifts:
    """Each assistant's shrunk effect per control (0 for unknown or unseen assistants, as in fit)."""

    def __init__(self, effects: list, n_controls: int):
        self.table: dict[str, np.ndarray] = {}
        for j, effect in enumerate(effects or []):
            if effect is None:
                continue
            for key, value in zip(effect.index_, effect.effect_):
                self.table.setdefault(key, np.zeros(n_controls))[j] = value
        self.zero = np.zeros(n_controls)

    def __call__(self, assistant_ids) -> np.ndarray:
        if not self.table:
            return np.zeros((len(assistant_ids), len(self.zero)))
        return np.array([self.table.get(a, self.zero) for a in assistant_ids]).reshape(len(assistant_ids), -1)


@dataclass(frozen=True)
class RaterTable:
    """Per-rater coefficients for serving: known raters' posteriors, other raters' trait priors."""

    index: dict  # rater_id -> row
    coef: np.ndarray  # (rows, controls, 1 or 2): intercept (and slope) per control
    common: np.ndarray  # (rows,): the leniency pooled over controls (0 unless pool_controls)
    known: np.ndarray  # (rows,) bool: had ratings in training (known link) or traits only (cold link)


@dataclass(frozen=True)
class Predictions:
    kinds: list  # per item: "personalized", "traits" or "generic" (as ModelBundle.kinds)
    probs: np.ndarray  # (items, controls, levels)
    levels: np.ndarray  # the rating of each level column
    # (items,) whether each item's texts had their vectors from the text vectors' cache (False: the model's
    # lexical part answered alone, sense7.model.vector_cache); None: the model reads no cached vectors.
    embedded: np.ndarray | None = None

    def text_vectors(self) -> list[str] | None:
        """Per item, "embedded" or "lexical" (sense7.model.vector_cache.EMBEDDED / LEXICAL: what the ML backend
        returns and records); None when the model reads no cached vectors."""
        if self.embedded is None:
            return None
        from sense7.model.vector_cache import EMBEDDED, LEXICAL

        return [EMBEDDED if e else LEXICAL for e in self.embedded.tolist()]

    def expected(self) -> np.ndarray:
        """Expected rating (items, controls) under the probabilities."""
        return self.probs @ self.levels.astype(float)

    def best(self, rule: str = "mode") -> tuple[np.ndarray, np.ndarray]:
        """(the level the decision rule picks, its probability), each (items, controls). rule: "mode" (the
        most likely level) or "median" (sense7.model.decision)."""
        best = decide(self.probs, rule)
        items, controls = np.indices(best.shape, sparse=True)  # (take_along_axis, the same, costs more)
        return self.levels[best], self.probs[items, controls, best]


class CompiledBundle:
    """`ModelBundle` prediction from task columns, with everything per-version precomputed."""

    def __init__(self, bundle):
        personalized, generic = bundle.personalized, bundle.generic
        if list(generic.controls_) != list(personalized.controls_):
            raise ValueError("the bundle's generic and personalized models predict different controls")
        self.version = bundle.version
        self.controls = list(personalized.controls_)
        self.levels = np.asarray(bundle.levels)
        self.personalized = personalized
        n_controls = len(self.controls)
        self._text = _TextScores(personalized)
        # The default generic model is the personalized model's own text part (ModelBundle): score it once.
        # (By value: joblib does not keep the identity of arrays through a save and load.)
        shared = generic.features_ is personalized.features_ \
            and np.array_equal(generic.text_coef_, personalized.text_coef_) \
            and np.array_equal(generic.text_intercept_, personalized.text_intercept_)
        self._generic_text = self._text if shared else _TextScores(generic)
        self._known_links = _Links(personalized.links_known_)
        self._cold_links = _Links(personalized.links_cold_)
        self._generic_links = _Links(generic.links_)
        self._personal_assistants = _AssistantShifts(getattr(personalized, "assistant_effects_", None), n_controls)
        self._generic_assistants = _AssistantShifts(getattr(generic, "assistant_effects_", None), n_controls)
        self._g_mean = np.array([effects.g_mean_ for effects in personalized.effects_])
        self._trait_W = np.stack([effects.W_ for effects in personalized.effects_], axis=1)  # (traits+1, C, k)
        # Rater coefficients: intercept, a slope on the text score (slopes=True), then one slope per rater
        # direction (rater_directions > 0).
        self._slopes = bool(personalized.slopes)
        self._n_base = 2 if self._slopes else 1
        self._raters_for: tuple | None = None  # (trait table, its RaterTable): rebuilt when the table changes
        # Each known rater's own content weights (PersonalizedRater.rater_ridge), by the model's own rows:
        # they are fitted per known rater, so a rater table's rows (which add newcomers) do not index them.
        self._content_rows = {str(r): i for i, r in enumerate(personalized.known_raters_)} \
            if getattr(personalized, "rater_ridges_", None) is not None else None
        self._content = _RaterContentScores(personalized, self._text) \
            if _RaterContentScores.usable(personalized, self._text) else None

    def rater_table(self, traits: pd.DataFrame) -> RaterTable:
        """Coefficients of every known rater and of every rater in `traits` (trait_<name> columns, index
        rater_id) who has at least one trait the model uses. Cached until a different table is passed."""
        cached = self._raters_for
        if cached is not None and cached[0] is traits:
            return cached[1]
        model = self.personalized
        used = traits.reindex(columns=model.trait_columns_)
        with_traits = used[used.notna().any(axis=1).to_numpy()] if len(model.trait_columns_) else used.iloc[:0]
        known_ids = [str(r) for r in model.known_raters_]
        new_ids = [str(r) for r in with_traits.index if str(r) not in set(known_ids)]
        Z = model.trait_matrix(with_traits.set_axis(with_traits.index.astype(str)).loc[new_ids])
        prior = np.einsum("rp,pck->rck", Z, self._trait_W)
        table = RaterTable(
            index={r: i for i, r in enumerate(known_ids + new_ids)},
            coef=np.concatenate([np.asarray(model.rater_coef_), prior]),
            common=np.concatenate([np.asarray(model.common_known_, dtype=float), model.common_prior(Z)]),
            known=np.r_[np.ones(len(known_ids), bool), np.zeros(len(new_ids), bool)],
        )
        self._raters_for = (traits, table)
        return table

    def text_scores(self, columns: dict) -> np.ndarray:
        """(items, controls) the personalized model's text scores (before any rater or assistant effect)."""
        return self._text.scores(columns)

    def assistant_shifts(self, assistant_ids) -> np.ndarray:
        """(items, controls) the personalized model's shrunk effect of each item's assistant (0: unknown)."""
        return self._personal_assistants(list(assistant_ids))

    def predict_generic(self, columns: dict) -> Predictions:
        """The generic model's probabilities for every item, whoever its rater (recorded next to the served
        prediction, so live evaluation can compare the two on the same ratings)."""
        n = len(self.controls)
        nobody = RaterTable(index={}, coef=np.zeros((0, n, 1)), common=np.zeros(0), known=np.zeros(0, bool))
        return self.predict(columns, nobody)

    def predict(self, columns: dict, raters: RaterTable) -> Predictions:
        """Probabilities for the items of `columns` (sense7.data.items: task_columns, transcript_columns)."""
        rater_rows = np.array([raters.index.get(str(r), -1) for r in columns["rater_id"]], dtype=np.int64)
        personal = np.flatnonzero(rater_rows >= 0)
        generic = np.flatnonzero(rater_rows < 0)
        n = len(rater_rows)
        # A request is usually all of one group: then that group's arrays are the whole ones (no gathers, no
        # scatter into a fresh array; the same values).
        probs = None if len(personal) == n or len(generic) == n else \
            np.empty((n, len(self.controls), len(self.levels)))
        kinds = ["generic"] * n
        # The content shifts read the same present cells as the text scores: found once for both.
        cells = self._text.cells(columns) if self._content is not None and len(personal) else None
        text, embedded = self._text.scores_known(columns, cells) \
            if len(personal) or self._generic_text is self._text else (None, None)
        assistants = columns["assistant_id"]
        if len(personal):
            everyone = len(personal) == n
            rows = rater_rows if everyone else rater_rows[personal]
            g = text if everyone else text[personal]
            coef = raters.coef[rows]
            shift = coef[:, :, 0]
            if self._slopes:  # slopes: how strongly this rater follows the text score
                shift = shift + coef[:, :, 1] * (g - self._g_mean)
            # The personal items' columns, gathered only when a rater-specific feature pass needs them.
            needs_part = coef.shape[2] > self._n_base or (self._content_rows is not None and self._content is None)
            part = (columns if everyone else _rows_of(columns, personal)) if needs_part else None
            if coef.shape[2] > self._n_base:  # slopes on the rater directions (PersonalizedRater.rater_directions)
                values = self.personalized.rater_direction_values(part)  # (i, c, d)
                shift = shift + np.einsum("icd,icd->ic", coef[:, :, self._n_base:], values)
            if self._content is not None:  # over every item (generic ones get 0), then the personal ones
                content = self.content_shifts(columns, columns["rater_id"], self._content.inputs(columns, cells))
                shift = shift + (content if everyone else content[personal])
            elif self._content_rows is not None:
                shift = shift + self.content_shifts(part, part["rater_id"])
            scores = g + raters.common[rows][:, None] + shift \
                + self._personal_assistants([assistants[i] for i in personal])
            known = raters.known[rows]
            if everyone:
                probs = self._rater_links(scores, known)
            else:
                probs[personal] = self._rater_links(scores, known)
            for i, is_known in zip(personal.tolist(), known.tolist()):
                kinds[i] = "personalized" if is_known else "traits"
        if len(generic):
            if self._generic_text is self._text:
                g = text[generic]
            else:
                g, generic_embedded = self._generic_text.scores_known(_rows_of(columns, generic))
                if generic_embedded is not None:
                    embedded = np.ones(n, dtype=bool) if embedded is None else embedded.copy()
                    embedded[generic] = generic_embedded
            scores = g + self._generic_assistants([assistants[i] for i in generic])
            if len(generic) == n:
                probs = self._generic_links(scores)
            else:
                probs[generic] = self._generic_links(scores)
        if probs is None:  # no items
            probs = np.empty((0, len(self.controls), len(self.levels)))
        return Predictions(kinds, probs, self.levels, embedded)

    def content_inputs(self, columns: dict):
        """What content_shifts reads of the items, computed once for several calls on the same items: the
        present cells and dense columns (fast path) or the personalized model's rater_content_features."""
        if self._content is not None:
            return self._content.inputs(columns)
        return self.personalized.rater_content_features(columns)

    def content_shifts(self, columns: dict, rater_ids: list[str], inputs=None) -> np.ndarray | None:
        """(items, controls) each item's shift from its rater's own content weights (rater_ridge; 0 for a
        rater the model has no weights for: a newcomer served from their traits); None for a model without
        them. `inputs`: content_inputs(columns), when known."""
        if self._content_rows is None:
            return None
        rows = np.array([self._content_rows.get(str(r), -1) for r in rater_ids], dtype=np.int64)
        if self._content is not None:
            return self._content.shifts(rows, inputs if inputs is not None else self._content.inputs(columns))
        return self.personalized.rater_content_shifts(columns, rows, inputs)

    def _rater_links(self, scores: np.ndarray, known: np.ndarray) -> np.ndarray:
        """Probabilities through the known link for known raters, the cold one for the others: only the
        links some item needs are computed (a request is usually one kind)."""
        if known.all():
            return self._known_links(scores)
        if not known.any():
            return self._cold_links(scores)
        return np.where(known[:, None, None], self._known_links(scores), self._cold_links(scores))

    def predict_panel(self, columns: dict, raters: RaterTable, members: list[str]) -> np.ndarray:
        """(items, members, controls, levels): every item of `columns` as each member would rate it.

        The same probabilities as `predict` on the items replicated once per member with their rater_id
        replaced, but the text part, which is the same for every member, is scored once per item (a jury of
        100 raters costs one text pass, not 100). Every member must be in `raters` (known or profiled)."""
        rows = np.array([raters.index.get(str(m), -1) for m in members], dtype=np.int64)
        if (rows < 0).any():
            missing = [str(m) for m, row in zip(members, rows) if row < 0]
            raise ValueError(f"not in the rater table (no ratings, no usable traits): {', '.join(missing)}")
        g = self._text.scores(columns)[:, None, :]  # (items, 1, controls)
        coef = raters.coef[rows][None]  # (1, members, controls, k)
        shift = coef[..., 0]
        if self._slopes:
            shift = shift + coef[..., 1] * (g - self._g_mean)
        if coef.shape[3] > self._n_base:
            values = self.personalized.rater_direction_values(columns)  # (items, controls, directions)
            shift = shift + np.einsum("mcd,icd->imc", coef[0, :, :, self._n_base:], values)
        if self._content_rows is not None:  # the items' features once, then each member's own weights
            inputs = self.content_inputs(columns)
            shift = shift + np.stack([self.content_shifts(columns, [str(m)] * g.shape[0], inputs)
                                      for m in members], axis=1)
        scores = g + raters.common[rows][None, :, None] + shift \
            + self._personal_assistants(columns["assistant_id"])[:, None, :]
        known = raters.known[rows]
        probs = np.empty(scores.shape + (len(self.levels),))
        probs[:, known] = self._known_links(scores[:, known])
        probs[:, ~known] = self._cold_links(scores[:, ~known])
        return probs
