"""The rater-median baseline: each rater's own median level, by hand."""

import numpy as np
import pandas as pd

from sense7.model.baselines import RaterMedian


def test_rater_median_by_hand():
    X = pd.DataFrame({"rater_id": ["a", "a", "a", "b", "b", "c"]})
    Y = pd.DataFrame({"x": [1, 5, 2, 4, 3, np.nan]})
    model = RaterMedian().fit(X, Y)
    test = pd.DataFrame({"rater_id": ["a", "b", "c", "new"]})
    # a: 1, 2, 5 -> 2; b: 3, 4 -> the lower middle 3; c never rated x and a new rater: the median of all
    # five ratings (1, 2, 3, 4, 5) -> 3.
    assert model.predict(test)["x"].tolist() == [2, 3, 3, 3]
    p = model.predict_proba(test)["x"]
    assert p.shape == (4, 5) and p.sum(axis=1).tolist() == [1, 1, 1, 1]
    assert p.argmax(axis=1).tolist() == [1, 2, 2, 2]
