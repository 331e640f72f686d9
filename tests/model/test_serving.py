"""The serving path (CompiledBundle) gives exactly the reference's predictions: ModelBundle.predict_items
on items_from_tasks, for every kind of rater, context and text, and for non-default models."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from sense7.data.dataset import trait_features
from sense7.data.items import items_from_tasks, task_columns
from sense7.labelstudio.importer import plan_tasks
from sense7.model import GenericRater, PersonalizedRater
from sense7.model.bundle import load_bundle, save_bundle, train_bundle
from sense7.model.features import TextEncoder
from sense7.model.serving import CompiledBundle
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


class CueEncoder(TextEncoder):
    """A stand-in for sentence embeddings: two dense columns per text (length, apology)."""

    def transform(self, texts):
        return np.array([[len(t.split()) / 20.0, float("sorry" in t.lower())] for t in texts])


@pytest.fixture(scope="module")
def study():
    """Synthetic study whose conversations name their assistant (3 model versions), so assistant
    effects are learned and served too."""
    synth = generate(60, 12, seed=3, taxonomy=TAXONOMY)
    synth = copy.deepcopy(synth)
    for i, conv in enumerate(synth.conversations):
        conv.context = dict(conv.context, assistant_id=f"model-{i % 3}")
    return synth


@pytest.fixture(scope="module")
def served_tasks(study):
    """Tasks of known raters, newcomers with full / partial / no traits, strangers, odd texts, missing
    contexts and an assistant nobody has rated; with the raw trait frame and contexts the store holds."""
    raw = study.raters.drop(columns=["email"]).set_index("rater_id")
    base = [t["data"] for t in plan_tasks(study.conversations)][:120]
    contexts = {(c.conversation_id, c.rater_id): c.context for c in study.conversations}
    newcomers = raw.iloc[:3].copy()
    newcomers.index = ["new-full", "new-partial", "new-blank"]
    newcomers.iloc[1, ::2] = np.nan
    newcomers.iloc[2, :] = np.nan  # a profile with no answers: served by the generic model
    raters = pd.concat([raw, newcomers])
    datas = []
    for i, data in enumerate(base):
        data = dict(data)
        who = ["known", "new-full", "new-partial", "new-blank", "stranger"][i % 5]
        if who != "known":
            contexts[(data["conversation_id"], who)] = contexts[(data["conversation_id"], data["rater_id"])]
            data["rater_id"] = who
        if i % 7 == 0:  # a context the store does not have
            data["rater_id"] = f"{data['rater_id']}-elsewhere"
        if i % 11 == 0:
            data["assistant_id"] = "model-never-rated"
        if i % 13 == 0:
            data["turn"] = [{"role": "assistant", "content": "¡Oh!! 😀 I'm SO sorry\x01... that's  hard — really."}]
        if i % 17 == 0:
            data["turn"] = [{"role": "assistant", "content": ""}]
            data["history"] = []
        datas.append(data)
    return datas, raters, contexts


def _compare(bundle, served_tasks):
    datas, raters, contexts = served_tasks
    reference = bundle.predict_items(items_from_tasks(datas, raters, contexts, TAXONOMY))
    compiled = CompiledBundle(bundle)
    table = compiled.rater_table(trait_features(raters, TAXONOMY).add_prefix("trait_"))
    got = compiled.predict(task_columns(datas, contexts, TAXONOMY), table)
    assert got.kinds == [p.kind for p in reference]
    expected = np.array([[p.controls[c].probs for c in bundle.controls] for p in reference])
    np.testing.assert_allclose(got.probs, expected, rtol=0, atol=1e-6)
    levels, confidence = got.best()
    assert levels.shape == (len(datas), len(bundle.controls))
    np.testing.assert_allclose(confidence, expected.max(axis=2), atol=1e-6)
    # Again one item at a time, last first: the dense part now comes from the rows the first call kept.
    columns = task_columns(datas, contexts, TAXONOMY)
    for i in reversed(range(len(datas))):
        one = compiled.predict({name: [values[i]] for name, values in columns.items()}, table)
        np.testing.assert_allclose(one.probs[0], expected[i], rtol=0, atol=1e-6)
    return got


def test_compiled_equals_reference_for_every_kind_of_rater(study, served_tasks):
    bundle = train_bundle(study.rating_data(), "v1", TAXONOMY)
    got = _compare(bundle, served_tasks)
    assert {"personalized", "traits", "generic"} <= set(got.kinds)
    # The checks above mean something: the kinds really differ in what they predict.
    kinds = np.array(got.kinds)
    assert not np.allclose(got.probs[kinds == "personalized"].mean(0), got.probs[kinds == "generic"].mean(0),
                           atol=1e-3)


@pytest.mark.parametrize("personalized, generic", [
    (PersonalizedRater(slopes=False, pool_controls=True), GenericRater(history_chars=100)),
    (PersonalizedRater(text_features="tfidf+char"), None),  # scored through the reference estimator
    (PersonalizedRater(text_weighting="tfidf", history_chars=0), None),
    (PersonalizedRater(relational_weight=0.3), GenericRater(relational_weight=0.3)),
    (PersonalizedRater(text_encoder=CueEncoder()), None),  # a plugged-in encoder: scored by the estimator
    # ... with its similarity of the turn and the message it answers (ENCODER_RELATIONAL_COLUMNS)
    (PersonalizedRater(text_encoder=CueEncoder(), relational_weight=0.3),
     GenericRater(text_encoder=CueEncoder(), relational_weight=0.3)),
    (PersonalizedRater(text_encoder=CueEncoder(), rater_directions=1, rater_directions_from="encoder"), None),
    (PersonalizedRater(rater_directions=2), None),
    (PersonalizedRater(rater_directions=1, slopes=False), None),
    (PersonalizedRater(rater_ridge="cv_rater", rater_ridge_from="text"), None),  # own content weights, per rater
    (PersonalizedRater(text_encoder=CueEncoder(), rater_ridge=3.0), None),
    # the encoder block's weight chosen by inner CV (folded into its block scale)
    (PersonalizedRater(text_encoder=CueEncoder(), encoder_weight="cv", relational_weight="cv"),
     GenericRater(text_encoder=CueEncoder(), encoder_weight=2.0)),
], ids=["pooled-no-slopes-separate-generic", "char-ngrams", "tfidf-weighting", "relational", "text-encoder",
        "text-encoder-relational", "rater-directions-from-the-encoder",
        "rater-directions", "rater-directions-no-slopes", "rater-ridge", "rater-ridge-text-encoder",
        "encoder-weight"])
@pytest.mark.slow
def test_compiled_equals_reference_for_non_default_models(study, served_tasks, personalized, generic):
    bundle = train_bundle(study.rating_data(), "v2", TAXONOMY, personalized=personalized, generic=generic)
    _compare(bundle, served_tasks)


@pytest.mark.slow
def test_compiled_from_a_saved_bundle(study, served_tasks, tmp_path):
    """Look-up tables are rebuilt on load (they are not stored in the file)."""
    save_bundle(train_bundle(study.rating_data(), "v3", TAXONOMY), tmp_path)
    _compare(load_bundle(tmp_path), served_tasks)


def test_rater_table_is_cached_per_trait_table(study, served_tasks):
    _, raters, _ = served_tasks
    compiled = CompiledBundle(train_bundle(study.rating_data(), "v4", TAXONOMY))
    traits = trait_features(raters, TAXONOMY).add_prefix("trait_")
    first = compiled.rater_table(traits)
    assert compiled.rater_table(traits) is first
    assert compiled.rater_table(traits.copy()) is not first  # a refreshed table is recomputed
