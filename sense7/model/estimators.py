"""Rater models with a scikit-learn interface.

`GenericRater`: what an average rater would say about a turn, from the text, the context and the position.
`PersonalizedRater`: the same text model plus per-rater, per-control effects (leniency and sensitivity)
shrunk toward what the rater's traits predict (see `sense7.model.rater_effects`).

Both regress a continuous score per control (ridge on sparse features), then turn it into calibrated
probabilities over the ordered levels with a cumulative-logit link fitted on out-of-fold scores. Levels
and controls come from Y, so a 1-7 scale works as well as the taxonomy's 1-5.
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import NamedTuple

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.stats import norm
from sklearn.base import BaseEstimator
from sklearn.model_selection import GroupKFold

from sense7.model.features import ItemFeatures

# Scale of the relational features (sense7.data.items.RELATIONAL_COLUMNS, and a text encoder's similarities
# of the turn with the message it answers) in both rater models; 0 = off; "cv": chosen on the training rows
# from RELATIONAL_WEIGHTS (with the text penalty, when that is "cv" too), RELATIONAL_SCALE where the model
# does not choose (a backfitting round before the last, or too few conversations for folds).
# docs/BENCHMARKS.md ("Model quality") has the measurements these defaults follow.
# The text encoder beside the n-grams by default (sense7.model.features.TEXT_ENCODER_NAMES; None: n-grams
# only). "static" (token embeddings distilled from the packaged MiniLM, sense7.model.static_embeddings) with
# relational_weight="cv" was measured as a default on WASSA (known raters 0.510 against 0.520, cold start
# 0.226 against 0.221; docs/BENCHMARKS.md) and costs fit time: it stays an option until the evidence says so.
# Issue 39 tried it again with encoder_weight="cv", alpha="cv" and rater directions in the encoder's columns:
# ConvAbuse improves on every score, but WASSA's known raters stay at 0.476-0.515 (the bar for a new
# default is 0.53), so the default stays n-grams ("Text encoders" in docs/BENCHMARKS.md).
TEXT_ENCODER = None
RELATIONAL_WEIGHT = 0.0
RELATIONAL_WEIGHTS = (0.0, 0.3, 1.0)
RELATIONAL_SCALE = 0.3
# The text encoder's block against the n-grams (ItemFeatures.encoder_weight): 1 = both blocks at unit
# typical row norm under one penalty; "cv": chosen on the training rows from ENCODER_WEIGHTS (0: n-grams
# only), together with the relational scale and the text penalty; 1 where the model does not choose.
ENCODER_WEIGHT = 1.0
ENCODER_WEIGHTS = (0.0, 0.5, 1.0, 2.0)
# The text ridge's penalty (alpha) by default, and the candidates alpha="cv" chooses from.
DEFAULT_ALPHA = 10.0
TEXT_ALPHAS = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
from sense7.model.ordinal import OrdinalLink
from sense7.model.rater_effects import AssistantEffects, RaterEffects, assistant_keys
from sense7.model.rater_ridge import RATER_RIDGE_CHOICES, RaterResidualRidge
from sense7.model.ridge import multi_ridge


class ControlPrediction(NamedTuple):
    """A NamedTuple, not a dataclass: the backend builds 8 per predicted turn and tuples are cheapest."""

    probs: np.ndarray  # one probability per level, sums to 1
    expected: float  # expected rating under probs
    level: int  # most likely level
    confidence: float  # probability of `level`, in [0, 1]


def item_key_hashes(conversation_ids, turn_indices, rater_ids) -> np.ndarray:
    """64-bit hashes (uint64) of the task keys conversation::turn::rater of items (blake2b, 8 bytes)."""
    return np.array([int.from_bytes(hashlib.blake2b(f"{c}::{int(t)}::{r}".encode(), digest_size=8).digest(), "big")
                     for c, t, r in zip(conversation_ids, turn_indices, rater_ids)], dtype=np.uint64)


def _levels_of(Y: pd.DataFrame) -> np.ndarray:
    values = Y.to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        raise ValueError("Y has no ratings")
    if not np.allclose(values, np.round(values)):
        raise ValueError("ratings must be whole levels")
    return np.arange(int(values.min()), int(values.max()) + 1)


class _RaterModel(BaseEstimator):
    """Shared machinery: text scores per control, the ordinal link, the prediction formats."""

    encoder_weight = ENCODER_WEIGHT  # what a model saved before the parameter existed had

    def __init__(self, text_features, alpha, max_features, history_chars, text_weighting, context_weight,
                 target_scale, context_interactions, cv, assistant_effects, levels, relational_weight, text_encoder,
                 encoder_weight=ENCODER_WEIGHT):
        """The parameters both rater models share, kept as given (sklearn's contract: __init__ only stores;
        each subclass's own signature is what get_params reads)."""
        self.text_features = text_features
        self.alpha = alpha
        self.max_features = max_features
        self.history_chars = history_chars
        self.text_weighting = text_weighting
        self.context_weight = context_weight
        self.target_scale = target_scale
        self.context_interactions = context_interactions
        self.cv = cv
        self.assistant_effects = assistant_effects
        self.levels = levels
        self.relational_weight = relational_weight
        self.text_encoder = text_encoder
        self.encoder_weight = encoder_weight

    def _check_fit_input(self, X: pd.DataFrame, Y: pd.DataFrame):
        if len(X) != len(Y):
            raise ValueError(f"X has {len(X)} rows but Y has {len(Y)}")
        self.controls_ = [str(c) for c in Y.columns]
        self.levels_ = np.asarray(self.levels) if self.levels is not None else _levels_of(Y)
        values = Y.to_numpy(dtype=float)
        outside = np.isfinite(values) & ~np.isin(values, self.levels_)
        if outside.any():
            raise ValueError(f"Y holds {values[outside][0]:g}, which is not one of the levels {list(self.levels_)}")
        return values

    def _fit_target_scale(self, Yv: np.ndarray) -> np.ndarray:
        """The regression target: the rating itself, or (target_scale="normal") each level's normal score
        under the control's training distribution, which evens out a scale crowded at one end (WASSA:
        57% of ratings are 7). The ordinal link maps scores back to levels either way."""
        if self.target_scale == "rating":
            self.target_values_ = np.tile(np.asarray(self.levels_, dtype=float), (Yv.shape[1], 1))
            return Yv
        if self.target_scale != "normal":
            raise ValueError(f"target_scale must be rating or normal, got {self.target_scale!r}")
        out = np.full(Yv.shape, np.nan)
        # The target of each level per control (controls, levels): how a later rating maps onto the scale the
        # rater effects were fitted on (sense7.model.live_posterior updates a rater's posterior with it).
        self.target_values_ = np.zeros((Yv.shape[1], len(self.levels_)))
        for c in range(Yv.shape[1]):
            rated = np.isfinite(Yv[:, c])
            counts = np.array([(Yv[rated, c] == level).sum() for level in self.levels_], dtype=float) + 0.5
            cdf = np.cumsum(counts) / counts.sum()
            mid = norm.ppf(cdf - counts / counts.sum() / 2)  # mid-rank of each level
            self.target_values_[c] = mid
            out[rated, c] = mid[np.searchsorted(self.levels_, Yv[rated, c])]
        return out

    def _fit_text(self, X: pd.DataFrame, Yv: np.ndarray, choose_alpha: bool = True) -> np.ndarray:
        """Fit the text ridge per control; return out-of-fold scores (NaN where unrated).

        Folds group by conversation, so a turn's score never comes from a model that saw its conversation.
        All controls and folds are solved together (sense7.model.ridge). With alpha="cv", choose_alpha=False
        uses DEFAULT_ALPHA instead of choosing (the personalized model chooses in its last backfitting
        round only, on the targets its final text model is fitted on).
        """
        self.features_ = ItemFeatures(self.text_features, max_features=self.max_features,
                                      history_chars=self.history_chars,
                                      text_weighting=self.text_weighting, context_weight=self.context_weight,
                                      context_interactions=self.context_interactions,
                                      relational_weight=self.relational_weight,
                                      text_encoder=self.text_encoder,
                                      encoder_weight=getattr(self, "encoder_weight", ENCODER_WEIGHT))
        F = self.features_.fit_transform(X)
        groups = X["conversation_id"].astype(str).to_numpy()
        rated = np.isfinite(Yv)
        n, C = Yv.shape
        n_splits = min(self.cv, len(np.unique(groups)))
        folds = list(GroupKFold(n_splits=n_splits).split(F, groups=groups)) if n_splits >= 2 else []
        weights = [rated.astype(float)]
        for train, _ in folds:
            in_train = np.zeros(n, dtype=bool)
            in_train[train] = True
            weights.append((rated & in_train[:, None]).astype(float))
        if getattr(self, "relational_weight", 0.0) == "cv" or self._encoder_weight_cv():
            F = self._choose_relational_scale(F, Yv, weights, folds if choose_alpha else [])
        else:
            self.alpha_ = self._choose_alpha(F, Yv, weights, folds if choose_alpha else [])
        targets = np.tile(Yv, (1, len(weights)))
        coef, intercept = multi_ridge(F, targets, np.hstack(weights), np.tile(self.alpha_, len(weights)))
        self.text_coef_, self.text_intercept_ = coef[:, :C].astype(np.float32), intercept[:C]
        if getattr(self, "rater_directions", 0) or getattr(self, "rater_ridge", None) is not None:
            # The rater directions and the raters' own ridges are learned on it (PersonalizedRater).
            self._train_features = F
            self._train_groups = groups
        if not folds:  # too few conversations to hold any out: in-sample scores (links become overconfident)
            oof = np.asarray(F @ coef[:, :C]) + intercept[:C]
        else:
            oof = np.full(Yv.shape, np.nan)
            for f, (_, test) in enumerate(folds, start=1):
                block = slice(f * C, (f + 1) * C)
                oof[test] = np.asarray(F[test] @ coef[:, block]) + intercept[block]
        return np.where(rated, oof, np.nan)

    def _encoder_weight_cv(self) -> bool:
        """Whether the encoder block's weight is chosen in fit (encoder_weight="cv" and an encoder)."""
        return getattr(self, "encoder_weight", ENCODER_WEIGHT) == "cv" \
            and (self.features_.vectorizers_ or {}).get("encoder") is not None

    def _choose_relational_scale(self, F, Yv: np.ndarray, weights: list, folds: list):
        """relational_weight="cv" and/or encoder_weight="cv": the relational columns' scale and the encoder
        block's weight (one each for all controls, the features being shared) and the text penalty per
        control, chosen together: the pair of RELATIONAL_WEIGHTS x ENCODER_WEIGHTS (a fixed value where not
        "cv") whose best penalties (TEXT_ALPHAS with alpha="cv", else alpha itself) leave the least squared
        error out of fold, on the training rows only (the folds the scores are made on). Sets
        features_.relational_scale_ (and relational_weight_) and the encoder's scale (features_.encoder_scale_)
        when chosen, and alpha_; returns F with the chosen scales (F was built at scale 1 for what is chosen)."""
        relational_cv = getattr(self, "relational_weight", 0.0) == "cv"
        encoder_cv = self._encoder_weight_cv()
        relational = self.features_.relational_column_indices()
        encoder = np.zeros(0, dtype=np.int64)
        if encoder_cv:
            block = self.features_.block_columns("encoder")
            encoder = np.arange(block.start, block.stop)

        def scaled(rel_weight, enc_weight):
            factors = np.ones(F.shape[1], dtype=np.float32)
            if relational_cv:
                factors[relational] = rel_weight
            factors[encoder] = enc_weight
            return (F @ sp.diags(factors)).tocsr()

        rel_candidates = RELATIONAL_WEIGHTS if relational_cv else (None,)
        enc_candidates = ENCODER_WEIGHTS if encoder_cv else (1.0,)
        if not folds:
            choice = (RELATIONAL_SCALE if relational_cv else None, ENCODER_WEIGHT)
            self.alpha_ = self._choose_alpha(F, Yv, weights, [])
        else:
            if isinstance(self.alpha, str) and self.alpha != "cv":
                raise ValueError(f"alpha must be a number or 'cv', got {self.alpha!r}")
            alphas = TEXT_ALPHAS if self.alpha == "cv" else (float(self.alpha),)
            best = None
            for rel_weight in rel_candidates:
                for enc_weight in enc_candidates:
                    errors = self._cv_errors(scaled(rel_weight, enc_weight), Yv, weights, folds, alphas)
                    total = float(errors.min(axis=0).sum())
                    if best is None or total < best[0]:
                        best = (total, (rel_weight, enc_weight),
                                np.asarray(alphas, dtype=float)[errors.argmin(axis=0)])
            _, choice, self.alpha_ = best
        if relational_cv:
            self.features_.relational_scale_ = self.relational_weight_ = float(choice[0])
        if encoder_cv:
            self.features_.set_encoder_scale(choice[1])
            self.encoder_weight_ = float(choice[1])
        return scaled(*choice)

    def _cv_errors(self, F, Yv: np.ndarray, weights: list, folds: list, alphas) -> np.ndarray:
        """(len(alphas), C) the summed squared error of the out-of-fold scores with each penalty: all
        penalties, folds and controls in one solve."""
        C = Yv.shape[1]
        fold_weights = np.hstack(weights[1:])  # (n, folds * C)
        K = fold_weights.shape[1]
        coef, intercept = multi_ridge(F, np.tile(Yv, (1, len(folds) * len(alphas))),
                                      np.tile(fold_weights, (1, len(alphas))), np.repeat(alphas, K))
        errors = np.zeros((len(alphas), C))
        for a in range(len(alphas)):
            for f, (_, test) in enumerate(folds):
                block = slice(a * K + f * C, a * K + (f + 1) * C)
                err = np.asarray(F[test] @ coef[:, block]) + intercept[block] - Yv[test]
                errors[a] += np.nansum(err ** 2, axis=0)
        return errors

    def _choose_alpha(self, F, Yv: np.ndarray, weights: list, folds: list) -> np.ndarray:
        """The text ridge's penalty per control (C,): `alpha` itself, or (alpha="cv") the candidate of
        TEXT_ALPHAS with the least squared error of the out-of-fold scores on the same folds (grouped by
        conversation) the scores are made on, i.e. on the training rows only; all candidates, folds and
        controls in one solve. Without folds (none given, or too few conversations): DEFAULT_ALPHA."""
        C = Yv.shape[1]
        if not isinstance(self.alpha, str):
            return np.full(C, float(self.alpha))
        if self.alpha != "cv":
            raise ValueError(f"alpha must be a number or 'cv', got {self.alpha!r}")
        if not folds:
            return np.full(C, float(DEFAULT_ALPHA))
        errors = self._cv_errors(F, Yv, weights, folds, TEXT_ALPHAS)
        return np.asarray(TEXT_ALPHAS, dtype=float)[errors.argmin(axis=0)]

    def text_scores(self, X: pd.DataFrame) -> np.ndarray:
        """(n, controls) the text model's scores (text, history, position, context), before any rater."""
        F = self.features_.transform(X)
        # In float64 (F's float32 values times float64 coefficients): a dense encoder block sums hundreds of
        # terms per row, and float32 sums drift from the compiled path's (sense7.model.serving) by ~1e-6.
        return np.asarray(F @ self.text_coef_.astype(np.float64)) + self.text_intercept_

    def _fit_link(self, scores, y) -> OrdinalLink:
        return OrdinalLink(self.levels_).fit(scores, y)

    def _assistant_shift(self, effects: list, X: pd.DataFrame) -> np.ndarray:
        """(n, controls): each item's shrunk assistant effect per control (0: unknown / unseen / off)."""
        out = np.zeros((len(X), len(self.controls_)))
        if any(e is not None for e in effects):
            keys = assistant_keys(X)
            for j, effect in enumerate(effects):
                if effect is not None:
                    out[:, j] = effect.effect(keys)
        return out

    # -- prediction formats -------------------------------------------------------------------------

    def predict_proba(self, X: pd.DataFrame) -> dict:
        """{control: ndarray (n, n_levels)}; each row sums to 1."""
        return self._proba(X)

    def predict_expected(self, X: pd.DataFrame) -> pd.DataFrame:
        """Expected rating per control (the best score for rank correlations)."""
        probs = self._proba(X)
        return pd.DataFrame({c: p @ self.levels_ for c, p in probs.items()}, index=X.index)

    def predict(self, X: pd.DataFrame) -> pd.DataFrame:
        """Most likely level per control."""
        probs = self._proba(X)
        return pd.DataFrame({c: self.levels_[p.argmax(axis=1)] for c, p in probs.items()}, index=X.index)

    def predict_controls(self, X: pd.DataFrame) -> list[dict]:
        return controls_from_proba(self._proba(X), self.levels_)


def controls_from_proba(probs: dict, levels: np.ndarray) -> list[dict]:
    """Per row {control: ControlPrediction}. The arithmetic is vectorised; the objects are built by
    C-level map/zip calls (tuple.__new__ skips the NamedTuple's Python __new__), which is most of what
    predicting a batch costs once the text is tokenized."""
    make = partial(tuple.__new__, ControlPrediction)
    per_control = []
    for p in probs.values():
        best = p.argmax(axis=1)
        fields = zip(list(p), (p @ levels).tolist(), levels[best].tolist(), p[np.arange(len(p)), best].tolist())
        per_control.append(list(map(make, fields)))
    controls = list(probs)
    return [dict(zip(controls, row)) for row in zip(*per_control)]


class GenericRater(_RaterModel):
    """Text + context + position only: the same prediction for every rater.

    assistant_effects: add a shrunk per-assistant effect (X's optional `assistant_id`: who is rated, e.g. a
    model version; in WASSA the other person), learned in fit from the training rows' residuals
    (sense7.model.rater_effects.AssistantEffects); unknown or unseen assistants get 0. Not rater-specific.
    alpha: the text ridge's penalty, or "cv" (chosen per control by inner cross-validation on the training
    rows, see _choose_alpha).
    """

    def __init__(self, text_features: str = "tfidf", alpha: float | str = DEFAULT_ALPHA, max_features: int = 30000,
                 history_chars: int = 300, text_weighting: str = "presence",
                 context_weight: float = 0.1, target_scale: str = "normal",
                 context_interactions: bool = False, cv: int = 3, assistant_effects: bool = True,
                 levels=None, relational_weight: float | str = RELATIONAL_WEIGHT, text_encoder=TEXT_ENCODER,
                 encoder_weight: float | str = ENCODER_WEIGHT):
        super().__init__(text_features, alpha, max_features, history_chars, text_weighting, context_weight,
                         target_scale, context_interactions, cv, assistant_effects, levels, relational_weight,
                         text_encoder, encoder_weight)

    def fit(self, X: pd.DataFrame, Y: pd.DataFrame):
        Yv = self._check_fit_input(X, Y)
        Tv = self._fit_target_scale(Yv)
        oof = self._fit_text(X, Tv)
        keys = assistant_keys(X) if self.assistant_effects else None
        if keys is not None and not any(k is not None for k in keys):
            keys = None  # no assistant is known: nothing to learn
        self.links_, self.assistant_effects_ = [], []
        for c in range(Yv.shape[1]):
            rated = np.isfinite(Yv[:, c])
            scores, effect = oof[rated, c], None
            if keys is not None:
                # The assistant's shrunk effect on the text model's residual (training rows only); the link
                # sees each row's leave-one-out effect, as a new rating of that assistant would.
                resid = Tv[rated, c] - scores
                effect = AssistantEffects().fit(keys[rated], resid)
                scores = scores + effect.loo_effect(keys[rated], resid)
            self.assistant_effects_.append(effect)
            self.links_.append(self._fit_link(scores, Yv[rated, c]))
        return self

    def _proba(self, X):
        scores = self.text_scores(X)
        if getattr(self, "assistant_effects_", None):
            scores = scores + self._assistant_shift(self.assistant_effects_, X)
        return {c: self.links_[j].predict_proba(scores[:, j]) for j, c in enumerate(self.controls_)}


class PersonalizedRater(_RaterModel):
    """Generic text model + per-rater effects shrunk toward the trait prediction.

    slopes: also learn a rater-specific sensitivity (how much the rater's ratings move with the text
    score), shrunk the same way. backfit: rounds of refitting the text model on ratings with each rater's
    leniency removed. pool_controls: estimate a general leniency over all controls first. noise_prior:
    give each rater their own noise variance, shrunk toward the pooled one with this many pseudo-ratings
    (None = one shared variance). Raters with ratings in `fit` are "known"; any other rater is predicted
    from the trait columns of X (missing traits count as average).
    assistant_effects: also a shrunk per-assistant effect (as in GenericRater), fitted alternately with
    the rater effects on training rows only; unknown or unseen assistants get 0.

    rater_directions: r > 0 gives each rater, per control, a slope on r directions in the text features,
    learned from the residuals (the feature directions along which the raters' own residual ridges differ
    most, see _fit_directions), with the same trait prior and empirical-Bayes shrinkage as the intercept,
    so raters with the same leniency can differ in what moves them (one punishes a forgotten detail more
    than another); a new rater gets what the traits predict. (A slope on the score itself cannot change
    how a rater's turns rank; these can.) 0 (default): see docs/BENCHMARKS.md for the measurements.
    rater_directions_from: the features the directions are learned in: "text" (every text feature) or
    "encoder" (the text encoder's columns only, e.g. 384 sentence-embedding dimensions instead of ~30,000
    n-grams: fewer coefficients per rater to learn from a rater's few ratings).
    rater_ridge: each known rater's own content model, per control: a ridge of what the text model and the
    rater's leniency and slope leave, on the features of `rater_ridge_from`, shrunk toward 0 (the population)
    with one penalty per control (sense7.model.rater_ridge.RaterResidualRidge). "cv": the penalty is chosen
    by inner cross-validation on the training rows (folds by conversation) from a grid that includes "off",
    so a control where raters' own weights do not predict held-out ratings keeps leniency only; "cv_rater":
    the same, each rater's penalty (or off) chosen on their own held-out ratings; "cv_rater_1se": the same
    with the one-standard-error rule (a rater's weights only when they beat off by more than the standard
    error of the difference on their held-out ratings); a number:
    that penalty. A rater with a dozen ratings gets weights near 0 either way; a new rater gets none.
    None (default): off. rater_ridge_from: "encoder" (the text encoder's columns, e.g. 384 sentence-embedding
    dimensions; needs a text_encoder) or "text" (every text feature; memory: features x raters x controls).

    Shared with GenericRater: text_features / text_weighting / max_features / history_chars /
    context_weight / context_interactions / relational_weight / text_encoder
    (sense7.model.features.ItemFeatures), alpha (the text ridge's penalty, or "cv": chosen per control by
    inner cross-validation on the training rows, see _choose_alpha),
    cv (folds, grouped by conversation, for the out-of-fold scores the links and rater effects are fitted
    on), target_scale ("normal": regress each level's normal score, see _fit_target_scale), levels
    (default: read from Y).
    """

    def __init__(self, text_features: str = "tfidf", alpha: float | str = DEFAULT_ALPHA, max_features: int = 30000,
                 history_chars: int = 300, text_weighting: str = "presence",
                 context_weight: float = 0.1, target_scale: str = "normal",
                 context_interactions: bool = False, cv: int = 3, slopes: bool = True, pool_controls: bool = False,
                 backfit: int = 1, noise_prior: float | None = None, assistant_effects: bool = True,
                 levels=None, relational_weight: float | str = RELATIONAL_WEIGHT, text_encoder=TEXT_ENCODER,
                 rater_directions: int = 0, rater_directions_from: str = "text", rater_ridge=None,
                 rater_ridge_from: str = "encoder", encoder_weight: float | str = ENCODER_WEIGHT):
        super().__init__(text_features, alpha, max_features, history_chars, text_weighting, context_weight,
                         target_scale, context_interactions, cv, assistant_effects, levels, relational_weight,
                         text_encoder, encoder_weight)
        self.rater_ridge = rater_ridge
        self.rater_ridge_from = rater_ridge_from
        self.rater_directions = rater_directions
        self.rater_directions_from = rater_directions_from
        self.slopes = slopes
        self.pool_controls = pool_controls
        self.backfit = backfit
        self.noise_prior = noise_prior

    # -- traits as a standardized matrix with an intercept column ------------------------------------

    ASSISTANT_ROUNDS = 3

    def _fit_traits(self, X: pd.DataFrame):
        traits = X[[c for c in X.columns if c.startswith("trait_")]]
        per_rater = traits.groupby(X["rater_id"].astype(str).to_numpy(), sort=True).first()
        usable = [c for c in per_rater.columns if per_rater[c].notna().sum() >= 2 and per_rater[c].std() > 0]
        self.trait_columns_ = usable
        self.trait_mean_ = per_rater[usable].mean().to_numpy(dtype=float)
        self.trait_scale_ = per_rater[usable].std().to_numpy(dtype=float)
        return per_rater

    def trait_matrix(self, traits: pd.DataFrame) -> np.ndarray:
        """Traits standardized as in training (0 where unknown), after an intercept column: the Z the
        rater effects' trait prior reads."""
        values = traits.reindex(columns=self.trait_columns_).to_numpy(dtype=float)
        z = (values - self.trait_mean_) / self.trait_scale_
        return np.column_stack([np.ones(len(values)), np.nan_to_num(z, nan=0.0)])

    def _fit_directions(self, residual: np.ndarray, rows_all: np.ndarray, n_raters: int) -> np.ndarray | None:
        """The rater directions, learned from what the text model and each rater's leniency and slope leave
        unexplained: per control and rater a ridge of the residuals on the text features (one batched solve,
        sense7.model.ridge), and per control the rater_directions leading principal directions of the raters'
        coefficients around their average (each rater weighted by their ratings), i.e. the feature
        directions along which raters differ most in what moves them. Returns the training items' values
        (n, controls, r), centered and scaled to unit variance; sets direction_coef_ (features, controls * r).
        Memory: the batched solve holds (n, controls * raters) weights, e.g. 1.3 GB for 100k items, 8 controls
        and 200 raters (one reason the option is off by default)."""
        F = self._train_features
        columns = slice(None)
        if getattr(self, "rater_directions_from", "text") == "encoder":
            if "encoder" not in self.features_.vectorizers_ or self.features_.vectorizers_["encoder"] is None:
                raise ValueError("rater_directions_from='encoder' needs a text_encoder")
            columns = self.features_.block_columns("encoder")
        elif self.rater_directions_from != "text":
            raise ValueError(f"rater_directions_from must be text or encoder, got {self.rater_directions_from!r}")
        width = F.shape[1]
        F = F[:, columns]
        n, C = residual.shape
        r = int(self.rater_directions)
        known = rows_all >= 0
        targets = np.repeat(np.nan_to_num(residual), n_raters, axis=1)  # column c * R + rater
        weights = np.zeros((n, C * n_raters))
        for c in range(C):
            rated = np.isfinite(residual[:, c]) & known
            weights[np.flatnonzero(rated), c * n_raters + rows_all[rated]] = 1.0
        coef, _ = multi_ridge(F, targets, weights, float(np.median(self.alpha_)))
        counts = weights.sum(axis=0).reshape(C, n_raters)
        basis = np.zeros((F.shape[1], C, r))
        for c in range(C):
            B = coef[:, c * n_raters:(c + 1) * n_raters]
            w = counts[c] / max(counts[c].sum(), 1.0)
            centered = (B - B @ w[:, None]) * np.sqrt(w)
            u, _, _ = np.linalg.svd(centered, full_matrices=False)
            basis[:, c, :u.shape[1]] = u[:, :r]
        full = np.zeros((width, C * r), dtype=np.float32)  # 0 on the columns the directions do not use
        full[columns] = basis.reshape(F.shape[1], C * r)
        self.direction_coef_ = full
        values = np.asarray(F @ full[columns], dtype=float).reshape(n, C, r)
        self.direction_mean_ = values.mean(axis=0)
        scale = values.std(axis=0)
        self.direction_scale_ = np.where(scale > 0, scale, 1.0)
        return (values - self.direction_mean_) / self.direction_scale_

    def _rater_ridge_columns(self) -> slice:
        if self.rater_ridge_from == "encoder":
            if (self.features_.vectorizers_ or {}).get("encoder") is None:
                raise ValueError("rater_ridge_from='encoder' needs a text_encoder")
            return self.features_.block_columns("encoder")
        if self.rater_ridge_from != "text":
            raise ValueError(f"rater_ridge_from must be encoder or text, got {self.rater_ridge_from!r}")
        return slice(None)

    def _fit_rater_ridge(self, items: np.ndarray, rows: np.ndarray, resid: np.ndarray,
                         n_raters: int) -> RaterResidualRidge:
        if isinstance(self.rater_ridge, str):
            if self.rater_ridge not in RATER_RIDGE_CHOICES:
                raise ValueError(f"rater_ridge must be None, {', '.join(RATER_RIDGE_CHOICES)} or a penalty, "
                                 f"got {self.rater_ridge!r}")
            alpha = None
        else:
            alpha = float(self.rater_ridge)
        F = self._train_features[:, self._rater_ridge_columns()][items]
        return RaterResidualRidge(alpha=alpha, n_folds=max(int(self.cv), 2),
                                  per_rater=self.rater_ridge in ("cv_rater", "cv_rater_1se"),
                                  one_se=self.rater_ridge == "cv_rater_1se").fit(
            F, rows, resid, self._train_groups[items], n_raters)

    def rater_content_features(self, X):
        """The features of the items of X (a frame or plain item columns) that the raters' own content
        weights (rater_ridge) read."""
        F = self.features_.transform(X)[:, self._rater_ridge_columns()]
        return F.tocsr() if sp.issparse(F) else F

    def rater_content_shifts(self, X, rater_rows: np.ndarray, features=None) -> np.ndarray | None:
        """(n, controls) each row's shift from its rater's own content weights (rater_ridge; 0 for new
        raters); None without them. `features`: rater_content_features(X), when the caller has them."""
        if getattr(self, "rater_ridges_", None) is None:
            return None
        F = self.rater_content_features(X) if features is None else features
        return np.column_stack([ridge.predict(F, rater_rows) for ridge in self.rater_ridges_])

    def rater_direction_values(self, X) -> np.ndarray | None:
        """(n, controls, rater_directions) values of the items of X (a frame or plain item columns) on the
        directions each rater has a slope on (per control, learned in fit: _fit_directions), standardized as
        on the training items; None without rater directions."""
        if getattr(self, "direction_coef_", None) is None:
            return None
        values = np.asarray(self.features_.transform(X) @ self.direction_coef_, dtype=float)
        return (values.reshape(len(values), *self.direction_mean_.shape) - self.direction_mean_) / self.direction_scale_

    def fit(self, X: pd.DataFrame, Y: pd.DataFrame):
        Yv = self._check_fit_input(X, Y)
        Tv = self._fit_target_scale(Yv)
        per_rater = self._fit_traits(X)
        self.direction_coef_ = None
        self.rater_ridges_ = None
        self.known_raters_ = per_rater.index.to_numpy(dtype=object)
        Z = self.known_trait_matrix_ = self.trait_matrix(per_rater)
        rows_all = pd.Index(self.known_raters_).get_indexer(X["rater_id"].astype(str))
        # The task keys (conversation::turn::rater) trained on, as sorted 64-bit hashes (8 bytes an item in
        # a saved bundle): a live update must not count them twice (sense7.model.live_posterior).
        rated_any = np.isfinite(Yv).any(axis=1) & X["turn_index"].notna().to_numpy()
        self.trained_keys_ = np.unique(item_key_hashes(X["conversation_id"][rated_any], X["turn_index"][rated_any],
                                                       X["rater_id"][rated_any]))
        self.fit_keys_ = assistant_keys(X) if self.assistant_effects else None
        if self.fit_keys_ is not None and not any(k is not None for k in self.fit_keys_):
            self.fit_keys_ = None  # no assistant is known: nothing to learn (and no extra EM rounds)
        oof = self._fit_text(X, Tv, choose_alpha=self.backfit == 0)
        # Rater effects per control (optionally after a general leniency pooled over controls).
        self._fit_raters(Tv, Yv, oof, rows_all, Z, links=self.backfit == 0)
        for round_ in range(self.backfit):
            # Backfitting: refit the text model on ratings with each rater's leniency taken out, so words
            # are not credited with who happened to rate them; then the rater effects on the new scores.
            offsets = self.common_known_[rows_all][:, None] + self.rater_coef_[rows_all, :, 0] \
                + self.assistant_rows_
            oof = self._fit_text(X, Tv - offsets, choose_alpha=round_ == self.backfit - 1)
            self._fit_raters(Tv, Yv, oof, rows_all, Z, links=round_ == self.backfit - 1)
        # What GenericRater would learn from the same data (same text model, links on the same out-of-fold
        # scores): kept so a bundle gets both models from one text fit.
        self.generic_links_, self.generic_assistant_ = [], []
        for c in range(Yv.shape[1]):
            rated = np.isfinite(Yv[:, c])
            scores, effect = oof[rated, c], None
            if self.fit_keys_ is not None:  # as GenericRater(assistant_effects=True) fits it
                resid = Tv[rated, c] - scores
                effect = AssistantEffects().fit(self.fit_keys_[rated], resid)
                scores = scores + effect.loo_effect(self.fit_keys_[rated], resid)
            self.generic_assistant_.append(effect)
            self.generic_links_.append(self._fit_link(scores, Yv[rated, c]))
        self.fit_keys_ = None  # not needed after fit (keeps pickled bundles small)
        self._train_features = self._train_groups = None
        for effects in self.effects_:
            effects.compact()
        return self

    def _fit_raters(self, Tv, Yv, oof, rows_all, Z, links: bool = True):
        self.common_ = None
        self.common_known_ = np.zeros(len(Z))
        if self.pool_controls:
            item_resid = np.nanmean(Tv - oof, axis=1)
            has = np.isfinite(item_resid)
            self.common_ = RaterEffects(slopes=False).fit(rows_all[has], Z, np.zeros(has.sum()), item_resid[has])
            self.common_known_ = self.common_.posterior_[:, 0]
        common_cold = self.common_prior(Z)
        self.effects_, self.links_known_, self.links_cold_, coefs = [], [], [], []
        self.assistant_effects_ = []
        self.assistant_rows_ = np.zeros(Tv.shape)  # in-sample assistant effects, for backfitting
        if links:
            self.rater_ridges_ = [] if self.rater_ridge is not None else None
        directions = None
        if self.rater_directions and links:  # learned once, in the round whose effects are kept
            # What the text model, each rater's leniency and their slope leave: the directions are learned on it.
            residual = np.full(Tv.shape, np.nan)
            for c in range(Yv.shape[1]):
                rated = np.isfinite(Yv[:, c])
                g, rows = oof[rated, c], rows_all[rated]
                base = Tv[rated, c] - g - self.common_known_[rows]
                plain = RaterEffects(slopes=self.slopes, noise_prior=self.noise_prior).fit(rows, Z, g, base)
                residual[rated, c] = base - plain.adjust(g, plain.posterior_[rows])
            directions = self._fit_directions(residual, rows_all, len(Z))
        for c in range(Yv.shape[1]):
            rated = np.isfinite(Yv[:, c])
            g, y, t, rows = oof[rated, c], Yv[rated, c], Tv[rated, c], rows_all[rated]
            extra = None if directions is None else directions[rated, c]
            base = t - g - self.common_known_[rows]
            assist, a_rows, a_link = None, np.zeros(len(g)), 0.0
            # Rater effects and (optionally) assistant effects, alternating: each fitted on the residual the
            # other leaves (a few rounds of backfitting of the two random effects).
            for _ in range(self.ASSISTANT_ROUNDS if self.fit_keys_ is not None else 1):
                effects = RaterEffects(slopes=self.slopes, noise_prior=self.noise_prior).fit(
                    rows, Z, g, base - a_rows, extra)
                if self.fit_keys_ is None:
                    break
                keys = self.fit_keys_[rated]
                resid = base - effects.adjust(g, effects.posterior_[rows], extra)
                assist = AssistantEffects().fit(keys, resid)
                a_rows = assist.effect(keys)
            if assist is not None:
                a_link = assist.loo_effect(keys, resid)  # what a new rating of that assistant gets
                self.assistant_rows_[rated, c] = a_rows
            self.assistant_effects_.append(assist)
            self.effects_.append(effects)
            # Two links: scores of known raters are sharper than trait-only scores of new raters. Both are
            # fitted on what a *new* rating gets: leave-one-out rater effects (in-sample ones contain the
            # rating itself and make the known link overconfident) and trait-only effects.
            if links and self.rater_ridge is not None:
                # Each rater's own content weights on what the effects leave (in-sample effects: the
                # residual is the content the leniency cannot hold); the known link sees their held-out
                # predictions (inner folds), as a new rating of a known rater would.
                resid = base - a_rows - effects.adjust(g, effects.posterior_[rows], extra)
                content = self._fit_rater_ridge(np.flatnonzero(rated), rows, resid, len(Z))
                self.rater_ridges_.append(content)
                a_link = a_link + content.oof_
            if links:  # only the final round's links are ever used
                loo = effects.loo_posterior(rows, g, base - a_rows, extra)
                known = g + self.common_known_[rows] + effects.adjust(g, loo, extra) + a_link
                cold = g + common_cold[rows] + effects.adjust(g, effects.prior(Z)[rows], extra) + a_link \
                    - (content.oof_ if self.rater_ridge is not None else 0.0)  # a new rater has no weights
                self.links_known_.append(self._fit_link(known, y))
                self.links_cold_.append(self._fit_link(cold, y))
            coefs.append(effects.posterior_)
        self.rater_coef_ = np.stack(coefs, axis=1)  # (raters, controls, k)

    def to_generic(self) -> "GenericRater":
        """The fitted GenericRater this model contains (text, context, position only). With backfit=0 it
        equals GenericRater(same params).fit(X, Y); with backfitting its text model was trained on ratings
        with each rater's leniency removed, i.e. it predicts a typical rater."""
        shared = GenericRater().get_params().keys()
        generic = GenericRater(**{k: v for k, v in self.get_params().items() if k in shared})
        for name in ("controls_", "levels_", "features_", "text_coef_", "text_intercept_"):
            setattr(generic, name, getattr(self, name))
        generic.links_ = self.generic_links_
        generic.assistant_effects_ = self.generic_assistant_
        return generic

    def common_prior(self, Z: np.ndarray) -> np.ndarray:
        """The leniency pooled over controls that traits Z predict (0 unless pool_controls)."""
        return self.common_.prior(Z)[:, 0] if self.pool_controls else np.zeros(len(Z))

    def rater_effects(self, control: str) -> pd.DataFrame:
        """Fitted effects of the known raters for one control: offset (leniency) and slope (sensitivity),
        next to what the traits alone predict."""
        j = self.controls_.index(control)
        effects = self.effects_[j]
        Z = self.known_trait_matrix_
        out = pd.DataFrame({"offset": self.common_known_ + effects.posterior_[:, 0],
                            "trait_offset": self.common_prior(Z) + effects.prior(Z)[:, 0]},
                           index=pd.Index(self.known_raters_, name="rater_id"))
        if self.slopes:
            out["slope"] = effects.posterior_[:, 1]
        return out

    def trait_effects(self, X: pd.DataFrame, control: str) -> np.ndarray:
        """The trait-predicted offset for each row of X (what a new rater with these traits gets)."""
        j = self.controls_.index(control)
        Z = self.trait_matrix(X[[c for c in X.columns if c.startswith("trait_")]])
        return self.common_prior(Z) + self.effects_[j].prior(Z)[:, 0]

    def is_known(self, X: pd.DataFrame) -> np.ndarray:
        return pd.Index(self.known_raters_).get_indexer(X["rater_id"].astype(str)) >= 0

    def _proba(self, X):
        g_all = self.text_scores(X)
        rows = pd.Index(self.known_raters_).get_indexer(X["rater_id"].astype(str))
        known = rows >= 0
        Z = self.trait_matrix(X[[c for c in X.columns if c.startswith("trait_")]])
        common = self.common_prior(Z)
        common[known] = self.common_known_[rows[known]]
        shift = self._assistant_shift(getattr(self, "assistant_effects_", []), X)
        extra = self.rater_direction_values(X)
        content = self.rater_content_shifts(X, rows)
        if content is not None:
            shift = shift + content
        out = {}
        for j, control in enumerate(self.controls_):
            effects, g = self.effects_[j], g_all[:, j]
            coef = effects.prior(Z)
            coef[known] = self.rater_coef_[rows[known], j]
            scores = g + common + effects.adjust(g, coef, None if extra is None else extra[:, j]) + shift[:, j]
            if known.all():
                out[control] = self.links_known_[j].predict_proba(scores)
                continue
            probs = self.links_cold_[j].predict_proba(scores)
            if known.any():
                probs[known] = self.links_known_[j].predict_proba(scores[known])
            out[control] = probs
        return out
