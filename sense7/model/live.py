"""Live personalization: one rater's posterior updated by the answers they gave so far, population fixed.

The served `PersonalizedRater` already holds everything needed to update one rater at once: for each
control the trait prior W, the covariance T of rater intercepts and slopes and the noise variance
(sense7.model.rater_effects). With those fixed, a rater's coefficients given their ratings are a Gaussian
posterior in closed form (the EM's E-step), so a rating given a minute ago can move the next pre-fill
without a retrain:

    precision = T^-1 + sum_i d_i d_i' / sigma2          d_i = [1, g_i - g_mean]  (design of rating i)
    mean      = precision^-1 (T^-1 mu + sum_i d_i e_i / sigma2)    e_i = target(y_i) - g_i - assistant_i

mu is what the rater's traits predict (a rater without usable traits: the population mean); a rater the
version was trained on starts from their training sums (`RaterEffects.rater_gram_`, `rater_moment_`), and
their answers the version already saw (`PersonalizedRater.trained_keys_`) are never counted twice.
`OnlinePosterior` adds ratings one at a time (information form: each update is a rank-one addition);
`batch_posterior` computes the same from all ratings at once; tests/model/test_live_posterior.py checks
both against Gaussian conditioning written out in covariance form, for known, traits-only and unknown raters.

`LivePredictor` turns the posterior into predictions with the compiled bundle's text scores (one text pass
over the rater's rated turns, at most a few hundred, and one over the turns to predict) and the version's
links (see `predict_with`). Versions trained before
these statistics were kept, or with `pool_controls`, have no live form (`LiveUnsupported`): callers keep
the static prediction. With rater directions (`PersonalizedRater.rater_directions`) a rating's design also
holds the rated turn's values on the directions, d_i = [1, g_i - g_mean, v_i], so a rater's slopes on them
move live too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np
import pandas as pd

from sense7.model.estimators import item_key_hashes
from sense7.model.ordinal import cumulative_logit_proba
from sense7.model.serving import CompiledBundle, Predictions
from sense7.store.study_design import LIVE_KIND


class LiveUnsupported(RuntimeError):
    """This model version cannot be updated live (trained before live statistics were kept, or pooled)."""


def check_live(model) -> None:
    """Raise LiveUnsupported unless `model` (a fitted PersonalizedRater) keeps what live updates need."""
    if getattr(model, "pool_controls", False):
        raise LiveUnsupported("a leniency pooled over controls is not updated live")
    missing = [name for name in ("target_values_", "trained_keys_") if not hasattr(model, name)]
    if missing or not all(hasattr(e, "rater_gram_") for e in model.effects_):
        raise LiveUnsupported("this version was trained before live statistics were kept")


def _start(model, rater_id: str, traits: pd.DataFrame | None):
    """(prior mean (C, k), gram (C, k, k), moment (C, k), noise variance (C,), kind) of a rater before
    any rating of this study: a known rater's training sums, else zeros and the trait prior."""
    effects = model.effects_
    rows = pd.Index(model.known_raters_.astype(str)).get_indexer([str(rater_id)])
    row = int(rows[0])
    k = effects[0].T_.shape[0]
    if row >= 0:
        Z = model.known_trait_matrix_[row:row + 1]
        gram = np.stack([e.rater_gram_[row] for e in effects])
        moment = np.stack([e.rater_moment_[row] for e in effects])
        sigma2 = np.array([e.rater_sigma2_[row] for e in effects])
        kind = "personalized"
    else:
        own = None
        if traits is not None and len(model.trait_columns_):
            table = traits.set_axis(traits.index.astype(str)).reindex(columns=model.trait_columns_)
            if str(rater_id) in table.index and table.loc[[str(rater_id)]].notna().to_numpy().any():
                own = table.loc[[str(rater_id)]]  # as CompiledBundle.rater_table: some trait the model uses
        has = own is not None
        # No usable traits: the population mean (the trait matrix of a rater whose traits are all unknown).
        Z = model.trait_matrix(own) if has else np.eye(1, len(model.trait_columns_) + 1)
        gram = np.zeros((len(effects), k, k))
        moment = np.zeros((len(effects), k))
        sigma2 = np.array([e.sigma2_ for e in effects])
        kind = "traits" if has else "generic"
    prior = np.stack([e.prior(Z)[0] for e in effects])
    return prior, gram, moment, sigma2, kind


@dataclass(frozen=True)
class RaterStart:
    """A rater's state before any rating of this study (`_start`) and the inverse covariances T^-1: what
    every posterior of theirs starts from. Costly next to the update itself (the trait features and prior
    of a new rater), so PosteriorCache keeps it per (rater, traits)."""
    start: tuple  # (prior mean, gram, moment, noise variance, kind), as `_start` returns them
    T_inv: np.ndarray  # (controls, k, k)


def rater_start(model, rater_id: str, traits: pd.DataFrame | None) -> RaterStart:
    return RaterStart(_start(model, rater_id, traits), np.stack([np.linalg.inv(e.T_) for e in model.effects_]))


def _targets(model, ratings: np.ndarray) -> np.ndarray:
    """Ratings (n, C), NaN where unrated -> the scale the rater effects were fitted on (NaN kept)."""
    ratings = np.atleast_2d(np.asarray(ratings, dtype=float))
    levels = np.asarray(model.levels_, dtype=float)
    index = np.searchsorted(levels, ratings)
    ok = np.isfinite(ratings) & (index < len(levels))
    ok[ok] &= levels[index[ok]] == ratings[ok]  # a value off the scale is not a rating
    out = np.full(ratings.shape, np.nan)
    cols = np.broadcast_to(np.arange(ratings.shape[1]), ratings.shape)
    out[ok] = model.target_values_[cols[ok], index[ok]]
    return out


class OnlinePosterior:
    """One rater's coefficients (controls, 1 or 2) updated one rating at a time, population fixed.

    model: a fitted PersonalizedRater; traits: a trait_<name> table (index rater_id) holding this rater
    (or None). `update(g, ratings, shift)` adds one rated turn: its text scores g (controls,), the ratings
    (controls,; NaN where a control was not rated) and the assistant's effect (controls,; default 0)."""

    def __init__(self, model, rater_id: str, traits: pd.DataFrame | None = None, start: tuple | None = None):
        check_live(model)
        self.model = model
        self.rater_id = str(rater_id)
        # start: a `RaterStart` of this rater made earlier (PosteriorCache), the same numbers without redoing them
        if start is None:
            start = rater_start(model, rater_id, traits)
        (self.prior_mean, gram, moment, self.sigma2, self.kind), self._T_inv = start.start, start.T_inv
        self.precision = gram / self.sigma2[:, None, None] + self._T_inv
        self.rhs = moment / self.sigma2[:, None] + np.einsum("cij,cj->ci", self._T_inv, self.prior_mean)
        self.n_ratings = 0  # rated turns added (not counting a known rater's training)

    def update(self, g, ratings, shift=None, extra=None) -> "OnlinePosterior":
        """`extra`: (controls, directions) the turn's values on the rater directions, when the model has them."""
        self._check_extra(extra)
        g = np.asarray(g, dtype=float).reshape(-1)
        shift = np.zeros_like(g) if shift is None else np.asarray(shift, dtype=float).reshape(-1)
        targets = _targets(self.model, np.asarray(ratings, dtype=float).reshape(1, -1))[0]
        for j, effects in enumerate(self.model.effects_):
            if not np.isfinite(targets[j]):
                continue
            d = effects.design(g[j:j + 1], None if extra is None else np.asarray(extra, dtype=float)[j][None])[0]
            e = targets[j] - g[j] - shift[j]
            self.precision[j] += np.outer(d, d) / self.sigma2[j]
            self.rhs[j] += d * e / self.sigma2[j]
        self.n_ratings += 1
        return self

    def _check_extra(self, extra) -> None:
        """A version with rater directions needs each turn's values on them (and one without, none)."""
        has_directions = self.precision.shape[1] > (2 if self.model.slopes else 1)
        if has_directions != (extra is not None):
            raise ValueError("this version has rater directions: pass the turns' values on them (extra)"
                             if has_directions else "this version has no rater directions: extra must be None")

    def copy(self) -> "OnlinePosterior":
        """An independent copy (its updates leave this one as it is)."""
        other = object.__new__(OnlinePosterior)
        other.__dict__.update(self.__dict__)
        other.precision, other.rhs = self.precision.copy(), self.rhs.copy()
        return other

    def update_many(self, g, ratings, shift=None, extra=None) -> "OnlinePosterior":
        """The same as `update` once per row of g, ratings, shift (n, controls) and extra (n, controls,
        directions), in one vectorised step."""
        self._check_extra(extra)
        g = np.atleast_2d(np.asarray(g, dtype=float))
        shift = np.zeros_like(g) if shift is None else np.atleast_2d(np.asarray(shift, dtype=float))
        targets = _targets(self.model, ratings)
        rated = np.isfinite(targets)
        e = np.where(rated, targets - g - shift, 0.0) / self.sigma2  # (n, C), 0 where unrated
        weight = rated / self.sigma2
        k = self.precision.shape[1]
        g_mean = np.array([effects.g_mean_ for effects in self.model.effects_])
        D = np.ones(g.shape + (k,))
        if self.model.slopes:
            D[:, :, 1] = g - g_mean
        if extra is not None:
            D[:, :, k - np.shape(extra)[2]:] = extra
        self.precision += np.einsum("nc,nci,ncj->cij", weight, D, D)
        self.rhs += np.einsum("nc,nci->ci", e, D)
        self.n_ratings += len(g)
        return self

    def information_share(self) -> np.ndarray:
        """(controls,) how far the rater's own ratings have informed their leniency: 1 - posterior variance
        / prior variance of the intercept (0: none; 1 for a known rater, who is served as known)."""
        if self.kind == "personalized":
            return np.ones(len(self.precision))
        if self.n_ratings == 0:
            return np.zeros(len(self.precision))  # exactly the trait prior's link, not 1e-16 off it
        prior = np.array([e.T_[0, 0] for e in self.model.effects_])
        posterior = np.array([np.linalg.inv(p)[0, 0] for p in self.precision])
        return np.clip(1 - posterior / prior, 0.0, 1.0)

    def coef(self) -> np.ndarray:
        """(controls, k) the posterior mean of the rater's intercept (and slope) per control."""
        return np.linalg.solve(self.precision, self.rhs[:, :, None])[:, :, 0]


def batch_posterior(model, rater_id: str, traits: pd.DataFrame | None, g: np.ndarray, ratings: np.ndarray,
                    shift: np.ndarray | None = None, extra: np.ndarray | None = None) -> np.ndarray:
    """(controls, k): the same posterior as OnlinePosterior after updating with every row, from all rows at
    once through `RaterEffects.posterior` (g, ratings, shift: (n, controls); extra: (n, controls,
    directions), the rater directions' values when the model has them)."""
    check_live(model)
    g = np.atleast_2d(np.asarray(g, dtype=float))
    shift = np.zeros_like(g) if shift is None else np.atleast_2d(np.asarray(shift, dtype=float))
    prior, gram, moment, sigma2, _ = _start(model, rater_id, traits)
    targets = _targets(model, ratings)
    out = []
    for j, effects in enumerate(model.effects_):
        rated = np.isfinite(targets[:, j])
        D = effects.design(g[rated, j], None if extra is None else np.asarray(extra, dtype=float)[rated, j])
        e = targets[rated, j] - g[rated, j] - shift[rated, j]
        mean, _ = effects.posterior(gram[j] + D.T @ D, moment[j] + D.T @ e, prior[j], sigma2[j])
        out.append(mean)
    return np.stack(out)


def _link_arrays(links) -> tuple[np.ndarray, np.ndarray]:
    """(thresholds (controls, levels - 1), scale (controls,)) of one ordinal link per control."""
    unpacked = [link.thresholds_and_scale() for link in links]
    return np.array([t for t, _ in unpacked]), np.array([s for _, s in unpacked], dtype=float)


@dataclass(frozen=True)
class LivePrediction:
    predictions: Predictions  # kinds are "live"
    own_ratings: int  # how many of the rater's own answers moved it (not counting a version's training)
    start_kind: str  # what the rater was before: personalized (known), traits or generic


def traits_fingerprint(traits: pd.DataFrame | None, rater_id: str) -> Hashable:
    """What identifies a rater's traits in a trait table: their row's values (None: not in it). One row
    is read, whatever the table's size (the backend passes every known rater's)."""
    if traits is None or not len(traits.columns):
        return None
    index = traits.index if traits.index.dtype == object else traits.index.astype(str)
    found = index.get_indexer([str(rater_id)])
    if found[0] < 0:
        return None
    row = traits.iloc[int(found[0])]
    return tuple(sorted((str(k), None if pd.isna(v) else repr(v)) for k, v in row.items()))


class PosteriorCache:
    """The live posteriors of one served version (held by its `LivePredictor`): the one cache of the rater
    page (sense7.rater_page.live) and the ML backend (sense7.ml_backend.live), so that neither rebuilds a
    rater's posterior from their answers on every page or request.

    Why it can be exact: a posterior is a function of (version, rater, traits, the answers new to the
    version and their values) and nothing else. The version is the cache's owner (a promotion builds a new
    LivePredictor, hence a new cache); the rest is the key: `(rater, traits key, answers key)`, where the
    answers key is the item-key hashes and the rating values of every counted answer. A new answer, a
    changed answer or new traits is a new key, never a stale hit. Two levels: the rater's start (trait
    features and prior: the costly part) per (rater, traits key), and the full posterior per key. States
    handed out are copies: a caller updating one changes nothing here. Bounded (least recently used first
    out); thread-safe (the rater page's threads share it)."""

    def __init__(self, limit: int = 20_000):
        self.limit = limit
        self._lock = threading.Lock()
        self._starts: OrderedDict[tuple, RaterStart] = OrderedDict()
        self._states: OrderedDict[tuple, OnlinePosterior] = OrderedDict()
        self.hits = self.misses = 0  # full posteriors found / computed (for tests and benchmarks)

    @staticmethod
    def _get(table: OrderedDict, key):
        value = table.get(key)
        if value is not None:
            table.move_to_end(key)
        return value

    def _put(self, table: OrderedDict, key, value) -> None:
        table[key] = value
        while len(table) > self.limit:
            table.popitem(last=False)

    def posterior(self, model, rater_id: str, traits, traits_key: Hashable, answers_key: Hashable,
                  build: Callable[[OnlinePosterior], OnlinePosterior]) -> OnlinePosterior:
        """The rater's posterior for these keys: cached, else `build(the rater's start state)` (which adds
        the answers the answers key names) is run and kept. `traits`: a trait table or a function making
        one, called only when the rater's start is not cached."""
        key = (str(rater_id), traits_key, answers_key)
        with self._lock:
            state = self._get(self._states, key)
            start = None if state is not None else self._get(self._starts, key[:2])
        if state is not None:
            self.hits += 1
            return state.copy()
        if start is None:
            start = rater_start(model, rater_id, traits() if callable(traits) else traits)
        state = build(OnlinePosterior(model, rater_id, start=start))
        with self._lock:
            self._put(self._starts, key[:2], start)
            self._put(self._states, key, state.copy())
            self.misses += 1
        return state


class LivePredictor:
    """Live predictions of one compiled version (`CompiledBundle`) for one rater at a time. Its posteriors
    are cached (`posteriors`, a PosteriorCache): dropped with it when another version is served."""

    def __init__(self, compiled: CompiledBundle):
        check_live(compiled.personalized)
        self.compiled = compiled
        self.model = compiled.personalized
        self.version = compiled.version
        self._g_mean = np.array([e.g_mean_ for e in self.model.effects_])
        self._known = _link_arrays(self.model.links_known_)
        self._cold = _link_arrays(self.model.links_cold_)
        # item key hash -> (g, shift, direction values or None)
        self._score_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        self._n_base = 2 if self.model.slopes else 1  # the rater coefficients before any direction's slope
        self.posteriors = PosteriorCache()

    SCORE_CACHE = 200_000  # rated turns whose text scores are kept (about 130 bytes each with 8 controls)

    def new_answers(self, rated_columns: dict) -> np.ndarray:
        """Which rated items the version has not trained on (their answers would otherwise count twice)."""
        return self._new(self._keys(rated_columns))

    @staticmethod
    def _keys(columns: dict) -> np.ndarray:
        return item_key_hashes(columns["conversation_id"], columns["turn_index"], columns["rater_id"])

    def _new(self, keys: np.ndarray) -> np.ndarray:
        trained = self.model.trained_keys_  # sorted hashes of the trained task keys
        at = np.minimum(np.searchsorted(trained, keys), max(len(trained) - 1, 0))
        return ~(trained[at] == keys) if len(trained) else np.ones(len(keys), dtype=bool)

    def _scores(self, rated_columns, keys: np.ndarray, rows: np.ndarray) -> tuple:
        """(text scores, assistant shifts), each (len(rows), controls), and the rater directions' values
        (len(rows), controls, directions; None without directions) of the rated turns `rows` of
        `rated_columns` (item columns, or a function making them) whose item-key hashes are `keys`. A rated
        turn's scores never change within a version, so each is computed once per process: a page then
        scores only the turns answered since the rater's last page, not all of their answers again."""
        cache = self._score_cache
        missing = [int(i) for i in rows if int(keys[i]) not in cache]
        if missing:
            columns = rated_columns() if callable(rated_columns) else rated_columns
            part = {name: [values[i] for i in missing] for name, values in columns.items()}
            g, shift = self.compiled.text_scores(part), self.compiled.assistant_shifts(part["assistant_id"])
            values = self.model.rater_direction_values(part)
            if len(cache) + len(missing) > self.SCORE_CACHE:
                cache.clear()
            for row, i in enumerate(missing):
                cache[int(keys[i])] = (g[row], shift[row], None if values is None else values[row])
        found = [cache[int(keys[i])] for i in rows]
        values = None if found[0][2] is None else np.array([f[2] for f in found])
        return np.array([f[0] for f in found]), np.array([f[1] for f in found]), values

    def posterior(self, rater_id: str, traits, rated_columns, ratings: np.ndarray,
                  traits_key: Hashable = None, rated_ids: dict | None = None) -> OnlinePosterior:
        """The rater's posterior after their answers to `rated_columns` (item columns, sense7.data.items)
        with `ratings` (n, controls in the compiled bundle's order; NaN where unrated), from `posteriors`
        when these answers and traits were seen before.

        traits: a trait table holding the rater (or None), or a function making it (called only when the
        rater's start is not cached); traits_key: what identifies those traits (e.g. the raw answers they
        were made from), required with a function, else the table's row (`traits_fingerprint`).
        rated_columns may also be a function making them (called only when some rated turn's text scores
        are not cached); then `rated_ids` (conversation_id, turn_index, rater_id lists) names the turns."""
        if callable(traits) and traits_key is None:
            traits = traits()
        if not callable(traits) and traits_key is None:
            traits_key = traits_fingerprint(traits, rater_id)
        if callable(rated_columns) and rated_ids is None:
            rated_columns = rated_columns()
        ids = rated_ids if rated_ids is not None else rated_columns
        ratings = np.atleast_2d(np.asarray(ratings, dtype=float))
        if len(ids["rater_id"]):
            keys = self._keys(ids)
            rows = np.flatnonzero(self._new(keys))
        else:
            keys, rows = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        counted = ratings[rows] if len(rows) else np.zeros((0, len(self.compiled.controls)))
        answers_key = (keys[rows].tobytes(), counted.shape, counted.tobytes())

        def build(state: OnlinePosterior) -> OnlinePosterior:
            if len(rows):
                g, shift, values = self._scores(rated_columns, keys, rows)
                state.update_many(g, counted, shift, values)
            return state

        return self.posteriors.posterior(self.model, rater_id, traits, traits_key, answers_key, build)

    def predict(self, columns: dict, rater_id: str, traits, rated_columns,
                ratings: np.ndarray, traits_key: Hashable = None, rated_ids: dict | None = None
                ) -> LivePrediction | None:
        """Predictions of `columns` (items of this rater) with the posterior after their answers; None when
        no answer is new to the version (then the static prediction is exactly what they get). `traits`,
        `traits_key`, `rated_columns`, `rated_ids`: as for `posterior`."""
        state = self.posterior(rater_id, traits, rated_columns, ratings, traits_key, rated_ids)
        if state.n_ratings == 0:
            return None
        return LivePrediction(self.predict_with(state, columns), state.n_ratings, state.kind)

    def predict_with(self, state: OnlinePosterior, columns: dict) -> Predictions:
        """Predictions of `columns` for the rater of `state` with its current posterior.

        Which ordinal link: the version has two per control, one for known raters (fitted on leave-one-out
        posteriors, sharper) and one for raters with traits only (flatter). A rater gains the known link's
        sharpness as far as their own ratings have informed their leniency: the links' thresholds and scale
        are blended with weight 1 - posterior variance / prior variance of the intercept (0 with no rating,
        so a rater without answers gets exactly the static prediction; near 1 after many). Known raters use
        the known link, as served. With weight 1 this is `CompiledBundle.predict` with the rater known."""
        g = self.compiled.text_scores(columns)
        coef = state.coef()
        shift = coef[:, 0][None] + (coef[:, 1][None] * (g - self._g_mean) if self.model.slopes else 0.0)
        if coef.shape[1] > self._n_base:  # slopes on the rater directions, as CompiledBundle.predict
            shift = shift + np.einsum("cd,icd->ic", coef[:, self._n_base:], self.model.rater_direction_values(columns))
        # A known rater's own content weights (rater_ridge) stay as the version has them: live answers move
        # their leniency (and slope), as the version's effects were fitted before those weights.
        scores = g + shift + self.compiled.assistant_shifts(columns["assistant_id"])
        content = self.compiled.content_shifts(columns, [state.rater_id] * len(g))
        if content is not None:
            scores = scores + content
        weight = state.information_share()[:, None]
        thresholds = (1 - weight) * self._cold[0] + weight * self._known[0]
        scale = (1 - weight[:, 0]) * self._cold[1] + weight[:, 0] * self._known[1]
        probs = cumulative_logit_proba(thresholds, scale, scores)
        kind = LIVE_KIND if state.n_ratings else state.kind
        return Predictions([kind] * len(probs), probs, self.compiled.levels)
