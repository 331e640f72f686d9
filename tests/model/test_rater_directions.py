"""Rater-specific slopes on extra directions (RaterEffects(extra=...), PersonalizedRater.rater_directions):
planted slopes are recovered, shrunk toward what the traits predict."""

import numpy as np

from sense7.model.rater_effects import RaterEffects


def test_planted_direction_slopes_are_recovered_and_follow_traits():
    rng = np.random.default_rng(0)
    n_raters, per_rater = 40, 60
    trait = rng.normal(size=n_raters)
    Z = np.column_stack([np.ones(n_raters), trait])
    # Same leniency for everybody; what moves a rater along the direction follows their trait plus noise.
    slope = 0.8 * trait + rng.normal(0, 0.2, n_raters)
    rows = np.repeat(np.arange(n_raters), per_rater)
    g = rng.normal(size=len(rows))
    direction = rng.normal(size=(len(rows), 1))
    e = slope[rows] * direction[:, 0] + rng.normal(0, 0.5, len(rows))
    effects = RaterEffects(slopes=True).fit(rows, Z, g, e, extra=direction)
    recovered = effects.posterior_[:, 2]
    assert np.corrcoef(recovered, slope)[0, 1] > 0.9
    # The trait prior learned the planted dependence: a new rater's slope comes from their traits.
    assert np.corrcoef(effects.prior(Z)[:, 2], 0.8 * trait)[0, 1] > 0.95
    # Without the direction the same data leave the intercepts near 0 and explain nothing of it.
    plain = RaterEffects(slopes=True).fit(rows, Z, g, e)
    shift = effects.adjust(g, effects.posterior_[rows], direction)
    assert np.mean((e - shift) ** 2) < 0.5 * np.mean((e - plain.adjust(g, plain.posterior_[rows])) ** 2)
