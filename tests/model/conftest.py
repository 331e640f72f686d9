"""Synthetic data shared by the model tests (generated once per session: it is deterministic)."""

from __future__ import annotations

import pytest

from sense7.data.items import build_items
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def synthetic_study_fixtures(study: str, items: str, n_conversations: int, n_raters: int, seed: int):
    """Two session fixtures, named `study` and `items`: a synthetic study and its items (X, Y)."""

    @pytest.fixture(scope="session", name=study)
    def made_study():
        return generate(n_conversations, n_raters, seed=seed, taxonomy=TAXONOMY)

    @pytest.fixture(scope="session", name=items)
    def made_items(request):
        return build_items(request.getfixturevalue(study).rating_data(), TAXONOMY)

    return made_study, made_items


# The planted-structure study of the quality test: 300 conversations, 40 raters.
synth_300, items_300 = synthetic_study_fixtures("synth_300", "items_300", 300, 40, seed=7)
small_synth, small_items = synthetic_study_fixtures("small_synth", "small_items", 60, 12, seed=3)
