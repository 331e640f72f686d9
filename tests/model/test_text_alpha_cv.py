"""The text ridge's penalty chosen by inner cross-validation (alpha="cv"): one penalty per control, the
candidate with the least held-out squared error on folds grouped by conversation inside the training rows,
exactly as scikit-learn's Ridge on the same folds would choose it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

from sense7.model import GenericRater, PersonalizedRater
from sense7.model.estimators import TEXT_ALPHAS
from sense7.model.ridge import multi_ridge


def test_one_penalty_per_column_equals_separate_ridges():
    rng = np.random.default_rng(0)
    F = sp.random(200, 40, density=0.2, random_state=1, format="csr")
    Y = rng.normal(size=(200, 3))
    alphas = np.array([0.3, 10.0, 300.0])
    coef, intercept = multi_ridge(F, Y, np.ones_like(Y), alphas, tol=1e-10)
    for k, alpha in enumerate(alphas):
        reference = Ridge(alpha=alpha).fit(F.toarray(), Y[:, k])
        np.testing.assert_allclose(coef[:, k], reference.coef_, atol=1e-6)
        np.testing.assert_allclose(intercept[k], reference.intercept_, atol=1e-6)


@pytest.fixture(scope="module")
def two_controls(small_items):
    """Turns of the small synthetic study, two made-up controls: `signal` follows one cue word of the turn
    almost exactly (a light penalty fits it best), `noise` is unrelated to anything (a heavy one)."""
    X, _ = small_items
    X = X[X["turn_index"].notna()].reset_index(drop=True)
    rng = np.random.default_rng(4)
    cue = X["text"].str.contains("sense", case=False).to_numpy(dtype=float)
    signal = np.clip(np.round(2 + 2 * cue + rng.normal(0, 0.3, len(X))), 1, 5)
    noise = rng.integers(1, 6, len(X)).astype(float)
    return X, pd.DataFrame({"signal": signal, "noise": noise})


def test_the_penalty_is_chosen_per_control_as_ridge_on_the_same_folds_would(two_controls):
    X, Y = two_controls
    model = GenericRater(alpha="cv", target_scale="rating").fit(X, Y)
    assert model.alpha_[0] <= 3 and model.alpha_[1] >= 30, model.alpha_  # measured: 1 and 30
    # The same choice by hand: scikit-learn's Ridge on the model's own design, on the same 3 folds grouped by
    # conversation, each candidate scored by its held-out squared error.
    F = model.features_.transform(X).toarray()
    folds = list(GroupKFold(n_splits=3).split(F, groups=X["conversation_id"].astype(str).to_numpy()))
    for c, control in enumerate(Y.columns):
        y = Y[control].to_numpy()
        errors = [sum(((Ridge(alpha=a).fit(F[train], y[train]).predict(F[test]) - y[test]) ** 2).sum()
                      for train, test in folds) for a in TEXT_ALPHAS]
        assert model.alpha_[c] == TEXT_ALPHAS[int(np.argmin(errors))], (control, errors)
    # The chosen penalties are the ones the final model is fitted with.
    for c, control in enumerate(Y.columns):
        final = Ridge(alpha=model.alpha_[c]).fit(F, Y[control].to_numpy())
        np.testing.assert_allclose(model.text_coef_[:, c], final.coef_, atol=1e-3)


def test_the_personalized_model_chooses_too_and_bad_values_are_refused(two_controls):
    X, Y = two_controls
    model = PersonalizedRater(alpha="cv").fit(X, Y)
    assert set(model.alpha_) <= set(TEXT_ALPHAS) and model.alpha_[0] < model.alpha_[1], model.alpha_
    assert PersonalizedRater().fit(X, Y).alpha_.tolist() == [10.0, 10.0]  # a number is used as given
    with pytest.raises(ValueError, match="alpha"):
        GenericRater(alpha="lots").fit(X, Y)
