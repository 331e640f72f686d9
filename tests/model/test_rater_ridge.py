"""Each rater's own content weights (PersonalizedRater(rater_ridge=...), sense7.model.rater_ridge): the ridge
itself, recovery of planted per-rater sensitivities that leniency and slopes cannot express, the fall-back
to leniency only where raters have few ratings, and the serving paths that refuse the option."""

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupShuffleSplit

from sense7.data.items import build_items
from sense7.model.estimators import PersonalizedRater
from sense7.model.oracle import SynthOracle
from sense7.model.rater_ridge import RaterResidualRidge, ridge_path
from sense7.model.text import TextEncoder
from sense7.research.perspectivist import within_group_spearman
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()


def test_ridge_path_is_sklearns_ridge_in_both_forms():
    """The Gram form (p <= n, dense) and the kernel form (sparse, or p > n) both equal Ridge with an
    intercept, for every penalty of the path."""
    rng = np.random.default_rng(0)
    for n, p in ((60, 8), (12, 40)):
        F, y = rng.normal(size=(n, p)), rng.normal(size=n)
        for features in (F, sp.csr_matrix(F)):
            coef, mean = ridge_path(features, y, [0.3, 3.0])
            for k, alpha in enumerate((0.3, 3.0)):
                reference = Ridge(alpha=alpha).fit(F, y)
                assert np.allclose(coef[:, k], reference.coef_, atol=1e-8)
                assert np.allclose((F - mean) @ coef[:, k] + y.mean(), reference.predict(F), atol=1e-8)


def test_inner_cv_switches_itself_off_on_noise_and_on_where_raters_differ():
    rng = np.random.default_rng(1)
    n_raters, per_rater, p = 6, 300, 5
    rows = np.repeat(np.arange(n_raters), per_rater)
    F = rng.normal(size=(len(rows), p))
    groups = rng.integers(0, 200, len(rows))
    noise = rng.normal(size=len(rows))
    off = RaterResidualRidge().fit(F, rows, noise, groups, n_raters)
    assert off.alpha_ == np.inf and not off.coef_.any() and not off.oof_.any()
    weights = rng.normal(size=(n_raters, p))
    e = (F * weights[rows]).sum(axis=1) + 0.5 * noise
    on = RaterResidualRidge().fit(F, rows, e, groups, n_raters)
    assert np.isfinite(on.alpha_) and on.cv_error_[on.alpha_] < 0.5 * on.cv_error_[np.inf]
    assert np.corrcoef(on.coef_.T.ravel(), weights.ravel())[0, 1] > 0.95
    # Held-out predictions (what the known link is fitted on) are not the in-sample ones.
    assert not np.allclose(on.oof_, on.predict(F, rows))
    assert np.corrcoef(on.oof_, e - 0.5 * noise)[0, 1] > 0.9
    assert not on.predict(F, np.full(len(rows), -1)).any()  # a new rater: no content shift


def test_the_one_standard_error_rule_keeps_raters_whose_weights_are_noise_off():
    """Half the raters have their own weights, half none. Choosing each rater's penalty by their held-out
    error alone switches some of the second half on by chance; with the one-standard-error rule (cv_rater_1se)
    the weights must beat "off" by more than their own noise."""
    noise_on, noise_on_1se, signal_on_1se = 0, 0, 0
    for seed in range(5):
        rng = np.random.default_rng(seed)
        n_raters, per_rater, p = 12, 120, 8
        rows = np.repeat(np.arange(n_raters), per_rater)
        F = rng.normal(size=(len(rows), p))
        groups = rng.integers(0, 100, len(rows))
        weights = rng.normal(0, 0.5, size=(n_raters, p))
        weights[n_raters // 2:] = 0
        e = (F * weights[rows]).sum(axis=1) + rng.normal(size=len(rows))
        argmin = RaterResidualRidge(per_rater=True).fit(F, rows, e, groups, n_raters)
        one_se = RaterResidualRidge(per_rater=True, one_se=True).fit(F, rows, e, groups, n_raters)
        noise_on += int(np.isfinite(argmin.alphas_[n_raters // 2:]).sum())
        noise_on_1se += int(np.isfinite(one_se.alphas_[n_raters // 2:]).sum())
        signal_on_1se += int(np.isfinite(one_se.alphas_[:n_raters // 2]).sum())
        assert not one_se.coef_[:, ~np.isfinite(one_se.alphas_)].any()  # off means no weights at all
    # Measured: 13 of 30 noise raters on by the argmin, 3 by the rule; all 30 planted raters kept.
    assert signal_on_1se == 30 and noise_on >= 8 and noise_on_1se <= noise_on // 2, (noise_on, noise_on_1se)


class Cues(TextEncoder):
    """Four dense columns of a turn's text (deterministic per text), standing in for sentence embeddings."""

    def transform(self, texts):
        out = np.zeros((len(texts), 4))
        for i, text in enumerate(texts):
            words = text.split()
            out[i] = [np.log1p(len(words)), text.count("?"), sum(len(w) > 6 for w in words) / max(len(words), 1),
                      text.count("you") + text.count("You")]
        return out


def _planted(n_conversations: int, seed: int, spread: float = 0.8):
    """Synthetic turns whose ratings add, per rater, their own weights on the four Cues columns (drawn around
    0: on average nobody cares, so the population text model learns nothing of them and a rater's leniency
    and slope cannot express them; several directions, so a single shared direction cannot either)."""
    synth = generate(n_conversations, 8, seed=seed, taxonomy=TAXONOMY)
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    turn = X["turn_index"].notna().to_numpy()
    X, Y = X[turn].reset_index(drop=True), Y[turn].reset_index(drop=True)[["acknowledgement", "support"]]
    cues = Cues().transform(X["text"].tolist())
    cues = (cues - cues.mean(axis=0)) / cues.std(axis=0)
    raters = sorted(X["rater_id"].unique())
    weights = np.random.default_rng(seed).normal(0, spread, (len(raters), cues.shape[1]))
    rows = pd.Index(raters).get_indexer(X["rater_id"])
    latent = SynthOracle(synth.truth).latent_means(X, Y.columns).to_numpy(float) \
        + (cues * weights[rows]).sum(axis=1)[:, None]
    noise = np.random.default_rng(seed + 1).normal(0, synth.truth.noise_sd, latent.shape)
    Y = pd.DataFrame(1 + np.searchsorted(synth.truth.thresholds, latent + noise), columns=Y.columns).astype(float)
    return X, Y


def _within_rater(model, X, Y, train, test) -> float:
    predicted = model.fit(X.iloc[train], Y.iloc[train]).predict_expected(X.iloc[test])
    return float(np.nanmean(np.concatenate([
        within_group_spearman(X["rater_id"].to_numpy()[test], Y[c].to_numpy()[test], predicted[c].to_numpy())
        for c in Y.columns])))


@pytest.mark.slow
def test_rater_ridge_learns_what_moves_each_rater_where_leniency_and_one_direction_cannot():
    X, Y = _planted(150, seed=7)
    train, test = next(GroupShuffleSplit(1, test_size=0.3, random_state=0).split(X, groups=X["conversation_id"]))
    plain = _within_rater(PersonalizedRater(text_encoder=Cues()), X, Y, train, test)
    direction = _within_rater(PersonalizedRater(text_encoder=Cues(), rater_directions=1,
                                                rater_directions_from="encoder"), X, Y, train, test)
    model = PersonalizedRater(text_encoder=Cues(), rater_ridge="cv")
    own = _within_rater(model, X, Y, train, test)
    assert own - plain > 0.05 and own - direction > 0.02, (plain, direction, own)
    assert all(np.isfinite(r.alpha_) for r in model.rater_ridges_)  # inner CV turned it on
    # Only the encoder's columns carry weights; a new rater gets none (the cold prediction is unchanged).
    assert model.rater_ridges_[0].coef_.shape[0] == model.features_.block_columns("encoder").stop \
        - model.features_.block_columns("encoder").start
    cold = X.iloc[test].assign(rater_id="nobody")
    leniency_only = PersonalizedRater(text_encoder=Cues()).fit(X.iloc[train], Y.iloc[train])
    assert np.allclose(model.predict_expected(cold), leniency_only.predict_expected(cold), atol=0.05)
    with pytest.raises(ValueError, match="needs a text_encoder"):
        PersonalizedRater(rater_ridge="cv", text_encoder=None).fit(X.iloc[train], Y.iloc[train])


def test_rater_ridge_falls_back_to_leniency_only_where_it_does_not_predict_held_out_ratings():
    """WASSA's case: about a dozen ratings a rater, raters who differ in leniency only. Inner CV finds that
    no rater's own weights predict their held-out ratings and switches the option off, so the predictions
    are the leniency-only model's."""
    X, Y = _planted(150, seed=8, spread=0.0)
    few = X.groupby("rater_id", group_keys=False).apply(lambda frame: frame.head(12)).index
    X, Y = X.loc[few].reset_index(drop=True), Y.loc[few].reset_index(drop=True)
    model = PersonalizedRater(text_encoder=Cues(), rater_ridge="cv").fit(X, Y)
    plain = PersonalizedRater(text_encoder=Cues()).fit(X, Y)
    assert all(r.alpha_ == np.inf for r in model.rater_ridges_), [r.cv_error_ for r in model.rater_ridges_]
    assert np.allclose(model.predict_expected(X), plain.predict_expected(X))


def test_a_fixed_penalty_is_used_as_given():
    """(Served by the compiled path: tests/model/test_serving.py, tests/research/test_jury.py; updated live:
    tests/model/test_live_posterior.py.)"""
    X, Y = _planted(40, seed=9)
    model = PersonalizedRater(text_encoder=Cues(), rater_ridge=30.0).fit(X, Y)
    assert [r.alpha_ for r in model.rater_ridges_] == [30.0] * len(model.controls_)
