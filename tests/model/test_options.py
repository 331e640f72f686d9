"""The rater models' options as people write them (sense7.model.options): one parser per option, shared by
`sense7 evaluate` and the served model's settings, so both accept and refuse the same values."""

from __future__ import annotations

import pytest

from sense7.model.options import rater_ridge, served_params, text_alpha
from sense7.settings import Settings


def test_penalties_and_choices_parse_and_nonsense_is_refused():
    assert text_alpha("cv") == "cv" and text_alpha(" 3 ") == 3.0
    assert rater_ridge("cv_rater_1se") == "cv_rater_1se" and rater_ridge("0.5") == 0.5
    for bad in ("lots", "0", "-1", "inf", "nan", ""):
        with pytest.raises(ValueError):
            text_alpha(bad)
        with pytest.raises(ValueError):
            rater_ridge(bad)
    with pytest.raises(ValueError, match="expected cv or a penalty"):
        text_alpha("cv_rater")  # a rater-ridge choice is no text penalty


def test_served_params_are_empty_by_default_and_name_the_variable_when_wrong(tmp_path):
    def params(**env):
        return served_params(Settings.from_env({"SENSE7_HOME": str(tmp_path), **env}))

    assert params() == {}
    assert params(SENSE7_MODEL_ALPHA="30") == {"alpha": 30.0}
    assert params(SENSE7_MODEL_RATER_RIDGE="10") == {"rater_ridge": 10.0, "rater_ridge_from": "text"}
    with pytest.raises(ValueError, match="^SENSE7_MODEL_RATER_RIDGE: expected cv, cv_rater, cv_rater_1se or a "):
        params(SENSE7_MODEL_RATER_RIDGE="often")


def test_the_served_text_encoder_and_the_request_budget_name_the_variable_when_wrong(tmp_path):
    from sense7.settings import SettingsError

    def settings(**env):
        return Settings.from_env({"SENSE7_HOME": str(tmp_path), **env})

    assert served_params(settings(SENSE7_MODEL_TEXT_ENCODER="static")) == {"text_encoder": "static"}
    assert served_params(settings(SENSE7_MODEL_TEXT_ENCODER="ngrams")) == {"text_encoder": None}
    with pytest.raises(ValueError, match="^SENSE7_MODEL_TEXT_ENCODER: expected one of static, ngrams, minilm, got 'bert'"):
        served_params(settings(SENSE7_MODEL_TEXT_ENCODER="bert"))
    assert settings().text_vector_budget == 0.5 and settings(SENSE7_TEXT_VECTOR_BUDGET="0").text_vector_budget == 0.0
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(SettingsError, match="SENSE7_TEXT_VECTOR_BUDGET"):
            settings(SENSE7_TEXT_VECTOR_BUDGET=bad)
