"""Rater-specific slopes on extra directions (RaterEffects(extra=...), PersonalizedRater.rater_directions):
planted slopes are recovered, shrunk toward what the traits predict."""

import numpy as np

from sense7.model.rater_effects import RaterEffects


def planted_reactions(direction, reaction: float, seed: int, noise_seed: int):
    """Synthetic turn ratings (acknowledgement, support) in which half the raters rate a turn `reaction` higher
    per unit of `direction(synth, X)` (one value per turn) and the other half as much lower; then a 70/30
    split by conversation. Returns X, Y, train rows, test rows."""
    import pandas as pd
    from sklearn.model_selection import GroupShuffleSplit

    from sense7.data.items import build_items
    from sense7.model.oracle import SynthOracle
    from sense7.synthetic.synth import generate
    from sense7.taxonomy import load_taxonomy

    taxonomy = load_taxonomy()
    synth = generate(150, 10, seed=seed, taxonomy=taxonomy)
    X, Y = build_items(synth.rating_data(), taxonomy)
    turn = X["turn_index"].notna().to_numpy()
    X, Y = X[turn].reset_index(drop=True), Y[turn].reset_index(drop=True)[["acknowledgement", "support"]]
    planted = direction(synth, X)
    raters = sorted(X["rater_id"].unique())
    sign = dict(zip(raters, np.where(np.arange(len(raters)) % 2 == 0, reaction, -reaction)))
    latent = SynthOracle(synth.truth).latent_means(X, Y.columns).to_numpy(float) \
        + (planted * X["rater_id"].map(sign).to_numpy())[:, None]
    noise = np.random.default_rng(noise_seed).normal(0, synth.truth.noise_sd, latent.shape)
    Y = pd.DataFrame(1 + np.searchsorted(synth.truth.thresholds, latent + noise), columns=Y.columns).astype(float)
    train, test = next(GroupShuffleSplit(1, test_size=0.3, random_state=0).split(X, groups=X["conversation_id"]))
    return X, Y, train, test


def within_rater_spearman(model, X, Y, train, test) -> float:
    """Mean within-rater Spearman of `model`'s expected ratings on the test rows, fitted on the train rows."""
    from sense7.research.perspectivist import within_group_spearman

    predicted = model.fit(X.iloc[train], Y.iloc[train]).predict_expected(X.iloc[test])
    return float(np.nanmean(np.concatenate([
        within_group_spearman(X["rater_id"].to_numpy()[test], Y[c].to_numpy()[test], predicted[c].to_numpy())
        for c in Y.columns])))


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


def test_rater_directions_learn_what_moves_each_rater_from_the_residuals():
    """Planted: half the raters rate a turn 1.5 higher when the assistant's previous turn forgot the user's
    named detail, the other half 1.5 lower (same leniency on average, same traits prior). A slope on the text
    score cannot change how a rater's turns rank; one slope on a direction learned from the residuals can.
    (Directions fixed in advance, the relational columns' principal directions, gained nothing here.)"""
    from sense7.model.estimators import PersonalizedRater

    def previous_forgot(synth, X):
        cues = synth.truth.cues.sort_values(["conversation_id", "turn_index"]).astype({"turn_index": int})
        cues["previous_forgot"] = cues.groupby("conversation_id")["continuity"].shift(1).eq(-1).astype(float)
        keys = X[["conversation_id", "turn_index"]].astype({"turn_index": int})
        return keys.merge(cues, how="left")["previous_forgot"].to_numpy()

    X, Y, train, test = planted_reactions(previous_forgot, reaction=1.5, seed=5, noise_seed=0)

    def within_rater(model) -> float:
        return within_rater_spearman(model, X, Y, train, test)

    plain, directed = within_rater(PersonalizedRater()), within_rater(PersonalizedRater(rater_directions=1))
    # Measured: plain 0.568, directed 0.605 (the truth 0.714); the fixed relational directions of the
    # previous version: 0.564 (this test failed on it).
    assert directed - plain > 0.02, (plain, directed)


def test_rater_directions_from_the_encoders_columns_only():
    """rater_directions_from="encoder": the directions live in the text encoder's columns (e.g. sentence
    embeddings) and nowhere else; planted: half the raters like longer turns, half shorter ones (what an
    encoder column sees), and one such direction finds it."""
    import pytest

    from sense7.model.estimators import PersonalizedRater
    from sense7.model.text import TextEncoder

    class Length(TextEncoder):
        def transform(self, texts):
            words = np.array([len(t.split()) for t in texts], dtype=float)
            return np.column_stack([np.log1p(words), np.log1p(words) ** 2 / 10.0])

    def turn_length(synth, X):
        length = np.log1p(X["text"].str.split().str.len().to_numpy(float))
        return (length - length.mean()) / length.std()

    X, Y, train, test = planted_reactions(turn_length, reaction=1.0, seed=6, noise_seed=1)

    def within_rater(model) -> float:
        return within_rater_spearman(model, X, Y, train, test)

    directed = PersonalizedRater(text_encoder=Length(), rater_directions=1, rater_directions_from="encoder")
    plain = within_rater(PersonalizedRater(text_encoder=Length()))
    gained = within_rater(directed)
    assert gained - plain > 0.02, (plain, gained)
    used = np.flatnonzero(np.abs(directed.direction_coef_).sum(axis=1) > 0)
    encoder = directed.features_.block_columns("encoder")
    assert used.min() >= encoder.start and used.max() < encoder.stop
    with pytest.raises(ValueError, match="needs a text_encoder"):
        PersonalizedRater(rater_directions=1, rater_directions_from="encoder",
                          text_encoder=None).fit(X.iloc[train], Y.iloc[train])
