"""The rater models: recover planted structure, shrink properly, follow the scikit-learn contract."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from sense7.data.items import build_items
from sense7.model import ControlPrediction, GenericRater, PersonalizedRater
from sense7.model.oracle import SynthOracle, compare_with_oracle
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


@pytest.mark.slow
def test_personalized_nearly_matches_the_oracle_and_beats_generic(synth_300):
    """What is compared (docs/BENCHMARKS.md): 5-fold CV grouped by conversation on 300 conversations /
    40 raters; per test fold, Spearman between observed turn ratings (all 8 controls pooled) and the
    oracle's expected rating, or a model's expected rating; mean over folds."""
    result = compare_with_oracle(synth_300, n_folds=5)
    assert result["oracle"] > 0.8  # the planted signal is strong: the check below means something
    assert result["personalized"] >= result["oracle"] - 0.05, result
    assert result["personalized"] >= result["generic"] + 0.1, result


def test_oracle_beats_a_shuffled_oracle(small_synth, small_items):
    X, Y = small_items
    expected = SynthOracle(small_synth.truth).predict_expected(X, Y.columns)
    observed = Y["overall"].to_numpy()
    rated = np.isfinite(observed)
    good = np.corrcoef(expected["overall"].to_numpy()[rated], observed[rated])[0, 1]
    shuffled = np.corrcoef(np.random.default_rng(0).permutation(expected["overall"].to_numpy()[rated]),
                           observed[rated])[0, 1]
    assert good > 0.6 > abs(shuffled)


def _lenient_rater_data(small_items, n_few=2, n_many=200):
    """Two new raters, without traits, who both rate `overall` one level above what its rater gave the
    same turn: "few" on 2 turns, "many" on 200 (turns rated 1-4, so +1 is never clipped)."""
    X, Y = small_items
    rng = np.random.default_rng(1)
    candidates = np.flatnonzero((Y["overall"] <= 4).to_numpy())
    rows = rng.choice(candidates, n_few + n_many, replace=False)
    extra_X = X.iloc[rows].copy()
    extra_X[[c for c in X.columns if c.startswith("trait_")]] = np.nan
    extra_X["rater_id"] = ["few"] * n_few + ["many"] * n_many
    extra_X["conversation_id"] = extra_X["conversation_id"] + "-copy"
    extra_Y = pd.DataFrame(np.nan, index=extra_X.index, columns=Y.columns)
    extra_Y["overall"] = Y["overall"].to_numpy()[rows] + 1
    return pd.concat([X, extra_X], ignore_index=True), pd.concat([Y, extra_Y], ignore_index=True)


def test_shrinkage_few_ratings_barely_move_a_rater(small_items):
    X, Y = _lenient_rater_data(small_items)
    model = PersonalizedRater().fit(X, Y)
    effects = model.rater_effects("overall")
    few, many = effects.loc["few", "offset"], effects.loc["many", "offset"]
    # Both raters are equally lenient; only the evidence differs. (Offsets are on the model's internal
    # target scale, so they are compared with each other, not with "1 level".)
    assert many > 0.3
    assert 0 <= few < 0.5 * many  # 2 ratings: pulled most of the way back to the prior (0, no traits)
    assert effects.loc["few", "trait_offset"] == pytest.approx(effects.loc["many", "trait_offset"])


@pytest.mark.slow
def test_unseen_rater_gets_the_trait_prediction():
    synth = generate(300, 120, seed=21, taxonomy=TAXONOMY)  # many raters: the trait -> leniency map needs them
    X, Y = build_items(synth.rating_data(), TAXONOMY)
    truth = synth.truth
    raters = sorted(X["rater_id"].unique())
    held_out = raters[-30:]
    train = ~X["rater_id"].isin(held_out)
    model = PersonalizedRater().fit(X[train], Y[train])
    new = X[~train]
    assert not model.is_known(new).any()
    # Their predicted offset is exactly what the traits predict, and it tracks the planted trait part.
    trait_offset = pd.Series(model.trait_effects(new, "overall"), index=new["rater_id"]).groupby(level=0).first()
    assert np.corrcoef(trait_offset, truth.trait_leniency[trait_offset.index])[0, 1] > 0.5
    # Same traits, different id -> same prediction; the generic model ignores traits entirely.
    renamed = new.assign(rater_id=new["rater_id"] + "-twin")
    pd.testing.assert_frame_equal(model.predict_expected(new), model.predict_expected(renamed))
    # Against the same rows without traits (the population prior), the traits shift each new rater's
    # predictions in the direction of their planted trait leniency.
    no_traits = new.assign(**{c: np.nan for c in new.columns if c.startswith("trait_")})
    shift = (model.predict_expected(new)["overall"] - model.predict_expected(no_traits)["overall"])
    shift = shift.groupby(new["rater_id"].to_numpy()).mean()
    assert np.corrcoef(shift, truth.trait_leniency[shift.index])[0, 1] > 0.5


@pytest.mark.parametrize("model", [GenericRater(), PersonalizedRater()], ids=["generic", "personalized"])
@pytest.mark.slow
def test_contract_proba_levels_controls_and_determinism(model, small_items):
    X, Y = small_items
    fitted = clone(model).fit(X, Y)
    again = clone(model).fit(X, Y)
    probs = fitted.predict_proba(X)
    assert list(probs) == list(Y.columns)
    for control, p in probs.items():
        assert p.shape == (len(X), 5)
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-9)
        np.testing.assert_array_equal(p, again.predict_proba(X)[control])
    levels = fitted.predict(X)
    assert set(np.unique(levels.to_numpy())) <= {1, 2, 3, 4, 5}
    expected = fitted.predict_expected(X)
    assert ((expected >= 1) & (expected <= 5)).all().all()
    first = fitted.predict_controls(X.iloc[:3])[0]
    assert set(first) == set(Y.columns)
    pred = first["overall"]
    assert isinstance(pred, ControlPrediction)
    assert 0 <= pred.confidence <= 1 and pred.level == int(np.argmax(pred.probs)) + 1
    assert pred.expected == pytest.approx(float(np.dot(pred.probs, np.arange(1, 6))))


@pytest.mark.slow
def test_clone_keeps_params_and_drops_fitted_state(small_items):
    X, Y = small_items
    model = PersonalizedRater(alpha=3.0, slopes=False, text_features="none").fit(X, Y)
    copy = clone(model)
    assert copy.get_params() == model.get_params()
    assert not hasattr(copy, "effects_")


def test_levels_and_controls_come_from_y(small_items):
    """A 1-7 scale with one control (WASSA-like) works without configuration."""
    X, Y = small_items
    y7 = pd.DataFrame({"perceived_empathy": (Y["overall"] * 1.5).round().clip(1, 7)})
    model = PersonalizedRater().fit(X, y7)
    assert model.controls_ == ["perceived_empathy"]
    assert list(model.levels_) == list(range(int(y7.min().iloc[0]), int(y7.max().iloc[0]) + 1))
    assert model.predict_proba(X)["perceived_empathy"].shape[1] == len(model.levels_)


def test_text_signal_is_learned_not_memorised(small_synth, small_items):
    """Generic model on held-out conversations: turns with the acknowledgement cue score higher."""
    X, Y = small_items
    conversations = X["conversation_id"].unique()
    test = X["conversation_id"].isin(conversations[:15]).to_numpy()
    model = GenericRater().fit(X[~test], Y[~test])
    pred = model.predict_expected(X[test])["acknowledgement"]
    cues = small_synth.truth.cues.set_index(["conversation_id", "turn_index"])["acknowledgement"]
    keys = list(zip(X[test]["conversation_id"], X[test]["turn_index"]))
    state = np.array([cues.get(k, 0) if not pd.isna(k[1]) else 0 for k in keys])
    assert pred[state == 1].mean() > pred[state == 0].mean() > pred[state == -1].mean()


def test_bad_input_is_rejected(small_items):
    X, Y = small_items
    with pytest.raises(ValueError, match="rows"):
        GenericRater().fit(X.iloc[:10], Y)
    with pytest.raises(ValueError, match="text_features"):
        GenericRater(text_features="bert").fit(X, Y)
    with pytest.raises(ValueError, match="no ratings"):
        GenericRater().fit(X, Y * np.nan)


@pytest.mark.slow
def test_to_generic_equals_a_separately_fitted_generic(small_items):
    X, Y = small_items
    shared = PersonalizedRater(backfit=0).fit(X, Y).to_generic()
    separate = GenericRater().fit(X, Y)
    for control, p in separate.predict_proba(X).items():
        np.testing.assert_allclose(shared.predict_proba(X)[control], p, atol=1e-6)
    # With backfitting the text part learns from ratings with leniency removed; still rater-blind.
    backfitted = PersonalizedRater().fit(X, Y).to_generic()
    anonymous = X.assign(rater_id="someone", **{c: np.nan for c in X.columns if c.startswith("trait_")})
    pd.testing.assert_frame_equal(backfitted.predict_expected(X), backfitted.predict_expected(anonymous))


def test_ratings_outside_given_levels_are_rejected(small_items):
    X, Y = small_items
    with pytest.raises(ValueError, match="not one of the levels"):
        GenericRater(levels=[1, 2, 3]).fit(X, Y)
