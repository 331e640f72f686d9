"""A served version trained without some raters' ratings (three model variants), and those held-out ratings as
model input: the live-posterior tests' common set-up."""

from __future__ import annotations

import copy
import functools

import pandas as pd

from sense7.data.dataset import RatingData
from sense7.data.items import trait_table, transcript_columns
from sense7.synthetic.synth import generate
from sense7.model import PersonalizedRater
from sense7.model.bundle import train_bundle
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()
VARIANTS = ["default", "rater-ridge", "rater-directions"]


@functools.lru_cache(maxsize=None)
def trained_without_held(variant: str):
    """A version (`variant`: one of VARIANTS) trained without: the last 3 conversations of a known rater, every rating of a rater with
    traits (`traits`) and of one whose traits are unknown (`unknown`). rater-ridge: a version that gives each
    known rater content weights of their own (kept as the version has them while their leniency moves).
    rater-directions: each rater also has slopes on two learned directions, which move live too.
    Fitted once per variant and session (the live-posterior and posterior-cache tests share it): callers read it
    and deep-copy what they change."""
    synth = copy.deepcopy(generate(80, 12, seed=5, taxonomy=TAXONOMY))
    for i, conv in enumerate(synth.conversations):  # named assistants: their effects are in the residual
        conv.context = dict(conv.context, assistant_id=f"model-{i % 3}")
    data = synth.rating_data()
    counts = data.ratings.groupby("rater_id")["conversation_id"].nunique().sort_values(ascending=False)
    known, with_traits, unknown = counts.index[:3]
    known_convs = sorted({c.conversation_id for c in synth.conversations if c.rater_id == known})[-3:]
    held = (data.ratings["rater_id"].isin([with_traits, unknown])
            | ((data.ratings["rater_id"] == known) & data.ratings["conversation_id"].isin(known_convs)))
    raw = data.raters.drop(columns=["email"], errors="ignore")
    train = RatingData(data.conversations, data.ratings[~held], raw.drop(index=[unknown]))
    own_weights = variant == "rater-ridge"
    personalized = {"default": None, "rater-ridge": PersonalizedRater(rater_ridge=3.0, rater_ridge_from="text"),
                    "rater-directions": PersonalizedRater(rater_directions=2)}[variant]
    bundle = train_bundle(train, "v1", TAXONOMY, personalized=personalized)
    assert (bundle.personalized.rater_ridges_ is not None) == own_weights
    assert bundle.personalized.rater_coef_.shape[2] == (4 if variant == "rater-directions" else 2)
    compiled = bundle.compile()
    traits = trait_table(raw.drop(index=[unknown]), TAXONOMY)
    return synth, data, compiled, traits, {"known": (known, known_convs), "traits": (with_traits, None),
                                           "unknown": (unknown, None)}


def held_items(setup, who):
    """(item columns, ratings (n, controls)) of the rater's turns the version did not train on."""
    synth, data, compiled, _, raters = setup
    rater, convs = raters[who]
    conversations = [c for c in synth.conversations if c.rater_id == rater
                     and (convs is None or c.conversation_id in convs)]
    columns = transcript_columns(conversations, TAXONOMY)
    wide = data.ratings.dropna(subset=["turn_index"]).pivot_table(
        index=["conversation_id", "turn_index", "rater_id"], columns="dimension", values="rating")
    keys = list(zip(columns["conversation_id"], map(int, columns["turn_index"]), columns["rater_id"]))
    ratings = wide.reindex(pd.MultiIndex.from_tuples(keys)).reindex(columns=compiled.controls).to_numpy(float).copy()
    return columns, ratings
