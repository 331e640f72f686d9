"""Trait audit: the traits synth plants in rater leniency come out on top; JSON, determinism, CLI, report."""

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator
from sklearn.linear_model import Ridge
from typer.testing import CliRunner

from sense7.cli import app
from sense7.data.items import build_items, trait_columns
from sense7.model.baselines import RaterMean
from sense7.research.report import render_report
from sense7.research.trait_audit import audit_rating_data, trait_audit
from sense7.synthetic.synth import generate, write
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

runner = CliRunner()
TIPI = {f"tipi_{i}" for i in range(1, 11)}


def _drop_seconds(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "seconds"}


@pytest.fixture(scope="module")
def audit():
    # Many raters, few ratings each: cold-start error depends on how well traits predict leniency, which synth
    # plants from ai_emotional (strongest), agreeableness (tipi_7, reverse-keyed tipi_2) and ai_concern.
    data = generate(40, 120, seed=0, raters_per_conversation=3, taxonomy=TAXONOMY).rating_data()
    return audit_rating_data(data, TAXONOMY, n_folds=5, n_repeats=3, seed=0, n_boot=500)


@pytest.mark.slow  # the planted study (120 raters), 5 folds x 3 repeats x every trait item
def test_planted_items_rank_above_unplanted_ones(audit):
    items = {u["name"]: u for u in audit["items"]}
    emotional = items["ai_emotional"]
    assert emotional["importance"] > 0 and emotional["ci"][0] > 0
    assert audit["items"][0]["name"] == "ai_emotional"  # sorted, largest first
    for unplanted in ("job_role", "gender"):
        u = items[unplanted]
        assert u["ci"][0] <= 0 <= u["ci"][1] or u["importance"] < emotional["importance"]
        assert u["importance"] < emotional["importance"]


@pytest.mark.slow  # the planted study (120 raters), 5 folds x 3 repeats x every trait item
def test_both_levels_are_reported_and_tipi_items_individually(audit):
    items = {u["name"]: u for u in audit["items"]}
    features = {u["name"]: u for u in audit["features"]}
    assert TIPI <= set(items)
    assert items["tipi_7"]["features"] == ["big5_agreeableness"] == items["tipi_2"]["features"]
    assert features["big5_agreeableness"]["columns"] == ["big5_agreeableness"]
    assert features["gender"]["columns"] == ["gender_woman", "gender_man", "gender_non_binary",
                                             "gender_prefer_not_to_say"]
    # An item that is exactly one feature group is the same shuffle, hence the same number.
    assert items["gender"]["importance"] == features["gender"]["importance"]
    assert audit["split"] == "cold_start" and 50 < audit["n_raters"] <= 120 and audit["unaudited_items"] == []
    assert audit["baseline"]["mae"] > 0 and audit["baseline"]["spearman"] > 0.3
    for u in audit["items"] + audit["features"]:
        lo, hi = u["ci"]
        assert lo <= u["importance"] <= hi


@pytest.mark.slow  # the planted study (120 raters), 5 folds x 3 repeats x every trait item
def test_result_is_strict_json_and_drawn_in_the_report(audit):
    json.dumps(audit, allow_nan=False)
    from sense7.research.evaluation import evaluate

    data = generate(8, 6, seed=1, taxonomy=TAXONOMY).rating_data()
    result = evaluate(data, splits=("cold_start",), n_folds=3, n_boot=10, models={"rater_mean": RaterMean()}, taxonomy=TAXONOMY)
    result["trait_audit"] = audit
    html = render_report(result)
    assert "Trait audit: what each trait" in html
    assert 'alt="Trait audit: questionnaire items"' in html and 'alt="Trait audit: trait features' in html


@pytest.fixture(scope="module")
def small():
    data = generate(12, 24, seed=1, raters_per_conversation=2, taxonomy=TAXONOMY).rating_data()
    X, Y = build_items(data, TAXONOMY)
    return X, Y, data.raters


class _TraitRidge(BaseEstimator):
    """A quick rater model that reads nothing but the traits (a ridge per control), so every shuffle moves its
    predictions; its probabilities split between the two levels around the ridge score."""

    def fit(self, X, Y):
        self.columns_, self.levels_ = trait_columns(X), np.arange(1.0, 6.0)
        Z = X[self.columns_].fillna(0).to_numpy(float)
        self.ridges_ = {c: Ridge(alpha=1.0).fit(Z[Y[c].notna()], Y[c].dropna()) for c in Y.columns}
        return self

    def predict_proba(self, X):
        Z = X[self.columns_].fillna(0).to_numpy(float)
        out = {}
        for c, ridge in self.ridges_.items():
            score = np.clip(ridge.predict(Z), 1, 5) - 1
            low = np.minimum(np.floor(score).astype(int), 3)
            p = np.zeros((len(X), 5))
            p[np.arange(len(X)), low] = 1 - (score - low)
            p[np.arange(len(X)), low + 1] += score - low
            out[c] = p
        return out

    def predict(self, X):
        return pd.DataFrame({c: self.levels_[p.argmax(axis=1)] for c, p in self.predict_proba(X).items()})


@pytest.mark.slow  # three full audits
def test_deterministic_with_a_seed(small):
    X, Y, raters = small
    options = dict(taxonomy=TAXONOMY, n_folds=3, n_repeats=2, seed=4, n_boot=50, raters=raters)
    first = trait_audit(X, Y, _TraitRidge(), **options)
    again = trait_audit(X, Y, _TraitRidge(), **options)
    assert _drop_seconds(first) == _drop_seconds(again)
    assert any(u["importance"] != 0 for u in first["items"])
    other = trait_audit(X, Y, _TraitRidge(), **{**options, "seed": 5})
    assert _drop_seconds(other) != _drop_seconds(first)


@pytest.mark.parametrize("method", ["permutation", "drop"])
def test_a_model_that_ignores_traits_gets_zero_importance(small, method):
    X, Y, raters = small
    result = trait_audit(X, Y, RaterMean(), TAXONOMY, n_folds=3, n_repeats=2, n_boot=50, raters=raters, method=method)
    assert result["method"] == method and result["items"] and result["features"]
    for u in result["items"] + result["features"]:
        assert u["importance"] == 0 and u["ci"] == [0, 0] and u["importance_spearman"] in (0, None)


def test_without_the_raw_answers_only_features_are_audited(small):
    X, Y, _ = small
    result = trait_audit(X, Y, RaterMean(), TAXONOMY, n_folds=3, n_repeats=1, n_boot=20)
    assert result["items"] == [] and {u["name"] for u in result["features"]} >= {"ai_emotional", "big5_openness"}


def test_unknown_method_is_refused(small):
    X, Y, raters = small
    with pytest.raises(ValueError, match="method"):
        trait_audit(X, Y, RaterMean(), TAXONOMY, method="shapley")


@pytest.mark.slow  # a whole evaluate run with the audit
def test_evaluate_cli_trait_audit_prints_and_writes_it(tmp_path):
    write(generate(16, 12, seed=3, taxonomy=TAXONOMY), tmp_path)
    out = tmp_path / "result.json"
    args = ["evaluate", "--conversations", str(tmp_path / "conversations.jsonl"), "--ratings",
            str(tmp_path / "ratings.csv"), "--raters", str(tmp_path / "raters.csv"), "--models", "rater_mean",
            "--splits", "cold_start", "--folds", "3", "--boot", "20", "--trait-audit", "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Trait audit" in result.output and "tipi_7" in result.output
    assert "per rater and per turn" in result.output
    saved = json.loads(out.read_text())
    assert saved["trait_audit"]["method"] == "permutation" and saved["trait_audit"]["items"]
    assert "perspectivist" in saved["splits"]["cold_start"]
