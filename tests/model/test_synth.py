"""The synthetic generator: deterministic files, valid formats, and the structure it claims to plant."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from sense7.readers.formats import load_native
from sense7.synthetic.synth import CUES, generate, write
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def _digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_seed_writes_byte_identical_files(tmp_path):
    write(generate(25, 6, seed=11, taxonomy=TAXONOMY), tmp_path / "a")
    write(generate(25, 6, seed=11, taxonomy=TAXONOMY), tmp_path / "b")
    write(generate(25, 6, seed=12, taxonomy=TAXONOMY), tmp_path / "c")
    a, b, c = _digests(tmp_path / "a"), _digests(tmp_path / "b"), _digests(tmp_path / "c")
    assert set(a) == {"conversations.jsonl", "raters.csv", "ratings.csv"}
    assert a == b
    assert all(a[name] != c[name] for name in a)


def test_written_files_load_and_validate(tmp_path):
    tax = load_taxonomy()
    synth = generate(30, 8, seed=1, taxonomy=TAXONOMY)
    paths = write(synth, tmp_path)
    data = load_native(paths["conversations.jsonl"], paths["ratings.csv"], paths["raters.csv"], taxonomy=TAXONOMY)
    assert len(data.conversations) == 30
    assert list(pd.read_csv(paths["raters.csv"]).columns) == ["rater_id", "email"] + [f.key for f in tax.profile_fields]
    assert (data.raters["email"] == [f"{r}@example.org" for r in data.raters.index]).all()
    ratings = data.ratings
    assert set(ratings["dimension"]) == set(tax.controls) | {tax.expectation_key}
    expectation = ratings[ratings["dimension"] == tax.expectation_key]["rating"]
    assert set(expectation) <= {1, 2, 3} and len(set(expectation)) >= 2
    controls = ratings[ratings["dimension"] != tax.expectation_key]["rating"]
    assert controls.between(1, 5).all() and controls.nunique() == 5
    # 5-20 assistant turns, each rated on every control by its owner.
    for conv in data.conversations.values():
        assert 5 <= len(conv.assistant_turns()) <= 20
    whole = ratings[ratings["turn_index"].isna()]
    assert len(whole) and set(whole["dimension"]) == {"overall"}


def test_cues_drive_ratings_and_failures_carry_over():
    synth = generate(150, 20, seed=5, taxonomy=TAXONOMY)
    ratings = synth.ratings.dropna(subset=["turn_index"])
    cues = synth.truth.cues
    wide = ratings.pivot_table(index=["conversation_id", "turn_index"], columns="dimension", values="rating")
    merged = cues.set_index(["conversation_id", "turn_index"]).join(wide.add_suffix("_rating"))
    for dim in CUES:
        by_state = merged.groupby(dim)[f"{dim}_rating"].mean()
        assert by_state[1] > by_state[0] + 0.3 > by_state[-1] + 0.6, dim
    # A continuity failure lowers the next turn's overall rating too (planted carry-over).
    merged = merged.sort_index()
    previous_failed = merged.groupby(level=0)["continuity"].shift(1) == -1
    clean_now = merged["continuity"] != -1
    assert (merged.loc[previous_failed & clean_now, "overall_rating"].mean()
            < merged.loc[~previous_failed & clean_now, "overall_rating"].mean() - 0.2)


def test_lexical_cues_appear_in_the_text():
    synth = generate(20, 4, seed=2, taxonomy=TAXONOMY)
    conv = synth.conversations[0]
    cues = synth.truth.cues[synth.truth.cues["conversation_id"] == conv.conversation_id]
    for row in cues.itertuples():
        text = conv.messages[row.turn_index].content
        assert text.rstrip().endswith("?") == (row.curiosity == 1), text


def test_leniency_is_partly_explained_by_traits():
    truth = generate(10, 200, seed=9, taxonomy=TAXONOMY).truth
    corr = np.corrcoef(truth.leniency, truth.trait_leniency)[0, 1]
    assert 0.3 < corr < 0.9  # traits explain some, not all, of a rater's leniency


def test_rater_blind_truth_is_the_average_rater():
    """population_latent: the same turns as latent, for a rater without leniency or sensitivities of their
    own. What separates the two is the rater: a constant shift per rater and control (leniency, offsets)
    plus how strongly they react to the turn (sensitivities), so the difference has a rater mean far from 0
    and varies within raters; the average rater itself ranks turns close to, not exactly like, the raters."""
    truth = generate(40, 8, seed=4, taxonomy=TAXONOMY).truth
    keys = ["conversation_id", "turn_index", "rater_id"]
    merged = truth.latent.merge(truth.population_latent, on=keys, suffixes=("", "_average"))
    assert len(merged) == len(truth.latent) == len(truth.population_latent)
    turns = merged[merged["turn_index"].notna()]
    difference = turns["acknowledgement"] - turns["acknowledgement_average"]
    per_rater = difference.groupby(turns["rater_id"])
    assert per_rater.mean().abs().max() > 0.3  # leniency
    assert per_rater.std().min() > 0.01  # sensitivity: not a constant shift
    assert 0.6 < np.corrcoef(turns["acknowledgement"], turns["acknowledgement_average"])[0, 1] < 0.999
