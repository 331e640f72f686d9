"""The study's pre-fill rule (SENSE7_PREFILL_RULE): the backend pre-fills and records the median or the
mode of each predicted distribution, and a bad setting is refused when settings are read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from sense7.ml_backend.hot_model import HotModel
from sense7.ml_backend.model import Sense7Model
from sense7.ml_backend.rater_info import RaterInfoCache

from sense7.model.serving import Predictions
from sense7.settings import DEFAULT_PREFILL_RULE, Settings, StudyDesign
from tests.support.backend import TAXONOMY, task
from tests.support.fake_bundle import CONTROLS, FakeBundle

# Mode the 1st level, median the 2nd (cumulative 0.3, 0.55): the two rules disagree on every control.
SKEWED = np.array([0.3, 0.25, 0.25, 0.0, 0.2])


@dataclass
class SkewedBundle(FakeBundle):
    def compile(self):
        return SkewedPredictor(list(self.controls))


class SkewedPredictor:
    def __init__(self, controls):
        self.controls = controls

    def rater_table(self, traits):
        return set()

    def predict(self, columns, table):
        n = len(columns["rater_id"])
        return Predictions(["generic"] * n, np.tile(SKEWED, (n, len(self.controls), 1)), np.arange(1, 6))

    predict_generic = lambda self, columns: self.predict(columns, set())  # noqa: E731


@pytest.mark.parametrize("rule, level", [("median", 2), ("mode", 1)])
def test_the_backend_prefills_and_records_the_rule_level(registry, store, label_config, rule, level):
    registry.add(SkewedBundle("v1"))
    registry.promote("v1")
    hot = HotModel(registry, check_interval=0.0)
    hot.refresh()
    model = Sense7Model(hot, RaterInfoCache(store, TAXONOMY, refresh_seconds=0.0), TAXONOMY, prefill_rule=rule)
    answers, records = model.predict_and_record([task(1, prefill="shown")], label_config)
    ratings = {r["from_name"]: r["value"]["rating"] for r in answers[0]["result"]}
    assert ratings == {c: level for c in CONTROLS}
    assert records[0]["levels"] == {c: level for c in CONTROLS}
    assert records[0]["generic_levels"] == {c: level for c in CONTROLS}


def test_the_setting_is_read_and_checked(tmp_path):
    assert StudyDesign.from_env({}).prefill_rule == DEFAULT_PREFILL_RULE
    assert StudyDesign.from_env({"SENSE7_PREFILL_RULE": " Mode "}).prefill_rule == "mode"
    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_PREFILL_RULE": "median"})
    assert settings.study.prefill_rule == "median"
    with pytest.raises(ValueError, match="SENSE7_PREFILL_RULE"):
        StudyDesign.from_env({"SENSE7_PREFILL_RULE": "mean"})
