"""sense7: per-turn empathy ratings in Label Studio and personalized rater models."""

__version__ = "0.1.0"
