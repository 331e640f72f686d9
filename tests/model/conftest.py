"""Synthetic data shared by the model tests (generated once per session: it is deterministic)."""

from __future__ import annotations

import pytest

from sense7.data.items import build_items
from sense7.synthetic.synth import generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


@pytest.fixture(scope="session")
def synth_300():
    """The planted-structure study of the quality test: 300 conversations, 40 raters."""
    return generate(300, 40, seed=7, taxonomy=TAXONOMY)


@pytest.fixture(scope="session")
def items_300(synth_300):
    return build_items(synth_300.rating_data(), TAXONOMY)


@pytest.fixture(scope="session")
def small_synth():
    return generate(60, 12, seed=3, taxonomy=TAXONOMY)


@pytest.fixture(scope="session")
def small_items(small_synth):
    return build_items(small_synth.rating_data(), TAXONOMY)
