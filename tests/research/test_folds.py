"""Folds respect their grouping, and whatever a model learns comes from the training fold only."""

import numpy as np
import pandas as pd
import pytest

from sense7.model.baselines import GlobalMean, MajorityClass, RaterMean
from sense7.research.evaluation import cross_val_predictions, evaluate_items, make_folds

from tests.support.research import planted_items


@pytest.mark.parametrize("split, column", [("known_rater", "conversation_id"), ("cold_start", "rater_id")])
def test_folds_never_share_a_group_and_test_every_row_once(split, column):
    X, _ = planted_items(shared_conversations=True, n_conversations=12)
    folds = make_folds(X, split, n_folds=5, seed=3)
    assert len(folds) == 5
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested) == list(range(len(X)))
    for train, test in folds:
        assert not set(X[column].iloc[train]) & set(X[column].iloc[test])


def test_known_rater_folds_keep_raters_known_and_cold_start_folds_do_not():
    X, _ = planted_items()
    for train, test in make_folds(X, "known_rater", 5, 0):
        assert set(X.rater_id.iloc[test]) <= set(X.rater_id.iloc[train])
    for train, test in make_folds(X, "cold_start", 5, 0):
        assert not set(X.rater_id.iloc[test]) & set(X.rater_id.iloc[train])


def test_fold_assignment_depends_on_the_seed():
    X, _ = planted_items()
    a = [tuple(test) for _, test in make_folds(X, "known_rater", 5, 0)]
    b = [tuple(test) for _, test in make_folds(X, "known_rater", 5, 1)]
    assert a != b


def test_too_few_groups_is_a_clear_error():
    X, _ = planted_items(n_raters=1)
    with pytest.raises(ValueError, match="at least two distinct rater_id"):
        make_folds(X, "cold_start", 5, 0)


def test_rater_mean_fitted_on_a_fold_does_not_know_the_held_out_ratings():
    X, Y = planted_items(seed=5)
    train, test = make_folds(X, "known_rater", 5, 0)[0]
    fitted = RaterMean(pseudo_count=2).fit(X.iloc[train], Y.iloc[train])
    # Move every held-out rating to the top of the scale: a fit that saw them would change.
    Y_changed = Y.copy()
    Y_changed.iloc[test] = 5.0
    refitted = RaterMean(pseudo_count=2).fit(X.iloc[train], Y_changed.iloc[train])
    pd.testing.assert_frame_equal(fitted.predict_expected(X.iloc[test]), refitted.predict_expected(X.iloc[test]))
    # ... and its rater means are exactly the shrunk means of the training rows.
    rater = X.rater_id.iloc[train[0]]
    own = Y.overall.iloc[train][X.rater_id.iloc[train] == rater]
    global_mean = Y.overall.iloc[train].mean()
    expected = (own.sum() + 2 * global_mean) / (len(own) + 2)
    assert fitted.rater_means_["overall"][rater] == pytest.approx(expected)


class _SpyRater(GlobalMean):
    """Records which conversations and raters each fitted clone was trained on."""

    log: list = []

    def fit(self, X, Y):
        self.seen_ = (set(X.conversation_id), set(X.rater_id))
        return super().fit(X, Y)

    def predict(self, X):
        _SpyRater.log.append((self.seen_, set(X.conversation_id), set(X.rater_id)))
        return super().predict(X)


@pytest.mark.parametrize("split", ["known_rater", "cold_start"])
def test_each_fitted_clone_only_saw_training_rows(split):
    X, Y = planted_items(shared_conversations=True, n_conversations=12)
    _SpyRater.log = []
    folds = make_folds(X, split, 4, 0)
    cross_val_predictions(_SpyRater(), X, Y, folds, np.arange(1, 6))
    assert len(_SpyRater.log) == 4
    for (seen_convs, seen_raters), test_convs, test_raters in _SpyRater.log:
        if split == "known_rater":
            assert not seen_convs & test_convs
        else:  # a new rater may rate conversations others rated in training: only raters are held out
            assert not seen_raters & test_raters


def test_train_counts_are_the_raters_training_rows_in_that_fold():
    X, Y = planted_items(n_raters=6, n_conversations=5, n_turns=2)
    folds = make_folds(X, "known_rater", 5, 0)
    _, _, counts = cross_val_predictions(MajorityClass(), X, Y, folds, np.arange(1, 6))
    for train, test in folds:
        for row in test:
            assert counts[row] == (X.rater_id.iloc[train] == X.rater_id.iloc[row]).sum()


def test_metrics_are_per_fold_so_a_constant_predictor_gets_no_spearman():
    # Pooled over folds, fold-to-fold shifts of a training mean would fake a (negative) correlation.
    X, Y = planted_items()
    result = evaluate_items(X, Y, {"global_mean": GlobalMean()}, splits=("cold_start",), n_boot=50)
    overall = result["splits"]["cold_start"]["models"]["global_mean"]["overall"]
    assert overall["spearman"] is None and overall["spearman_ci"] == [None, None]


def test_personalized_rater_fitted_on_a_cold_start_fold_knows_no_test_rater():
    from sklearn.base import clone

    from sense7.model import PersonalizedRater

    X, Y = planted_items(n_raters=12, n_conversations=6, n_turns=3)
    for train, test in make_folds(X, "cold_start", 3, 0):
        fitted = clone(PersonalizedRater()).fit(X.iloc[train].reset_index(drop=True),
                                                Y.iloc[train].reset_index(drop=True))
        assert not fitted.is_known(X.iloc[test]).any()
        assert fitted.is_known(X.iloc[train]).all()


def test_parallel_folds_give_the_same_result():
    X, Y = planted_items(n_raters=10)
    models = {"rater_mean": RaterMean(), "majority": MajorityClass()}
    serial = evaluate_items(X, Y, models, n_folds=3, n_boot=20)
    parallel = evaluate_items(X, Y, models, n_folds=3, n_boot=20, n_jobs=2)
    for result in (serial, parallel):
        for split in result["splits"].values():
            split.pop("fit_predict_seconds")
    assert serial == parallel
