"""The rater page: private links through which raters rate their own conversations (see app.py)."""
