"""The retrain's promotion gate: a candidate that scores below the served version on the held-out slice
is kept out, and the served version stays; with the gate relaxed the same candidate is promoted (so it is
the comparison, not chance, that decided)."""

from __future__ import annotations

import numpy as np
import pytest
from sense7.retraining import Retrainer

from tests.support.jobs import served_and_spoiled_store


pytestmark = pytest.mark.slow  # each test trains and retrains models


@pytest.fixture
def served_and_spoiled(tmp_path):
    return served_and_spoiled_store(tmp_path)


def test_a_candidate_worse_than_the_served_version_is_kept_out(served_and_spoiled):
    store, registry, tax = served_and_spoiled
    result = Retrainer(store, registry, tax).run("test: worse candidate")
    assert result.status == "kept" and result.serving == "v1" and registry.current() == "v1"
    metrics = result.metrics
    assert metrics["promoted"] is False
    assert metrics["holdout"]["macro"]["spearman"] < metrics["served_on_holdout"]["macro"]["spearman"]
    assert result.version in {v.name for v in registry.list_versions()}  # kept on disk, not served


def test_the_same_candidate_is_promoted_when_the_gate_allows_it(served_and_spoiled):
    store, registry, tax = served_and_spoiled
    result = Retrainer(store, registry, tax, tolerance=2.0).run("test: gate relaxed")
    assert result.status == "promoted" and registry.current() == result.version != "v1"


def test_the_demo_names_the_served_version_and_the_scores_that_kept_a_candidate_out(served_and_spoiled):
    """`sense7 demo`'s final lines (sense7.cli.demo.serving_lines) from the registry after a real gate run:
    which version serves, and the candidate kept out with the two held-out scores that decided it."""
    from sense7.cli.demo import serving_lines

    store, registry, tax = served_and_spoiled
    result = Retrainer(store, registry, tax).run("test: worse candidate")
    candidate = result.metrics["holdout"]["macro"]["spearman"]
    served = result.metrics["served_on_holdout"]["macro"]["spearman"]
    lines = serving_lines(registry.list_versions())
    assert lines == ["[bold]Serving:[/] v1",
                     f"[bold]Kept out:[/] {result.version} by the promotion gate: held-out macro Spearman "
                     f"{candidate:.3f} < {served:.3f} of v1"]
    promoted = Retrainer(store, registry, tax, tolerance=2.0).run("test: gate relaxed")
    lines = serving_lines(registry.list_versions())
    assert lines[0].startswith(f"[bold]Serving:[/] {promoted.version} (promoted: held-out macro Spearman ")
    assert len(lines) == 1  # the earlier candidate is older than the served version: no longer news


def test_the_served_model_options_reach_the_retrained_version_and_are_recorded(served_and_spoiled):
    """SENSE7_MODEL_ALPHA / SENSE7_MODEL_RATER_RIDGE (sense7.model.options.served_params) as the retrain job
    passes them: the new version is fitted with them, serves through the compiled path, and says so."""
    from sense7.model.options import served_params
    from sense7.settings import Settings

    store, registry, tax = served_and_spoiled
    params = served_params(Settings.from_env({"SENSE7_HOME": str(registry.model_dir.parent),
                                              "SENSE7_MODEL_ALPHA": "cv", "SENSE7_MODEL_RATER_RIDGE": "cv_rater"}))
    assert params == {"alpha": "cv", "rater_ridge": "cv_rater", "rater_ridge_from": "text"}
    result = Retrainer(store, registry, tax, tolerance=2.0, personalized_params=params).run("test: options")
    assert result.status == "promoted" and result.metrics["personalized_params"] == params
    model = registry.load(result.version).personalized
    assert (model.alpha, model.rater_ridge, model.rater_ridge_from) == ("cv", "cv_rater", "text")
    assert model.rater_ridges_ is not None and len(set(np.atleast_1d(model.alpha_))) >= 1
    registry.load(result.version).compile()  # the ML backend can serve it
    default = Retrainer(store, registry, tax, tolerance=2.0).run("test: defaults")
    assert default.metrics["personalized_params"] == {} and registry.load(default.version).personalized.rater_ridge is None


def test_a_retrain_with_a_text_encoder_reads_the_store_s_text_vectors(served_and_spoiled, tmp_path):
    """The retrain fits the encoder through the store's text vectors (Retrainer.fit_params): the first run embeds
    each distinct text once and keeps it; the next run (the held-out scoring of the served version included)
    embeds nothing; the version saved holds no cache and serves once a process gives it one."""
    from sense7.model.vector_cache import CachedTextEncoder
    from sense7.store.text_vectors import TextVectorRows
    from tests.support.tiny_bert import CountingEncoder, counting_encoders

    store, registry, tax = served_and_spoiled
    params = {"text_encoder": counting_encoders(tmp_path / "encoder")(), "relational_weight": 1.0}
    first = Retrainer(store, registry, tax, tolerance=2.0, personalized_params=params).run("test: encoder")
    assert first.status == "promoted"
    embedded = list(CountingEncoder.embedded)
    assert embedded and len(embedded) == len(set(embedded)) == TextVectorRows(store.engine).count()
    saved = registry.load(first.version).personalized.features_.vectorizers_["encoder"]
    assert isinstance(saved, CachedTextEncoder) and saved.cache is None
    CountingEncoder.embedded.clear()
    second = Retrainer(store, registry, tax, tolerance=2.0, personalized_params=params).run("test: encoder again")
    assert second.metrics["served_on_holdout"]["version"] == first.version
    assert CountingEncoder.embedded == []
