"""Small data sets with planted structure, generated in the tests (no file from outside the repo)."""

import pytest
from tests.support.research import planted_items


@pytest.fixture
def items():
    return planted_items()
