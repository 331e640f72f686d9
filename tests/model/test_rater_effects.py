"""Rater effects: the trait prior is trusted only as far as held-out raters confirm it; links see
leave-one-out effects; history_chars=0 means no history."""

from __future__ import annotations

import numpy as np

from sense7.model.features import ItemFeatures
from sense7.model.rater_effects import RaterEffects


def _raters(leniency_from_traits: bool, seed: int = 0):
    """60 raters with 14 traits: 50 rate twice, 10 rate 60 times. Leniency is either a function of the
    first trait or unrelated to every trait."""
    rng = np.random.default_rng(seed)
    n_raters, n_traits = 60, 14
    traits = rng.normal(size=(n_raters, n_traits))
    Z = np.column_stack([np.ones(n_raters), traits])
    leniency = 0.6 * traits[:, 0] if leniency_from_traits else rng.normal(0, 0.6, n_raters)
    counts = np.where(np.arange(n_raters) < 50, 2, 60)
    rows = np.repeat(np.arange(n_raters), counts)
    g = rng.normal(size=len(rows))
    e = leniency[rows] + rng.normal(0, 1.0, len(rows))
    return Z, rows, g, e, leniency


def test_traits_that_predict_nothing_are_not_trusted():
    """Noise traits must not spread the prior. Scoring the trait penalty on posterior means (which, for
    raters with 2 ratings, *are* the prior) sometimes kept a small penalty: in some draws the prior's spread
    exceeded 2x the true leniency spread, ranking new raters by noise (on WASSA: cold-start folds where the
    traits ranked held-out raters backwards). Scored on observed means, the worst of 8 draws stays small."""
    spreads = []
    for seed in range(8):
        Z, rows, g, e, _ = _raters(leniency_from_traits=False, seed=seed)
        effects = RaterEffects(slopes=False).fit(rows, Z, g, e)
        spreads.append(np.std(effects.prior(Z)[:, 0]) / np.sqrt(effects.T_[0, 0]))
    assert max(spreads) < 0.5, spreads


def test_traits_that_predict_leniency_are_used():
    Z, rows, g, e, leniency = _raters(leniency_from_traits=True)
    effects = RaterEffects(slopes=False).fit(rows, Z, g, e)
    prior = effects.prior(Z)[:, 0]
    assert np.corrcoef(prior, leniency)[0, 1] > 0.8
    assert effects.trait_alpha_ < 1e4


def test_leave_one_out_posterior_leaves_the_row_out():
    """loo_posterior(row) equals the posterior computed from the rater's *other* rows (same fitted
    hyperparameters), and differs from the in-sample posterior."""
    Z, rows, g, e, _ = _raters(leniency_from_traits=True, seed=3)
    effects = RaterEffects(slopes=True).fit(rows, Z, g, e)
    loo = effects.loo_posterior(rows, g, e)
    T_inv = np.linalg.inv(effects.T_)
    prior = effects.prior(Z)
    for i in (0, 1, 150, len(rows) - 1):
        others = np.flatnonzero((rows == rows[i]) & (np.arange(len(rows)) != i))
        D = np.column_stack([np.ones(len(others)), g[others] - effects.g_mean_])
        s2 = effects.rater_sigma2_[rows[i]]
        expected = np.linalg.solve(D.T @ D / s2 + T_inv, D.T @ e[others] / s2 + T_inv @ prior[rows[i]])
        np.testing.assert_allclose(loo[i], expected, rtol=1e-8, atol=1e-10)
    # A rater with 2 ratings moves a lot when one is removed; the in-sample posterior includes the rating.
    assert not np.allclose(loo[rows < 50], effects.posterior_[rows[rows < 50]])


def test_history_chars_zero_means_no_history(small_items):
    X, _ = small_items
    changed = X.assign(history_text="user: something else entirely " * 5)
    without = ItemFeatures(history_chars=0).fit(X)
    assert (without.transform(X) != without.transform(changed)).nnz == 0
    with_history = ItemFeatures(history_chars=300).fit(X)
    assert (with_history.transform(X) != with_history.transform(changed)).nnz > 0
