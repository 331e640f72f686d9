"""Live posteriors (sense7.model.live_posterior): updating one rater a rating at a time gives exactly the batch
posterior of the same ratings with the population parameters fixed, and both equal Gaussian conditioning
written out independently (covariance form), for a known rater, a rater with traits only and an unknown one."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sense7.data.items import transcript_columns
from sense7.model.live_posterior import LiveUnsupported, LivePredictor, OnlinePosterior, batch_posterior, check_live
from sense7.taxonomy import load_taxonomy
from tests.support.live_posterior import VARIANTS, held_items, trained_without_held

TAXONOMY = load_taxonomy()


@pytest.fixture(scope="module", params=VARIANTS)
def setup(request):
    return trained_without_held(request.param)


def _conditioned(effects, prior_mean, prior_cov, g, targets, shift, sigma2, extra=None):
    """Gaussian conditioning in covariance form: m = mu + S D' (D S D' + s2 I)^-1 (e - D mu); D's rows are
    [1, g - g_mean] and the turn's values on the rater directions (`extra`, (n, directions)) if any."""
    rated = np.isfinite(targets)
    D = np.column_stack([np.ones(rated.sum()), g[rated] - effects.g_mean_]
                        + ([] if extra is None else [extra[rated]]))
    assert D.shape[1] == len(prior_mean)
    e = targets[rated] - g[rated] - shift[rated]
    gain = prior_cov @ D.T @ np.linalg.inv(D @ prior_cov @ D.T + sigma2 * np.eye(len(e)))
    return prior_mean + gain @ (e - D @ prior_mean)


@pytest.mark.parametrize("who", ["known", "traits", "unknown"])
def test_online_equals_batch_equals_conditioning(setup, who):
    _, _, compiled, traits, raters = setup
    model = compiled.personalized
    rater = raters[who][0]
    columns, ratings = held_items(setup, who)
    assert len(ratings) >= 8 and np.isfinite(ratings).any()
    ratings[1, :3] = np.nan  # a turn with some controls unrated
    g = compiled.text_scores(columns)
    shift = compiled.assistant_shifts(columns["assistant_id"])
    assert np.abs(shift).max() > 0  # the assistant's effect is part of the residual
    extra = model.rater_direction_values(columns)  # (n, controls, directions), None without directions
    online = OnlinePosterior(model, rater, traits)
    assert online.kind == {"known": "personalized", "traits": "traits", "unknown": "generic"}[who]
    for i in range(len(ratings)):
        online.update(g[i], ratings[i], shift[i], None if extra is None else extra[i])
    batch = batch_posterior(model, rater, traits, g, ratings, shift, extra)
    np.testing.assert_allclose(online.coef(), batch, rtol=0, atol=1e-10)
    at_once = OnlinePosterior(model, rater, traits).update_many(g, ratings, shift, extra)
    # The directions' values are required exactly when the version has directions (never a silent default).
    wrong = None if extra is not None else np.zeros((len(g), g.shape[1], 1))
    with pytest.raises(ValueError, match="rater directions"):
        OnlinePosterior(model, rater, traits).update_many(g, ratings, shift, wrong)
    with pytest.raises(ValueError, match="rater directions"):
        OnlinePosterior(model, rater, traits).update(g[0], ratings[0], shift[0], None if wrong is None else wrong[0])
    assert at_once.n_ratings == online.n_ratings == len(ratings)
    np.testing.assert_allclose(at_once.coef(), batch, rtol=0, atol=1e-10)

    # Independently: the prior the rater starts from, then conditioning on every new rating at once.
    levels = np.asarray(model.levels_, float)
    for j, effects in enumerate(model.effects_):
        targets = np.full(len(ratings), np.nan)
        ok = np.isfinite(ratings[:, j])
        targets[ok] = model.target_values_[j][np.searchsorted(levels, ratings[ok, j])]
        if who == "known":  # the training posterior under the final population parameters
            row = list(map(str, model.known_raters_)).index(rater)
            start_precision = effects.rater_gram_[row] / effects.rater_sigma2_[row] + np.linalg.inv(effects.T_)
            start_mean = np.linalg.solve(start_precision, effects.rater_moment_[row] / effects.rater_sigma2_[row]
                                         + np.linalg.inv(effects.T_) @ effects.prior(model.known_trait_matrix_[row:row + 1])[0])
            # ... which is what the served version holds for this rater (the EM converged to it).
            np.testing.assert_allclose(start_mean, model.rater_coef_[row, j], atol=0.02)
            prior_mean, prior_cov, s2 = start_mean, np.linalg.inv(start_precision), effects.rater_sigma2_[row]
        else:
            Z = model.trait_matrix(traits.loc[[rater]]) if who == "traits" else \
                np.eye(1, len(model.trait_columns_) + 1)
            prior_mean, prior_cov, s2 = effects.prior(Z)[0], effects.T_, effects.sigma2_
        expected = _conditioned(effects, prior_mean, prior_cov, g[:, j], targets, shift[:, j], s2,
                                None if extra is None else extra[:, j])
        np.testing.assert_allclose(batch[j], expected, rtol=0, atol=1e-8)


def test_no_new_answer_keeps_the_static_prediction(setup):
    """A rater with no answers, or whose answers the version already trained on, gets None (the caller
    serves the static prediction); a rater with answers gets `live` kinds that moved."""
    synth, data, compiled, traits, raters = setup
    live = LivePredictor(compiled)
    known = raters["known"][0]
    trained_convs = [c for c in synth.conversations if c.rater_id == known
                     and c.conversation_id not in raters["known"][1]]
    trained = transcript_columns(trained_convs, TAXONOMY)
    columns, ratings = held_items(setup, "known")
    empty = {name: [] for name in columns}
    assert live.predict(columns, known, traits, empty, np.zeros((0, len(compiled.controls)))) is None
    trained_ratings = np.full((len(trained["rater_id"]), len(compiled.controls)), 5.0)
    assert live.predict(columns, known, traits, trained, trained_ratings) is None  # counted once, in training
    for who in ("traits", "unknown"):
        rater = raters[who][0]
        cols, values = held_items(setup, who)
        got = live.predict(cols, rater, traits, cols, np.full_like(values, 5.0))
        assert got is not None and got.own_ratings == len(values) and set(got.predictions.kinds) == {"live"}
        static = compiled.predict(cols, compiled.rater_table(traits))
        moved = (got.predictions.expected() - static.expected()).mean(axis=0)
        # All 5s: every control moves up, those where raters were seen to differ (T > 0.01) by a lot.
        varies = np.array([e.T_[0, 0] > 0.01 for e in compiled.personalized.effects_])
        assert varies.sum() >= 4 and (moved[varies] > 0.5).all() and (moved > 0).all(), moved


def test_versions_without_live_statistics_are_refused(setup):
    model = copy.deepcopy(setup[2].personalized)
    del model.target_values_
    with pytest.raises(LiveUnsupported):
        check_live(model)


def test_live_predictions_meet_the_served_ones_at_both_ends(setup):
    """No rating yet: exactly the served (static) prediction; a known rater: exactly what CompiledBundle.predict
    gives for the updated coefficients through the known raters' link."""
    from sense7.model.serving import RaterTable

    _, _, compiled, traits, raters = setup
    live = LivePredictor(compiled)
    static_table = compiled.rater_table(traits)
    for who in ("traits", "unknown"):
        rater = raters[who][0]
        columns, _ = held_items(setup, who)
        state = OnlinePosterior(compiled.personalized, rater, traits)
        assert (state.information_share() == 0).all()
        expected = compiled.predict(columns, static_table) if who == "traits" else None
        got = live.predict_with(state, columns)
        if who == "traits":
            np.testing.assert_allclose(got.probs, expected.probs, rtol=0, atol=1e-12)
            assert got.kinds == expected.kinds
    rater = raters["known"][0]
    columns, ratings = held_items(setup, "known")
    state = live.posterior(rater, traits, columns, ratings)
    assert state.n_ratings == len(ratings)
    # The predictor's path (text scores cached per rated turn) is the batch posterior; a second call (all
    # scores cached) and one on a subset (some cached) too.
    g, shift = compiled.text_scores(columns), compiled.assistant_shifts(columns["assistant_id"])
    extra = compiled.personalized.rater_direction_values(columns)
    expected = batch_posterior(compiled.personalized, rater, traits, g, ratings, shift, extra)
    np.testing.assert_allclose(state.coef(), expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(live.posterior(rater, traits, columns, ratings).coef(), expected, rtol=0, atol=1e-10)
    half = {k: v[::2] for k, v in columns.items()}
    np.testing.assert_allclose(live.posterior(rater, traits, half, ratings[::2]).coef(),
                               batch_posterior(compiled.personalized, rater, traits, g[::2], ratings[::2], shift[::2],
                                               None if extra is None else extra[::2]),
                               rtol=0, atol=1e-10)
    table = RaterTable(index={rater: 0}, coef=state.coef()[None], common=np.zeros(1), known=np.array([True]))
    np.testing.assert_allclose(live.predict_with(state, columns).probs, compiled.predict(columns, table).probs,
                               rtol=0, atol=1e-12)
    # A new rater's ratings inform them part of the way: the share grows with every rating, below 1.
    rater = raters["traits"][0]
    cols, values = held_items(setup, "traits")
    shares = [live.posterior(rater, traits, {k: v[:n] for k, v in cols.items()}, values[:n]).information_share()
              for n in (1, 5, 40)]
    assert (shares[0] <= shares[1]).all() and (shares[1] <= shares[2]).all() and (shares[2] < 1).all()
    assert shares[2].max() > 0.5
