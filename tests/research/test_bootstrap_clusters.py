"""Guards on the evaluation's Spearman intervals: they must resample clusters (conversations for known
raters, raters for cold start), not single ratings, and be real intervals, not a constant [-1, 1].

Rows of one cluster share an offset in both the rating and the score, so they are far from independent:
a row-level bootstrap would see 10x more independent evidence than there is and give a much narrower
interval. Nothing here would notice a subtly different cluster bootstrap; it notices the two breakages
that leave every other test green."""

import numpy as np
import pandas as pd
import pytest

from sense7.model.baselines import RaterMean
from sense7.research import evaluation
from sense7.research.evaluation import SPLITS, evaluate_items
from sense7.research.metrics import fold_spearman_draws
from sense7.research.metrics import percentile_ci, spearman

from tests.support.research import planted_items


def _clustered(n_clusters=30, per_cluster=10, offset_sd=1.0, noise_sd=0.5, seed=0):
    """(y, scores, cluster codes): rating and score both = cluster offset + independent noise."""
    rng = np.random.default_rng(seed)
    cluster = np.repeat(np.arange(n_clusters), per_cluster)
    offset = rng.normal(0, offset_sd, n_clusters)[cluster]
    rating = np.clip(np.round(3 + offset + rng.normal(0, noise_sd, len(cluster))), 1, 5)
    score = offset + rng.normal(0, noise_sd, len(cluster))
    return pd.DataFrame({"overall": rating}), {"model": pd.DataFrame({"overall": score})}, cluster


def _interval(y, scores, clusters, fold_ids, seed=0):
    boot = fold_spearman_draws(y, scores, clusters, fold_ids, n_boot=400, seed=seed)
    return percentile_ci(boot["model"]["__overall__"])


@pytest.mark.parametrize("cluster_kind", ["conversation", "rater"])
def test_cluster_interval_is_wider_than_a_row_level_one(cluster_kind):
    # One frame shape serves both: what matters is that the codes passed are the correlated groups.
    y, scores, cluster = _clustered(seed=0 if cluster_kind == "conversation" else 1)
    if cluster_kind == "rater":  # raters' rows interleaved in time, not contiguous blocks
        order = np.random.default_rng(2).permutation(len(cluster))
        y, scores, cluster = y.iloc[order], {"model": scores["model"].iloc[order]}, cluster[order]
    one_fold = np.zeros(len(cluster), int)
    point = spearman(y["overall"], scores["model"]["overall"])

    lo, hi = _interval(y, scores, cluster, one_fold)
    row_lo, row_hi = _interval(y, scores, np.arange(len(cluster)), one_fold)

    assert lo < point < hi and hi - lo < 0.5
    assert hi - lo > 1.5 * (row_hi - row_lo)


def test_folds_do_not_change_which_rows_move_together():
    # Folds grouped by cluster, as make_folds builds them: the cluster interval stays the wider one.
    y, scores, cluster = _clustered(seed=3)
    folds = cluster % 3
    lo, hi = _interval(y, scores, cluster, folds)
    row_lo, row_hi = _interval(y, scores, np.arange(len(cluster)), folds)
    assert hi - lo > 1.5 * (row_hi - row_lo)


def _same_partition(codes, labels) -> bool:
    """True when `codes` group the rows exactly as `labels` do (up to renaming)."""
    pairs = pd.DataFrame({"code": codes, "label": labels}).drop_duplicates()
    return len(pairs) == pairs["code"].nunique() == pairs["label"].nunique()


def test_evaluate_items_passes_the_split_clusters_and_reports_a_real_interval(monkeypatch):
    X, Y = planted_items(n_raters=12, n_conversations=5, n_turns=3, rater_sd=1.0, noise_sd=0.6, seed=5)
    calls = []
    original = evaluation.fold_spearman_draws

    def recording(y, scores, clusters, fold_ids, n_boot, seed):
        calls.append(np.asarray(clusters).copy())
        return original(y, scores, clusters, fold_ids, n_boot, seed)

    monkeypatch.setattr(evaluation, "fold_spearman_draws", recording)
    result = evaluate_items(X, Y, {"rater_mean": RaterMean()}, splits=("known_rater", "cold_start"), n_folds=3,
                            n_boot=200)

    assert len(calls) == 2
    for split, clusters in zip(("known_rater", "cold_start"), calls):
        labels = X[SPLITS[split]].astype(str).to_numpy()
        assert _same_partition(clusters, labels), split
        assert len(np.unique(clusters)) == len(np.unique(labels)) < len(X)

    overall = result["splits"]["known_rater"]["models"]["rater_mean"]["overall"]
    lo, hi = overall["spearman_ci"]
    assert lo < overall["spearman"] < hi
    assert hi - lo < 1 and [lo, hi] != [-1, 1]
