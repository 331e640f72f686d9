"""The one posterior cache of live pre-fills (sense7.model.live_posterior.PosteriorCache, held by each served
version's LivePredictor; used by the rater page and the ML backend): a hit only for the same rater, traits
and answers, so a new answer, a changed answer, other traits or another served version never get a stale
posterior; every answer is the batch posterior of the same ratings."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from sense7.model.bundle import train_bundle
from sense7.data.dataset import RatingData
from sense7.model.live_posterior import LivePredictor, batch_posterior
from tests.support.live_posterior import TAXONOMY, VARIANTS, held_items, trained_without_held


@pytest.fixture(scope="module", params=VARIANTS)
def setup(request):
    return trained_without_held(request.param)


def _batch(compiled, rater, traits, columns, ratings):
    g, shift = compiled.text_scores(columns), compiled.assistant_shifts(columns["assistant_id"])
    extra = compiled.personalized.rater_direction_values(columns)  # None without rater directions
    return batch_posterior(compiled.personalized, rater, traits, g, ratings, shift, extra)


def _first(columns, n):
    return {k: v[:n] for k, v in columns.items()}


@pytest.mark.parametrize("who", ["known", "traits", "unknown"])
def test_a_new_or_changed_answer_is_never_a_stale_hit(setup, who):
    _, _, compiled, traits, raters = setup
    rater = raters[who][0]
    columns, ratings = held_items(setup, who)
    live = LivePredictor(compiled)
    cache = live.posteriors

    three = live.posterior(rater, traits, _first(columns, 3), ratings[:3])
    np.testing.assert_allclose(three.coef(), _batch(compiled, rater, traits, _first(columns, 3), ratings[:3]),
                               rtol=0, atol=1e-10)
    again = live.posterior(rater, traits, _first(columns, 3), ratings[:3])
    assert (cache.hits, cache.misses) == (1, 1)  # the same answers: served from the cache, same numbers
    np.testing.assert_array_equal(again.coef(), three.coef())

    four = live.posterior(rater, traits, _first(columns, 4), ratings[:4])  # a new answer
    assert cache.misses == 2 and four.n_ratings == 4
    np.testing.assert_allclose(four.coef(), _batch(compiled, rater, traits, _first(columns, 4), ratings[:4]),
                               rtol=0, atol=1e-10)
    assert not np.allclose(four.coef(), three.coef())

    changed = ratings[:3].copy()  # the same three turns, one answer revised: same count, other posterior
    changed[1] = np.where(np.isfinite(changed[1]), np.where(changed[1] >= 3, 1.0, 5.0), np.nan)
    revised = live.posterior(rater, traits, _first(columns, 3), changed)
    assert cache.misses == 3
    np.testing.assert_allclose(revised.coef(), _batch(compiled, rater, traits, _first(columns, 3), changed),
                               rtol=0, atol=1e-10)
    assert not np.allclose(revised.coef(), three.coef())

    # A state handed out is the caller's: updating it leaves the cached one as it was.
    n_controls, k = three.coef().shape
    three.update_many(np.zeros((1, n_controls)), np.full((1, n_controls), 5.0),
                      extra=np.zeros((1, n_controls, k - 2)) if k > 2 else None)
    np.testing.assert_array_equal(live.posterior(rater, traits, _first(columns, 3), ratings[:3]).coef(), again.coef())


def test_columns_and_traits_are_made_only_on_a_miss(setup):
    """The rater page passes functions: the trait features and the rated turns' columns are made only when
    the cache lacks the rater's start or a turn's text scores (a page after a new answer scores that turn)."""
    _, _, compiled, traits, raters = setup
    rater = raters["traits"][0]
    columns, ratings = held_items(setup, "traits")
    live = LivePredictor(compiled)
    made = {"traits": 0, "columns": 0}

    def make_traits():
        made["traits"] += 1
        return traits

    def ask(n):
        def make_columns():
            made["columns"] += 1
            return _first(columns, n)
        ids = {k: columns[k][:n] for k in ("conversation_id", "turn_index", "rater_id")}
        return live.posterior(rater, make_traits, make_columns, ratings[:n], traits_key=("raw", "a"), rated_ids=ids)

    for n in (2, 2, 3):
        state = ask(n)
        np.testing.assert_allclose(state.coef(), _batch(compiled, rater, traits, _first(columns, n), ratings[:n]),
                                   rtol=0, atol=1e-10)
    assert made == {"traits": 1, "columns": 2}  # once per rater start; once per turn not scored before
    other = live.posterior(rater, lambda: traits.iloc[0:0], _first(columns, 3), ratings[:3], traits_key=("raw", "b"))
    # Other traits (here: none): the start is made again, and it is the traits-less posterior.
    np.testing.assert_allclose(other.coef(), _batch(compiled, rater, None, _first(columns, 3), ratings[:3]),
                               rtol=0, atol=1e-10)
    assert not np.allclose(other.coef(), state.coef())


@pytest.mark.slow
def test_another_served_version_has_its_own_posteriors(setup):
    """A promotion builds a new LivePredictor, hence a new cache: never the previous version's posterior."""
    synth, data, compiled, traits, raters = setup
    rater = raters["traits"][0]
    columns, ratings = held_items(setup, "traits")
    first = LivePredictor(compiled).posterior(rater, traits, columns, ratings)
    raw = data.raters.drop(columns=["email"], errors="ignore")
    held = data.ratings["rater_id"].isin([raters["traits"][0], raters["unknown"][0]])
    half = data.ratings[~held].iloc[::2]  # another version: trained on half the ratings
    other = train_bundle(RatingData(data.conversations, half, raw), "v2", TAXONOMY,
                         personalized=clone(compiled.personalized)).compile()  # the same kind of model
    second = LivePredictor(other).posterior(rater, traits, columns, ratings)
    np.testing.assert_allclose(second.coef(), _batch(other, rater, traits, columns, ratings), rtol=0, atol=1e-10)
    assert not np.allclose(second.coef(), first.coef())
