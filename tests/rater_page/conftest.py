"""The rater page on the real stack: the session's Label Studio, this test's Redis, a Celery worker
(delivery and sync), the ML backend receiving webhooks, and the rater page under gunicorn."""

from __future__ import annotations


import pytest

from tests.support.rater_page import RaterPageStack, build


@pytest.fixture
def page_stack(request) -> RaterPageStack:
    return build(request.getfixturevalue("job_stack"))


