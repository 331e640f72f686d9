"""Rater models: generic (text only) and personalized (text + the rater's traits and past ratings)."""

from sense7.model.estimators import ControlPrediction, GenericRater, PersonalizedRater

__all__ = ["ControlPrediction", "GenericRater", "PersonalizedRater"]
