"""The rater models' options as people write them, parsed in one place: `sense7 evaluate --text-alpha` and
`--rater-ridge`, and the served model's SENSE7_MODEL_ALPHA and SENSE7_MODEL_RATER_RIDGE (`served_params`,
what the retrain job fits). Each parser returns the estimator's value or raises ValueError saying what
was expected."""

from __future__ import annotations

import math

from sense7.model.rater_ridge import RATER_RIDGE_CHOICES


def _penalty(raw: str, choices: tuple[str, ...]) -> float | str:
    text = str(raw).strip()
    if text in choices:
        return text
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected {', '.join(choices)} or a penalty, got {raw!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"a penalty must be a finite number above 0, got {raw!r}")
    return value


def text_alpha(raw: str) -> float | str:
    """The text ridge's penalty (both rater models' `alpha`): a number above 0, or "cv" (inner CV)."""
    return _penalty(raw, ("cv",))


def rater_ridge(raw: str) -> float | str:
    """Each known rater's own content weights (PersonalizedRater.rater_ridge): a penalty above 0, or one of
    RATER_RIDGE_CHOICES (the penalty by inner CV)."""
    return _penalty(raw, RATER_RIDGE_CHOICES)


def served_params(settings) -> dict:
    """The PersonalizedRater parameters the retrain job fits beyond the defaults, from the settings'
    SENSE7_MODEL_ALPHA and SENSE7_MODEL_RATER_RIDGE ({} when neither is set). A rater's own weights
    are on every text feature (n-grams and the static encoder's columns). ValueError names the variable."""
    params: dict = {}
    for variable, raw, name, parse in (("SENSE7_MODEL_ALPHA", settings.model_alpha, "alpha", text_alpha),
                                       ("SENSE7_MODEL_RATER_RIDGE", settings.model_rater_ridge, "rater_ridge",
                                        rater_ridge)):
        if raw in (None, ""):
            continue
        try:
            params[name] = parse(raw)
        except ValueError as exc:
            raise ValueError(f"{variable}: {exc}") from None
    if "rater_ridge" in params:
        params["rater_ridge_from"] = "text"
    encoder = getattr(settings, "model_text_encoder", None)
    if encoder not in (None, ""):
        from sense7.model.features import TEXT_ENCODER_NAMES
        if encoder not in TEXT_ENCODER_NAMES:
            raise ValueError(f"SENSE7_MODEL_TEXT_ENCODER: expected one of {', '.join(TEXT_ENCODER_NAMES)}, "
                             f"got {encoder!r}")
        params["text_encoder"] = None if encoder == "ngrams" else encoder
    return params
