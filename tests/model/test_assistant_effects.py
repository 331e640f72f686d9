"""The optional per-assistant (ratee) effect: learned in fit from training rows only, shrunk toward 0."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from sense7.data.items import items_from_tasks
from sense7.model import GenericRater, PersonalizedRater
from sense7.model.rater_effects import AssistantEffects
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def _with_assistants(small_items, n_few=2, n_many=50):
    """Every item gets one of ten neutral assistants, except that "few" (2 items) and "many" (50 items)
    are rated one level higher on `overall` than the rater really gave (items rated 1-4, so never clipped).
    Both are equally "good"; only the evidence differs."""
    X, Y = small_items
    X, Y = X.copy(), Y.copy()
    rng = np.random.default_rng(5)
    X["assistant_id"] = [f"a{i}" for i in rng.integers(0, 10, len(X))]
    candidates = np.flatnonzero((Y["overall"] <= 4).to_numpy())
    rows = rng.choice(candidates, n_few + n_many, replace=False)
    X.loc[X.index[rows], "assistant_id"] = ["few"] * n_few + ["many"] * n_many
    Y.loc[Y.index[rows], "overall"] += 1
    return X, Y


@pytest.mark.parametrize("model", [GenericRater(assistant_effects=True), PersonalizedRater(assistant_effects=True)],
                         ids=["generic", "personalized"])
@pytest.mark.slow
def test_assistant_effect_is_shrunk_and_unseen_assistants_get_zero(model, small_items):
    X, Y = _with_assistants(small_items)
    j = list(Y.columns).index("overall")
    fitted = clone(model).fit(X, Y)
    effect = fitted.assistant_effects_[j]
    few, many, unseen = effect.effect(np.array(["few", "many", "never-seen"], dtype=object))
    assert many > 0.2
    assert 0 <= few < 0.5 * many  # 2 ratings: pulled most of the way back to 0
    assert unseen == 0.0
    # In predictions: an unseen (or unknown) assistant is exactly "no assistant effect".
    rows = X.iloc[:20]
    pd.testing.assert_frame_equal(fitted.predict_expected(rows.assign(assistant_id="never-seen")),
                                  fitted.predict_expected(rows.assign(assistant_id=None)))
    lifted = fitted.predict_expected(rows.assign(assistant_id="many"))["overall"]
    assert (lifted > fitted.predict_expected(rows.assign(assistant_id=None))["overall"]).all()
    assert clone(fitted).get_params()["assistant_effects"] is True


@pytest.mark.slow
def test_assistant_effect_is_learned_from_training_rows_only(small_items):
    X, Y = _with_assistants(small_items)
    many = (X["assistant_id"] == "many").to_numpy()
    train = ~many | (np.cumsum(many) > 40)  # 10 of the 50 "many" ratings are training rows
    model = PersonalizedRater(assistant_effects=True).fit(X[train], Y[train])
    j = list(Y.columns).index("overall")
    effect = model.assistant_effects_[j]
    assert effect.counts_[effect.index_.get_loc("many")] == 10
    # Changing the held-out ratings changes nothing: fit never saw them.
    Y2 = Y.copy()
    Y2.loc[~train, "overall"] = 1.0
    again = PersonalizedRater(assistant_effects=True).fit(X[train], Y2[train])
    np.testing.assert_allclose(again.assistant_effects_[j].effect_, effect.effect_)
    # Switched off, the column is ignored entirely.
    off = PersonalizedRater(assistant_effects=False).fit(X[train], Y[train])
    pd.testing.assert_frame_equal(off.predict_expected(X[~train]),
                                  off.predict_expected(X[~train].assign(assistant_id=None)))


def test_assistant_effects_em_shrinks_by_count():
    rng = np.random.default_rng(0)
    keys = np.array(["few"] * 2 + ["many"] * 50 + [f"n{i % 20}" for i in range(400)] + [None] * 30, dtype=object)
    e = rng.normal(0, 1, len(keys))
    e[:52] += 1.0
    fitted = AssistantEffects().fit(keys, e)
    few, many, unknown = fitted.effect(np.array(["few", "many", None], dtype=object))
    assert many > 0.6 and abs(few) < 0.5 * many and unknown == 0.0
    assert fitted.effect_.shape == (22,)  # unknown (None) rows are not an assistant


def test_task_data_without_assistant_id_means_unknown():
    task = {"conversation_id": "c1", "turn_index": 1, "rater_id": "r1", "position": "Response 1 of 1",
            "history": [{"role": "user", "content": "hi"}], "turn": [{"role": "assistant", "content": "hello"}]}
    empty = pd.DataFrame(index=pd.Index([], name="rater_id"))
    X = items_from_tasks([task], empty, {}, TAXONOMY)
    assert "assistant_id" in X.columns and X["assistant_id"].isna().all()
    X = items_from_tasks([task], empty, {("c1", "r1"): {"assistant_id": "model-v2"}}, TAXONOMY)
    assert X["assistant_id"].tolist() == ["model-v2"]
